"""Compilation targets: what hardware a kernel is compiled for, and its limits.

``get_target('gfx950')`` (or an alias such as ``'mi355x'``, ``'h200'``) gives
a frozen ``Target``; ``resolve_target()`` picks the target of this process:

1. the explicit argument,
2. ``$FLYDSL_TARGET``,
3. the current GPU as torch reports it (ROCm ``gcnArchName``, CUDA compute
   capability),
4. ``cpu-reference`` when there is no GPU.

A GPU whose arch is not in the table is an error, never a silent fallback to
another arch. Importing this package imports neither torch nor triton.
"""

from __future__ import annotations

from ..exc import UnknownTargetError
from ..settings import env_str
from .registry import (
    PeakRates,
    RegisterBudget,
    Target,
    all_targets,
    get_target,
    known_targets,
    lookup_target,
    target_for_triton,
)

__all__ = [
    "PeakRates",
    "RegisterBudget",
    "Target",
    "all_targets",
    "detected_arch_to_target_name",
    "get_target",
    "known_targets",
    "lookup_target",
    "resolve_target",
    "target_for_triton",
]

ENV_VAR = "FLYDSL_TARGET"


def _detect_device_arch() -> str | None:
    """The arch of the current GPU as torch reports it, or None without a GPU.

    ROCm: ``gcnArchName`` with feature suffixes stripped (``'gfx942'`` from
    ``'gfx942:sramecc+:xnack-'``). CUDA: ``'sm{major}{minor}'`` from the compute
    capability (``(9, 0)`` -> ``'sm90'``). Tests monkeypatch this function.
    """
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        dev = torch.cuda.current_device()
        if getattr(torch.version, "hip", None):
            arch = torch.cuda.get_device_properties(dev).gcnArchName
            return arch.split(":", 1)[0].strip()
        major, minor = torch.cuda.get_device_capability(dev)
        return f"sm{major}{minor}"
    except (RuntimeError, AssertionError, AttributeError):
        # A broken driver or a CPU-only torch build: no usable GPU.
        return None


def detected_arch_to_target_name(arch: str) -> str | None:
    """The canonical target name for an arch string from ``_detect_device_arch``."""
    t = lookup_target(arch)
    return t.name if t is not None and t.is_gpu else None


def resolve_target(explicit: str | Target | None = None) -> Target:
    """The target to compile for: explicit, then ``$FLYDSL_TARGET``, then the device, then CPU."""
    if explicit is not None:
        return get_target(explicit)

    env = env_str(ENV_VAR)
    if env is not None:
        try:
            return get_target(env)
        except UnknownTargetError as e:
            raise UnknownTargetError(f"{ENV_VAR}={env!r}: {e.msg}") from None

    arch = _detect_device_arch()
    if arch is not None:
        name = detected_arch_to_target_name(arch)
        if name is None:
            # Never fall back to another GPU arch. Upstream FlyDSL defaulted to
            # gfx942 when it did not recognise the device; on MI350 (gfx950)
            # the gfx942 code object does not load and users saw "invalid
            # resource handle" at launch instead of an error that names the
            # problem. A wrong arch is worse than no arch: fail here, loudly.
            gpu = ", ".join(t.name for t in all_targets() if t.is_gpu)
            raise UnknownTargetError(
                f"the current GPU reports arch {arch!r}, which FlyDSL has no target for; "
                f"known targets: {', '.join(known_targets())} (GPU targets: {gpu}). "
                f"Set {ENV_VAR}=cpu-reference or pass a target explicitly to run without it."
            )
        return get_target(name)

    return get_target("cpu-reference")
