"""The Triton backend: FlyIR -> readable Triton source -> triton.compile (or Triton's interpreter).

``codegen`` writes the ``@triton.jit`` source (the emitter in ``emitter``,
one rule per op in ``rules/``, the ``cpu-interpret`` legalization and
overrides in ``interpret``), ``compiler`` compiles it for a GPU target (on any
machine: cross-compiling needs no GPU) and keeps every stage, ``report``
reads the resources from the AMDGCN (``amdgcn``) or PTX (``ptx``) stage,
``launcher`` runs it: on the GPU through the compiled kernel's own launcher,
or on the CPU through Triton's interpreter (target ``cpu-interpret``).
Importing this package imports Triton.
"""

import os

# Keep Triton 3.9's current default (FP fusion on) and silence its warning about it.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

from ...exc import TritonLaunchError
from .codegen import LOWERINGS, GeneratedKernel, KernelParam, generate, lower
from .compiler import TritonBackend, TritonExecutable, write_source
from .launcher import InterpretedExecutable

__all__ = [
    "LOWERINGS",
    "GeneratedKernel",
    "InterpretedExecutable",
    "KernelParam",
    "TritonBackend",
    "TritonExecutable",
    "TritonLaunchError",
    "generate",
    "lower",
    "write_source",
]
