"""May this call run on FlyDSL, and for which target: the one rule every torch_flydsl path asks.

The eager overrides (``dispatch.EagerContext``), the torch.compile pass
(``inductor.CompileContext``), ``flex_attention`` and the transformers routes all decide here:

* ``plain(t)``: FlyDSL runs on plain tensors (``torch.Tensor``, ``nn.Parameter``) only;
  subclasses (FakeTensor, DTensor, ...) go to torch (reason ``subclass``);
* ``target(t)``: the FlyDSL target a launch on ``t`` compiles for, the one
  ``$FLYDSL_TARGET`` rule of every package:

  - a CPU tensor: ``$FLYDSL_TORCH_CPU_TARGET``, else ``$FLYDSL_TARGET`` where it names a
    CPU target, else ``cpu-reference`` (the CPU test backend);
  - a GPU tensor: ``$FLYDSL_TARGET`` where it names a GPU target, else the target of the
    tensor's own GPU (``flydsl_core.targets.device_arch``, which ``$FLYDSL_GPU_ARCH``
    overrides);

* ``arch(t)``: the gate-table arch of ``t``'s device: ``"cpu"`` on the CPU, the GPU target's
  name where it is in ``allowed_archs()`` (``$FLYDSL_TORCH_ARCHS``, default gfx950), else
  ``""``: FlyDSL does not run there (reason ``arch``);
* ``device_reason(t)``: ``subclass``, ``arch`` or None;
* ``device_unusable(device)``: why FlyDSL cannot run on a device at all now (``status()``).

A CPU tensor is eligible wherever a torch_flydsl entry point sees one: the functions and
routes (``flex_attention``, ``transformers.patch``, the ``"flydsl"`` attention and experts
implementations) are explicit calls, and the global hooks see CPU tensors only where they
were registered for the CPU (``enable(device="cpu")`` registers at the CPU dispatch key;
the compile pass rewrites CPU nodes only with ``options={"device": "cpu"}``).

GPU answers are cached per device index (the arch probe, ``resolve_arch``, reads device
properties); ``clear_caches()`` forgets them (tests, a changed environment). Where the
overrides register (devices, dispatch keys) is ``_runtime``'s, which touches no GPU.
"""

from __future__ import annotations

import torch

from flydsl_core import settings

from . import _runtime

#: the tensor types FlyDSL runs on: anything else goes to torch
PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
#: the gate-table arch of the CPU test backend
CPU_ARCH = "cpu"
#: GPU archs the overrides dispatch to by default (``$FLYDSL_TORCH_ARCHS`` replaces them)
DEFAULT_ARCHS = ("gfx950",)
#: the CPU targets the CPU test backend may run kernels on
CPU_TARGETS = ("cpu-reference", "cpu-interpret")
_DEFAULT_CPU_TARGET = "cpu-reference"


def plain(t) -> bool:
    """Whether FlyDSL may look at ``t`` (a plain tensor, not a subclass)."""
    return type(t) in PLAIN


def _gpu_name(raw: str, var: str) -> str:
    """The canonical name of a GPU target named by ``raw`` (read from ``var``)."""
    from flydsl_core.exc import SettingsError
    from flydsl_core.targets import all_targets, lookup_target

    t = lookup_target(raw.split(":", 1)[0].strip())
    if t is None or not t.is_gpu:
        gpus = ", ".join(x.name for x in all_targets() if x.is_gpu)
        what = "a CPU target" if t is not None else "not a known target"
        raise SettingsError(
            f"{var}={raw!r}: {raw!r} is {what}; it takes GPU targets or their aliases "
            f"({gpus}; see `flydsl targets`)"
        )
    return t.name


def allowed_archs() -> frozenset[str]:
    """The GPU targets FlyDSL may run on: ``$FLYDSL_TORCH_ARCHS`` (comma-separated names or
    aliases, e.g. ``gfx950,h200``), else ``DEFAULT_ARCHS``. A name that is not a GPU target
    is a ``SettingsError`` naming the variable."""
    names = settings.get("FLYDSL_TORCH_ARCHS")
    if not names:
        return frozenset(DEFAULT_ARCHS)
    return frozenset(_gpu_name(n, "FLYDSL_TORCH_ARCHS") for n in names)


def cpu_target() -> str:
    """The target CPU tensors run on: ``$FLYDSL_TORCH_CPU_TARGET``, else ``$FLYDSL_TARGET``
    where it names a CPU target, else ``cpu-reference``."""
    from flydsl_core.exc import SettingsError
    from flydsl_core.targets import lookup_target

    raw = settings.get("FLYDSL_TORCH_CPU_TARGET")
    if raw is not None:
        t = lookup_target(raw)
        if t is None or t.name not in CPU_TARGETS:
            raise SettingsError(
                f"FLYDSL_TORCH_CPU_TARGET={raw!r} is not valid; it takes one of "
                f"{', '.join(CPU_TARGETS)} (or an alias of one)"
            )
        return t.name
    env = _env_target()
    if env is not None and not env.is_gpu:
        return env.name
    return _DEFAULT_CPU_TARGET


def _env_target():
    """The target ``$FLYDSL_TARGET`` names, or None when it is unset; an unknown name is an
    ``UnknownTargetError`` naming the variable (``flydsl_core.targets.resolve_target``)."""
    if settings.get("FLYDSL_TARGET") is None:
        return None
    from flydsl_core.targets import resolve_target

    return resolve_target()


def env_gpu_target() -> str | None:
    """``$FLYDSL_TARGET``'s canonical name where it names a GPU target, else None."""
    t = _env_target()
    return t.name if t is not None and t.is_gpu else None


_ARCH_PROBE: dict[int, str | None] = {}  # device index -> the GPU's arch, None: none


def resolve_arch(index: int | None) -> str | None:
    """The arch of GPU ``index`` (None: the current one), from flydsl-core's one arch probe
    (``flydsl_core.targets.device_arch``: torch's report, or ``$FLYDSL_GPU_ARCH``).

    None when there is no such GPU. Cached per index: the predicate asks on every call.
    """
    if index is None:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
    if index in _ARCH_PROBE:
        return _ARCH_PROBE[index]
    from flydsl_core.targets import device_arch

    arch = device_arch(index) if index < torch.cuda.device_count() else None
    _ARCH_PROBE[index] = arch
    return arch


_GPU_TARGET: dict[int, str | None] = {}  # device index -> the GPU target's name, None: none


def gpu_target(index: int | None) -> str | None:
    """The target a launch on GPU ``index`` compiles for (None: the current GPU):
    ``$FLYDSL_TARGET`` where it names a GPU target, else the device's own; None where there is
    no such GPU or torch reports an arch FlyDSL has no target for. Cached per index."""
    if index is None:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
    if index in _GPU_TARGET:
        return _GPU_TARGET[index]
    name = env_gpu_target()
    if name is None:
        from flydsl_core.targets import lookup_target

        a = resolve_arch(index)
        t = lookup_target(a) if a else None
        name = t.name if t is not None and t.is_gpu else None
    _GPU_TARGET[index] = name
    return name


_ARCH: dict[int, str] = {}  # device index -> allowed GPU target name, "" when not allowed


def device_arch(kind: str, index: int | None) -> str:
    """The gate-table arch of device ``kind`` (``"cpu"``, ``"cuda"``) ``index``: ``"cpu"``, an
    allowed GPU target's name, or ``""`` where FlyDSL does not run (the module docstring)."""
    if kind == "cpu":
        return CPU_ARCH
    if kind != "cuda":
        return ""
    a = _ARCH.get(index)
    if a is None:
        g = gpu_target(index)
        a = _ARCH[index] = g if g is not None and g in allowed_archs() else ""
    return a


def arch(t) -> str:
    """``device_arch`` of ``t``'s device."""
    dev = t.device
    kind = dev.type
    if kind == "cpu":
        return CPU_ARCH
    return device_arch(kind, dev.index)


def target(t) -> str | None:
    """The FlyDSL target for a launch on ``t``: ``cpu_target()`` for CPU tensors, else the GPU
    target (``gpu_target``), passed to the kernels explicitly so that every path compiles
    for the target the eligibility check approved."""
    dev = t.device
    if dev.type == "cpu":
        return cpu_target()
    return gpu_target(dev.index)


def device_reason(t) -> str | None:
    """``subclass`` (not a plain tensor), ``arch`` (a device FlyDSL does not run on) or None."""
    if type(t) not in PLAIN:
        return "subclass"
    return None if arch(t) else "arch"


def device_unusable(device: str, index: int | None = None) -> str | None:
    """Why FlyDSL cannot run on ``device`` (GPU ``index``) now, or None. May touch the GPU."""
    why = _runtime.cannot_register(device)
    if why or device == "cpu":
        return why
    if not torch.cuda.is_available():
        return "no GPU: torch.cuda.is_available() is False"
    arch = resolve_arch(index)
    if arch is None:
        return "the GPU's arch could not be determined"
    tgt = gpu_target(index)
    if tgt is None:
        return f"FlyDSL has no target for the GPU's arch {arch}"
    allowed = allowed_archs()
    if tgt not in allowed:
        return f"target {tgt} is not in the allowed list {sorted(allowed)} (FLYDSL_TORCH_ARCHS)"
    return None


def clear_caches() -> None:
    """Forget the GPU answers (tests; a changed ``$FLYDSL_TARGET`` / ``$FLYDSL_GPU_ARCH``)."""
    _ARCH_PROBE.clear()
    _GPU_TARGET.clear()
    _ARCH.clear()
