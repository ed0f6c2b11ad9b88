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

from .. import settings
from ..exc import UnknownTargetError
from .registry import (
    SHIPPED,
    PeakRates,
    RegisterBudget,
    Target,
    all_targets,
    get_target,
    is_cpu_target,
    known_targets,
    lookup_target,
    register_target,
    target_for_triton,
    unregister_target,
)

__all__ = [
    "SHIPPED",
    "PeakRates",
    "RegisterBudget",
    "Target",
    "all_targets",
    "detected_arch_to_target_name",
    "device_arch",
    "device_target",
    "get_target",
    "is_cpu_target",
    "known_targets",
    "lookup_target",
    "register_target",
    "resolve_target",
    "target_for_triton",
    "unregister_target",
]

ENV_VAR = "FLYDSL_TARGET"


def _detect_device_arch(index: int | None = None) -> str | None:
    """The arch of GPU ``index`` (the current one when None) as torch reports it, or None
    without a GPU.

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
        dev = torch.cuda.current_device() if index is None else index
        if getattr(torch.version, "hip", None):
            arch = torch.cuda.get_device_properties(dev).gcnArchName
            return str(arch).split(":", 1)[0].strip()
        major, minor = torch.cuda.get_device_capability(dev)
        return f"sm{major}{minor}"
    except (RuntimeError, AssertionError, AttributeError, ValueError):
        # A broken driver, a CPU-only torch build or no such device: no usable GPU.
        return None


def device_arch(index: int | None = None) -> str | None:
    """The arch of GPU ``index`` (the current one when None), or None where there is no GPU.

    The one arch probe of every package (flydsl-core's target resolution and
    launcher, flydsl-kernels' tensor targets, torch-flydsl's arch gate): torch's
    report (``gcnArchName`` without feature suffixes, or ``sm{major}{minor}``),
    unless ``$FLYDSL_GPU_ARCH`` names the arch to assume instead. Uncached: it
    reads the device properties, so callers on a hot path keep the answer.
    """
    arch = _detect_device_arch(index)
    if arch is None:
        return None
    override = settings.get("FLYDSL_GPU_ARCH")
    return override.split(":", 1)[0].strip() if override else arch


def detected_arch_to_target_name(arch: str) -> str | None:
    """The canonical target name for a device arch (``device_arch``), or None."""
    t = lookup_target(arch)
    return t.name if t is not None and t.is_gpu else None


def device_target(index: int | None = None) -> Target | None:
    """The target of GPU ``index`` (the current one when None); None without a GPU.

    A GPU whose arch has no target is an ``UnknownTargetError``, never another arch.
    """
    arch = device_arch(index)
    if arch is None:
        return None
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


def resolve_target(explicit: str | Target | None = None, *, device: int | None = None) -> Target:
    """The target to compile for: ``explicit``, then ``$FLYDSL_TARGET``, then GPU ``device``
    (the current one when None), then ``cpu-reference``. Names and aliases are accepted
    alike everywhere (``mi355x``, ``GFX950``, ``interpret``)."""
    if explicit is not None:
        return get_target(explicit)

    env = settings.get(ENV_VAR)
    if env is not None:
        try:
            return get_target(env)
        except UnknownTargetError as e:
            raise UnknownTargetError(f"{ENV_VAR}={env!r}: {e.msg}") from None

    return device_target(device) or get_target("cpu-reference")
