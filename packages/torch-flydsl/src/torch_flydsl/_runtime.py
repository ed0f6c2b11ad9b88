"""Runtime facts the overrides need: the devices and dispatch keys they register for, the
arch of a GPU, and why a device cannot run FlyDSL at all.

Nothing here runs at import. Arch resolution touches the GPU (it reads the
device properties), so it happens lazily: once per device index, on the
first call that reaches the arch check, or in ``status()``. Whether one call
may run on FlyDSL, and for which target, is ``eligibility``'s.
"""

from __future__ import annotations

import importlib.util

import torch

from flydsl_core import settings

#: devices ``enable(device=...)`` accepts
DEVICES = ("cuda", "cpu")


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
    from . import eligibility

    arch = resolve_arch(index)
    if arch is None:
        return "the GPU's arch could not be determined"
    tgt = eligibility.gpu_target(index)
    if tgt is None:
        return f"FlyDSL has no target for the GPU's arch {arch}"
    allowed = eligibility.allowed_archs()
    if tgt not in allowed:
        return f"target {tgt} is not in the allowed list {sorted(allowed)} (FLYDSL_TORCH_ARCHS)"
    return None


def clear_caches() -> None:
    """Forget resolved archs and targets (tests; a changed ``$FLYDSL_GPU_ARCH``)."""
    from . import eligibility

    _ARCH_CACHE.clear()
    eligibility.clear_caches()
