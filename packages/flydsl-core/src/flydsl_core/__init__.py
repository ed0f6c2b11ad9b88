"""FlyDSL: tile-level GPU kernels in Python.

Kernels are Python functions decorated with ``@kernel``. Calling one traces
it into FlyIR, runs the pass pipeline and executes it on a backend: the CPU
reference backend, or GPU code generated through Triton. The layout
algebra (``flydsl_core.layout``) is CuTe's.

    import flydsl_core as fly

This module is the flat public API; importing it loads neither torch nor
Triton. Besides the language it holds what another framework needs to take FlyDSL's
launches over (``launch_sink``, ``split_launch_options``, ``LAUNCH_OPTIONS``,
``generated_launch``: see ``runtime/sink.py``).
"""

from . import dtypes
from ._version import __version__ as __version__
from .dtypes import (
    DType,
    bf16,
    bool_,
    fp8e4m3,
    fp8e5m2,
    fp16,
    fp32,
    fp64,
    int8,
    int16,
    int32,
    int64,
    uint8,
)
from .exc import FlyDSLError
from .helpers import cdiv
from .language import *  # noqa: F403 - the language is the public surface
from .language import __all__ as _lang_all
from .runtime.kernel import CompiledKernel, Kernel, Tensor, constexpr, kernel
from .runtime.sink import (
    LAUNCH_OPTIONS,
    GeneratedLaunch,
    generated_launch,
    launch_sink,
    split_launch_options,
)
from .runtime.spec import TensorSpec


def __getattr__(name):
    # The layout algebra is re-exported lazily to keep `import flydsl_core` light.
    if name in ("Layout", "Swizzle", "ComposedLayout", "layout"):
        import importlib

        # not `from . import layout`: that looks the name up here first and recurses
        _layout = importlib.import_module(f"{__name__}.layout")
        return _layout if name == "layout" else getattr(_layout, name)
    raise AttributeError(f"module 'flydsl_core' has no attribute {name!r}")


__all__ = [
    *_lang_all,
    "LAUNCH_OPTIONS",
    "CompiledKernel",
    "DType",
    "FlyDSLError",
    "GeneratedLaunch",
    "Kernel",
    "Tensor",
    "TensorSpec",
    "bf16",
    "bool_",
    "cdiv",
    "constexpr",
    "dtypes",
    "fp8e4m3",
    "fp8e5m2",
    "fp16",
    "fp32",
    "fp64",
    "generated_launch",
    "int8",
    "int16",
    "int32",
    "int64",
    "kernel",
    "launch_sink",
    "split_launch_options",
    "uint8",
]
