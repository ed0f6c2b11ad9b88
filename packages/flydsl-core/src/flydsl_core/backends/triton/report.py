"""The resource report of a ``triton.compile`` result: ``report_from_triton``.

Picks the listing parser of the kernel's ISA (``amdgcn.parse_amdgcn``,
``ptx.parse_ptx``) and hands it what Triton's metadata knows (warps, the
dynamic shared memory, the kernel name).
"""

from __future__ import annotations

from typing import Any

from ...compile.resources import ResourceReport
from ...targets import Target, get_target, target_for_triton
from .amdgcn import parse_amdgcn
from .ptx import parse_ptx

__all__ = ["report_from_triton"]


def report_from_triton(compiled_kernel: Any, target: str | Target | None = None) -> ResourceReport:
    """Report a ``triton.compile`` result (a ``CompiledKernel``).

    ``target`` defaults to the one the kernel was compiled for
    (``metadata.target``); a target that disagrees with it is an error.
    """
    md = compiled_kernel.metadata
    gt = getattr(md, "target", None)
    backend = getattr(gt, "backend", None)
    arch = getattr(gt, "arch", None)
    inferred = target_for_triton(backend, arch) if backend is not None else None
    if target is None:
        if inferred is None:
            raise ValueError(f"the kernel's target {gt!r} is not a known FlyDSL target")
        t = inferred
    else:
        t = get_target(target)
        if inferred is not None and inferred != t:
            raise ValueError(f"the kernel was compiled for {inferred.name}, not {t.name}")
    asm = compiled_kernel.asm
    num_warps = getattr(md, "num_warps", None)
    shared = getattr(md, "shared", None)
    name = getattr(md, "name", None)
    if t.backend == "hip":
        return parse_amdgcn(
            asm["amdgcn"], t, num_warps=num_warps, shared_bytes=shared, kernel_name=name
        )
    if t.backend == "cuda":
        return parse_ptx(
            asm["ptx"],
            t,
            asm.get("cubin"),
            num_warps=num_warps,
            shared_bytes=shared,
            kernel_name=name,
        )
    raise ValueError(f"{t.name} is a CPU target; there is no assembly to report on")
