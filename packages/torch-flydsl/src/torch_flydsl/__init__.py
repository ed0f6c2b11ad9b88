"""PyTorch integration of FlyDSL kernels.

Eager overrides of the ops users already call: ``F.rms_norm`` / ``torch.rms_norm``
(``aten::_fused_rms_norm`` and its backward), ``torch.topk`` (``aten::topk``,
``aten::topk.values``), ``torch._grouped_mm`` and MX ``torch._scaled_mm`` /
``F.scaled_mm`` / ``F.scaled_grouped_mm``::

    import torch_flydsl
    torch_flydsl.enable()                  # the default op groups, on the GPU (gfx950 by default)
    torch_flydsl.enable(ops=["grouped_mm", "scaled_mm"])
    torch_flydsl.enable(ops=["sdpa"])      # opt-in: F.scaled_dot_product_attention's kernels
    torch_flydsl.enable(device="cpu")      # the CPU test backend (FlyDSL reference backend)
    torch_flydsl.enable(ops=["rms_norm"], device="cpu")   # opt-in there (ops/rms_norm.py)
    with torch_flydsl.disabled():
        ...                                # plain ATen here
    torch_flydsl.status(), torch_flydsl.stats(), torch_flydsl.reset_stats()
    torch_flydsl.disable()

``torch_flydsl.custom_op``: ``torch.library.triton_op`` for FlyDSL kernels (``custom_ops.py``).

``torch_flydsl.flex_attention``: torch's ``flex_attention`` (same signature) on FlyDSL's
attention kernels, its mods translated from PyTorch (``torch_flydsl.flex``).

GEMMs under torch.compile: ``torch.compile(model, backend="flydsl")`` (an entry point: no
import needed) or ``torch_flydsl.inductor.install()`` with ``backend="inductor"``
(``torch_flydsl.inductor``).

``FLYDSL_TORCH=1`` enables at import (``FLYDSL_TORCH_DEVICE=cpu`` picks the CPU backend).
Importing this package compiles nothing and touches no GPU: kernels are imported and
compiled on the first eligible call. Each op is one spec (``torch_flydsl.ops``,
``spec.py``); docs/architecture.md describes the precedence, predicates and gate table.
"""

from __future__ import annotations

import contextlib
import logging

from flydsl_core import settings as _settings

# The submodule ``stats`` is loaded here, before the function ``stats()`` below takes its
# name on the package: a first load later would rebind the package attribute to the module.
from . import stats as _stats_module

# our FLYDSL_* variables, declared before anything reads one
from . import variables as _variables  # noqa: F401
from .custom_ops import custom_op
from .flex import flex_attention
from .ops import EAGER as _EAGER

__version__ = "0.1.0"

log = logging.getLogger("torch_flydsl")

#: op groups ``enable(ops=...)`` accepts (the specs with eager overrides, ``ops.SPECS``), in
#: status() order; ``enable()`` without ``ops`` takes those whose spec's ``default`` names the
#: device (all but ``sdpa``; on the CPU also not ``rms_norm``)
OPS: tuple[str, ...] = _EAGER
PRECEDENCES = ("ours", "upstream")

_installed: dict[tuple[str, str], object] = {}  # (device, group) -> dispatch.Installed
_deferred: dict[tuple[str, str], str] = {}  # (device, group) -> why we did not register
_unusable: dict[str, str] = {}  # device -> why nothing registered there
_contexts: dict[str, object] = {}  # device -> dispatch.EagerContext
_precedence: dict[str, str] = {}  # device -> the precedence used by its last enable()


def _precedence_of(value) -> str:
    p = str(value).strip().lower() if value else _settings.get("FLYDSL_TORCH_PRECEDENCE")
    if p not in PRECEDENCES:
        raise ValueError(
            f"precedence {p!r}: expected one of {PRECEDENCES} (FLYDSL_TORCH_PRECEDENCE)"
        )
    return p


def _groups(ops, device: str | None = None) -> tuple[str, ...]:
    """The groups ``ops`` names; None: every group, or with ``device`` its default groups."""
    from .ops import NAMES, SPECS

    if ops is None:
        return OPS if device is None else tuple(g for g in OPS if device in SPECS[g].default)
    if isinstance(ops, str):
        ops = [ops]

    out = []
    for o in ops:
        g = NAMES.get(str(o))
        if g not in OPS:
            what = "has no eager override (torch.compile only)" if g else "is unknown"
            raise ValueError(f"op {o!r} {what}: torch_flydsl overrides {', '.join(OPS)}")
        if g not in out:
            out.append(g)
    return tuple(out)


def enable(ops=None, device=None, *, precedence=None) -> None:
    """Register the overrides of ``ops`` (default: the default groups of ``OPS`` for the device:
    all but the opt-in ``sdpa``, and on the CPU not ``rms_norm`` either) for ``device``.

    ``device``: ``"cuda"`` (ROCm or CUDA builds; the default) or ``"cpu"``
    (the test backend); None reads ``$FLYDSL_TORCH_DEVICE``. ``precedence``
    (default ``$FLYDSL_TORCH_PRECEDENCE`` or ``"ours"``): with ``"upstream"``
    a group whose ops already hold a non-ATen kernel (torch's own FlyDSL
    overrides, another library) is left alone; with ``"ours"`` we register
    over it and fall back to it. Where the runtime is unusable nothing is
    registered and ``status()`` says why; enable() does not raise for that.
    """
    from . import _runtime, dispatch, gates
    from .ops import SPECS

    dev = _runtime.normalize_device(device)
    prec = _precedence_of(precedence)
    groups = _groups(ops, dev)
    why = _runtime.cannot_register(dev)
    if why:
        _unusable[dev] = why
        log.info("torch_flydsl: not enabling on %s: %s", dev, why)
        return
    _unusable.pop(dev, None)
    _precedence[dev] = prec
    if dev not in _contexts or not any(d == dev for d, _ in _installed):
        _contexts[dev] = dispatch.EagerContext(dev, gates.load())
    ctx = _contexts[dev]
    for g in groups:
        if (dev, g) in _installed:
            continue
        _deferred.pop((dev, g), None)
        if prec == "upstream":
            prior = dispatch.prior_registrations(SPECS[g], dev)
            if prior:
                where = ", ".join(f"aten::{op}@{key}" for op, key in prior)
                _deferred[(dev, g)] = f"precedence=upstream: prior registration at {where}"
                log.info("torch_flydsl: %s left to the prior registration (%s)", g, where)
                continue
        _installed[(dev, g)] = dispatch.install(SPECS[g], ctx)
        log.debug("torch_flydsl: %s enabled on %s", g, dev)


def disable(ops=None, device=None) -> None:
    """Remove the overrides of ``ops`` (default all) on ``device`` (default every device)."""
    groups = _groups(ops)
    for dev, g in list(_installed):
        if g in groups and (device is None or dev == _normalize(device)):
            _installed.pop((dev, g)).remove()
    for key in list(_deferred):
        if key[1] in groups and (device is None or key[0] == _normalize(device)):
            del _deferred[key]


def _normalize(device) -> str:
    from . import _runtime

    return _runtime.normalize_device(device)


def enabled(op=None, device=None) -> bool:
    """Whether ``op`` (any op when None) is overridden on ``device`` (any device when None)."""
    return any(
        (op is None or g == _groups(op)[0]) and (device is None or d == _normalize(device))
        for d, g in _installed
    )


@contextlib.contextmanager
def disabled():
    """Plain ATen inside the block; the previous overrides come back after it."""
    saved = [(d, g, _precedence.get(d)) for d, g in _installed]
    disable()
    try:
        yield
    finally:
        for d, g, p in saved:
            enable(ops=[g], device=d, precedence=p)


def stats() -> dict[str, dict]:
    """``{op: {"calls", "hits", "fallbacks": {reason: count}}}`` since the last reset.

    Keys: the overridden ATen overloads (eager), the ``flydsl::`` ops (launches of the ops the
    torch.compile pass rewrites into, counted where the op body runs: eager and CPU graphs)
    and ``compile:<aten op>`` (nodes the pass saw: hits are rewrites, fallbacks the reasons a
    node stayed ATen)."""
    return _stats_module.snapshot()


def reset_stats() -> None:
    _stats_module.reset()


def status(device=None) -> dict:
    """Whether the runtime is usable (and why not), the ops overridden, the resolved arch.

    ``device`` as ``enable()``'s (None: the enabled device, if any); resolving the arch of a GPU reads its
    properties (status() is the one place besides eligible calls that does).
    """
    from . import _runtime, dispatch, eligibility, gates
    from .ops import SPECS

    if device is None and _installed:  # the device something is enabled on
        device = next(iter(_installed))[0]
    dev = _runtime.normalize_device(device)
    why = _unusable.get(dev) or eligibility.device_unusable(dev)
    cpu = dev == "cpu"
    arch = eligibility.CPU_ARCH if cpu else eligibility.resolve_arch(None)
    ctx = _contexts.get(dev)
    table = ctx.table if ctx is not None else gates.load()
    ops = {}
    for g in OPS:
        inst = _installed.get((dev, g))
        pairs = dispatch.group_ops(SPECS[g], dev)
        entry = {"overrides": [f"aten::{op}@{key}" for op, key in pairs]}
        if inst is not None:
            entry["state"] = "enabled"
            entry["fallback_to"] = {
                f"aten::{op}@{key}": k or "torch._decomp decomposition (no ATen kernel here)"
                for (op, key), k in inst.captured.items()
            }
        elif (dev, g) in _deferred:
            entry["state"] = "deferred"
            entry["why"] = _deferred[(dev, g)]
        else:
            entry["state"] = "off"
            if dev not in SPECS[g].default:
                entry["why"] = f"opt-in on {dev}: enable(ops=[{g!r}], device={dev!r})"
        ops[g] = entry
    return {
        "usable": why is None,
        "why_not": why,
        "device": dev,
        "dispatch_key": _runtime.dispatch_key(dev),
        "arch": arch,
        "allowed_archs": [eligibility.CPU_ARCH] if cpu else sorted(eligibility.allowed_archs()),
        # the target launches compile for (``eligibility.target``'s rule), None without a GPU
        "target": eligibility.cpu_target() if cpu else eligibility.gpu_target(None),
        "cpu_target": eligibility.cpu_target() if cpu else None,
        "enabled": [g for g in OPS if (dev, g) in _installed],
        "ops": ops,
        "precedence": _precedence.get(dev, _precedence_of(None)),
        "gates": {
            "local_table": table.local_source,
            "local_path": str(gates.local_path()),
            "rules": sum(len(v) for v in table.summary().values()),
        },
    }


__all__ = [
    "OPS",
    "custom_op",
    "disable",
    "disabled",
    "enable",
    "enabled",
    "flex_attention",
    "reset_stats",
    "stats",
    "status",
]


class _FlashImplHandle:
    """What torch's flash-attention registry keeps while ``"flydsl"`` is the active impl."""

    def remove(self) -> None:
        disable(ops=["sdpa"], device="cuda")


def _activate_flash_impl():
    enable(ops=["sdpa"], device="cuda")
    return _FlashImplHandle()


# torch's registry of flash-attention providers (torch >= 2.10): "flydsl" is listed there and
# runs only when the user activates it (activate_flash_attention_impl("flydsl")).
if hasattr(__import__("torch").nn.attention, "register_flash_attention_impl"):
    import torch.nn.attention as _attn

    _attn.register_flash_attention_impl("flydsl", register_fn=_activate_flash_impl)

if _settings.get("FLYDSL_TORCH"):  # strict: FLYDSL_TORCH=bogus is a SettingsError here
    enable()
