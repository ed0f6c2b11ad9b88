"""Runtime facts the overrides need: which devices and archs may run FlyDSL, and why not.

Nothing here runs at import. Arch resolution touches the GPU (it reads the
device properties), so it happens lazily: once per device index, on the
first call that reaches the arch check, or in ``status()``.
"""

from __future__ import annotations

import importlib.util

import torch

from flydsl_core import settings

#: archs the CUDA/ROCm backend dispatches to by default (``$FLYDSL_TORCH_ARCHS`` overrides)
DEFAULT_ARCHS = ("gfx950",)
#: the arch name of the CPU test backend (its gate table entries use it)
CPU_ARCH = "cpu"
#: CPU targets the CPU test backend may run kernels on (``$FLYDSL_TORCH_CPU_TARGET``)
CPU_TARGETS = ("cpu-reference", "cpu-interpret")
#: devices ``enable(device=...)`` accepts
DEVICES = ("cuda", "cpu")


def allowed_archs() -> frozenset[str]:
    """``$FLYDSL_TORCH_ARCHS`` (comma separated, e.g. ``gfx950,sm90``), else ``DEFAULT_ARCHS``."""
    names = settings.get("FLYDSL_TORCH_ARCHS") or DEFAULT_ARCHS
    return frozenset(a.split(":", 1)[0] for a in names)


def cpu_target() -> str:
    """The FlyDSL target CPU-backend kernels run on: ``$FLYDSL_TORCH_CPU_TARGET`` (a name or
    alias of a CPU target), else the reference backend."""
    from flydsl_core.exc import SettingsError
    from flydsl_core.targets import lookup_target

    raw = settings.get("FLYDSL_TORCH_CPU_TARGET")
    t = lookup_target(raw)
    if t is None or t.name not in CPU_TARGETS:
        raise SettingsError(
            f"FLYDSL_TORCH_CPU_TARGET={raw!r} is not valid; it takes one of "
            f"{', '.join(CPU_TARGETS)} (or an alias of one)"
        )
    return t.name


def normalize_device(device) -> str:
    """``"cuda"`` or ``"cpu"`` from a device-ish (``None``: ``$FLYDSL_TORCH_DEVICE`` or cuda)."""
    if device is None:
        device = settings.get("FLYDSL_TORCH_DEVICE")
    name = torch.device(device).type if not isinstance(device, str) else device.split(":")[0]
    name = {"rocm": "cuda", "hip": "cuda", "gpu": "cuda"}.get(name, name)
    if name not in DEVICES:
        raise ValueError(f"torch_flydsl runs on {' or '.join(DEVICES)} devices, not {device!r}")
    return name


def dispatch_key(device: str) -> str:
    """The dispatch key the overrides register for: ``CUDA`` (ROCm uses it too) or ``CPU``."""
    return "CPU" if device == "cpu" else "CUDA"


def kernels_missing() -> str | None:
    """Why flydsl_kernels cannot be imported (without importing it), or None."""
    for mod in ("flydsl_core", "flydsl_kernels"):
        if importlib.util.find_spec(mod) is None:
            return f"the {mod} package is not installed"
    return None


def backend_unusable(device: str) -> str | None:
    """Why the overrides cannot register for ``device`` at all, or None. Touches no GPU."""
    missing = kernels_missing()
    if missing:
        return missing
    if device == "cpu":
        return None
    if not torch.backends.cuda.is_built():
        return "torch is built without CUDA/ROCm"
    return None


_ARCH_CACHE: dict[int, str | None] = {}


def resolve_arch(index: int | None) -> str | None:
    """The arch of GPU ``index`` (None: the current one), from flydsl-core's one arch probe
    (``flydsl_core.targets.device_arch``: torch's report, or ``$FLYDSL_GPU_ARCH``).

    None when there is no such GPU. Cached per index: the predicate asks on every call.
    """
    if index is None:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
    if index in _ARCH_CACHE:
        return _ARCH_CACHE[index]
    from flydsl_core.targets import device_arch

    arch = device_arch(index) if index < torch.cuda.device_count() else None
    _ARCH_CACHE[index] = arch
    return arch


def device_unusable(device: str, index: int | None = None) -> str | None:
    """Why FlyDSL cannot run on ``device`` (GPU ``index``) now, or None. May touch the GPU."""
    why = backend_unusable(device)
    if why or device == "cpu":
        return why
    if not torch.cuda.is_available():
        return "no GPU: torch.cuda.is_available() is False"
    arch = resolve_arch(index)
    if arch is None:
        return "the GPU's arch could not be determined"
    allowed = allowed_archs()
    if arch not in allowed:
        return f"arch {arch} is not in the allowed list {sorted(allowed)} (FLYDSL_TORCH_ARCHS)"
    return None


def clear_caches() -> None:
    """Forget resolved archs (tests; a changed ``$FLYDSL_GPU_ARCH``)."""
    _ARCH_CACHE.clear()
