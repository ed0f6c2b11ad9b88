"""Runtime facts the overrides need: which devices and archs may run FlyDSL, and why not.

Nothing here runs at import. Arch resolution touches the GPU (it reads the
device properties), so it happens lazily: once per device index, on the
first call that reaches the arch check, or in ``status()``.
"""

from __future__ import annotations

import importlib.util
import os

import torch

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
    env = os.environ.get("FLYDSL_TORCH_ARCHS", "")
    names = [a.strip().split(":", 1)[0] for a in env.split(",") if a.strip()]
    return frozenset(names or DEFAULT_ARCHS)


def cpu_target() -> str:
    """The FlyDSL target CPU-backend kernels run on: ``$FLYDSL_TORCH_CPU_TARGET`` or reference."""
    t = os.environ.get("FLYDSL_TORCH_CPU_TARGET", "cpu-reference").strip() or "cpu-reference"
    if t not in CPU_TARGETS:
        raise ValueError(f"FLYDSL_TORCH_CPU_TARGET={t!r}: expected one of {', '.join(CPU_TARGETS)}")
    return t


def normalize_device(device) -> str:
    """``"cuda"`` or ``"cpu"`` from a device-ish (``None``: ``$FLYDSL_TORCH_DEVICE`` or cuda)."""
    if device is None:
        device = os.environ.get("FLYDSL_TORCH_DEVICE", "").strip() or "cuda"
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
    """The arch of GPU ``index`` (None: the current one): ``$FLYDSL_GPU_ARCH``, else torch's.

    ROCm: ``gcnArchName`` without feature suffixes (``gfx950``); CUDA:
    ``sm{major}{minor}``. None when there is no such GPU. Cached per index.
    """
    env = os.environ.get("FLYDSL_GPU_ARCH", "").strip()
    if env:
        return env.split(":", 1)[0]
    if index is None:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
    if index in _ARCH_CACHE:
        return _ARCH_CACHE[index]
    arch = None
    try:
        if torch.cuda.is_available() and index < torch.cuda.device_count():
            if torch.version.hip:
                arch = str(torch.cuda.get_device_properties(index).gcnArchName).split(":", 1)[0]
            else:
                major, minor = torch.cuda.get_device_capability(index)
                arch = f"sm{major}{minor}"
    except (RuntimeError, AssertionError, AttributeError):
        arch = None
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
