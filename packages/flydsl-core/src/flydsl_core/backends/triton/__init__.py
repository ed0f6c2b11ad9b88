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

from .codegen import LOWERINGS, GeneratedKernel, KernelParam, generate, lower
from .compiler import (
    CpuInterpretBackend,
    Gfx942Backend,
    Gfx950Backend,
    Gfx1250Backend,
    Sm90Backend,
    TritonBackend,
    TritonExecutable,
    write_source,
)
from .launcher import InterpretedExecutable, TritonLaunchError

__all__ = [
    "LOWERINGS",
    "CpuInterpretBackend",
    "GeneratedKernel",
    "Gfx942Backend",
    "Gfx950Backend",
    "Gfx1250Backend",
    "InterpretedExecutable",
    "KernelParam",
    "Sm90Backend",
    "TritonBackend",
    "TritonExecutable",
    "TritonLaunchError",
    "generate",
    "lower",
    "write_source",
]
