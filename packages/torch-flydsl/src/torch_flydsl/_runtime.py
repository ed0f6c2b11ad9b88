"""Registration facts: the devices and dispatch keys the overrides register for, and why
they cannot register for a device at all (no kernels installed, torch built without a GPU).

Nothing here touches a GPU. Everything that does (the GPU's arch, its FlyDSL target, whether
FlyDSL may run there now, and whether one call may) is ``eligibility``'s, which builds on this
module.
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


def cannot_register(device: str) -> str | None:
    """Why the overrides cannot register for ``device`` at all, or None. Touches no GPU."""
    missing = kernels_missing()
    if missing:
        return missing
    if device == "cpu":
        return None
    if not torch.backends.cuda.is_built():
        return "torch is built without CUDA/ROCm"
    return None
