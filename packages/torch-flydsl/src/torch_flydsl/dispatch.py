"""The eager overrides: one generated wrapper per ATen overload of an ``OpSpec``.

For each op group and device (``CUDA`` key, which ROCm uses too, or ``CPU`` for the tests)
``install`` captures the kernel registered at the key (``torch.library.get_kernel``),
then registers a Python kernel over it with ``torch.library.Library("aten", "IMPL")``. The
kernel runs the spec's predicate and either the spec's implementation or the captured kernel
(``call_boxed`` with the context's keyset), so a fallback is exactly what ran before us.
Implementation exceptions never escape: they are logged at warning, counted as ``error`` and
answered by the captured kernel.

The wrapper is generated from the overload's schema (``make_kernel``): explicit parameters
with ATen's defaults instead of ``*args, **kwargs`` (no tuple and dict packing per call), the
predicate, implementation, counters and fallback bound as globals of the generated function,
no ``calls`` counter (``calls`` is ``hits + fallbacks``) and the fallback counted inline:
the cheapest Python kernel that still does the work. Below that is the cost of any Python
kernel (entering Python from the dispatcher, boxing the arguments back for the captured
kernel), which the tool reports as the floor. ``tools/bench_dispatch.py`` measures it.
"""

from __future__ import annotations

import functools
import keyword
import logging
import warnings

import torch

from . import _runtime, eligibility, gates
from .spec import OpSpec, Overload
from .stats import get as _stat

log = logging.getLogger("torch_flydsl")


class EagerContext:
    """What a registered kernel needs about its device: the arch check, the target, the gates.

    The eager ``ctx`` of the spec predicates (``spec.py``; the pass's is
    ``inductor.CompileContext``); its answers are ``eligibility``'s.
    """

    plain = staticmethod(eligibility.plain)

    def __init__(self, device: str, table: gates.GateTable):
        self.device = device
        self.cpu = device == "cpu"
        self.table = table
        #: the CPU target, read once per enable() (``eligibility.cpu_target``)
        self.target = eligibility.cpu_target() if self.cpu else None
        eligibility.allowed_archs()  # a bad $FLYDSL_TORCH_ARCHS is an error at enable()
        #: the keyset the captured kernels are called with (kernels registered without one
        #: are cheaper to enter: about 0.6 us a call on the CPU here)
        self.keyset = torch._C.DispatchKeySet(
            torch._C.DispatchKey.CPU if self.cpu else torch._C.DispatchKey.CUDA
        )

    def arch(self, t: torch.Tensor) -> str:
        """The arch name for ``t``'s device, or "" when FlyDSL may not run there."""
        return eligibility.CPU_ARCH if self.cpu else eligibility.arch(t)

    def target_of(self, t: torch.Tensor) -> str | None:
        """The FlyDSL target a launch on ``t`` compiles for (``eligibility.target``)."""
        return self.target if self.cpu else eligibility.gpu_target(t.device.index)

    def run(self, t: torch.Tensor, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` under a device guard: Python kernels get none."""
        if not self.cpu:
            idx = t.device.index
            if idx is not None and idx != torch.cuda.current_device():
                with torch.cuda.device(idx):
                    return fn(*args, **kwargs)
        return fn(*args, **kwargs)


def aten_overload(op: str):
    """``torch.ops.aten.<op>`` as an ``OpOverload`` (``"topk.values"``, ``"mm"``)."""
    name, _, ov = op.partition(".")
    return getattr(getattr(torch.ops.aten, name), ov or "default")


def _default(arg) -> str:
    if not arg.has_default_value():
        return ""
    v = arg.default_value
    if isinstance(v, list):
        v = tuple(v)
    return "=" + repr(v)


def first_reason(b: EagerContext, ov: Overload, t) -> str | int | None:
    """The decision for every call of ``ov`` whose key tensor has ``t``'s device and dtype:
    ``arch``, ``dtype``, ``gate`` (the gate is closed for every shape there), None (the
    predicate decides per call) or, for ``numel_mn`` overloads, the least key-tensor numel any
    gate rule takes (below it: ``gate``; else the predicate). The generated wrapper caches it
    per (device, dtype)."""
    arch = b.arch(t)
    if not arch:
        return "arch"
    if ov.dtypes and t.dtype not in ov.dtypes:
        return "dtype"
    if ov.gate is not None:
        if b.table.closed(arch, ov.gate, t.dtype):
            return "gate"
        if ov.numel_mn:
            low = b.table.min_mn(arch, ov.gate, t.dtype)
            return low if low > 1 else None
    return None


def make_kernel(ov: Overload, b: EagerContext, orig):
    """The Python kernel registered for ``ov`` on ``b``'s key (see the module docstring).

    Cheapest first: the key tensor's type, then one dict lookup of the (device, dtype)
    decision (``first_reason``: arch, dtype, a gate closed for every shape), and only where
    that leaves the call open the spec's predicate, whose gate lookups are cached per shape
    class (``gates.GateTable.allows``)."""
    schema = aten_overload(ov.op)._schema
    pos = [a for a in schema.arguments if not a.kwarg_only]
    kwo = [a for a in schema.arguments if a.kwarg_only]
    # schema names as parameter names: the dispatcher passes keyword-only arguments by name;
    # the generated function's own names (globals and locals) are prefixed ``_fly_`` so that
    # none clashes with a schema's
    name = {a.name: (a.name + "_" if keyword.iskeyword(a.name) else a.name) for a in pos}
    name.update({a.name: a.name for a in kwo})
    every = ", ".join(name[a.name] for a in schema.arguments)
    params = [f"{name[a.name]}{_default(a)}" for a in pos]
    if kwo:
        params += ["*"] + [f"{a.name}{_default(a)}" for a in kwo]
    to_fallback = ", ".join([name[a.name] for a in pos] + [f"{a.name}={a.name}" for a in kwo])
    if orig is not None:
        fallback = f"_fly_orig.call_boxed(_fly_keyset, {to_fallback})"
    elif ov.fallback is not None:
        fallback = f"_fly_fallback({to_fallback})"
    else:
        raise RuntimeError(f"aten::{ov.op} has no kernel for {b.keyset} to fall back to")
    t = name[schema.arguments[ov.key].name]
    # the decision cache's key: the dtype on the CPU key (one device), (dtype, index) on CUDA
    key = f"{t}.dtype" if b.cpu else f"({t}.dtype, {t}.get_device())"
    fn_name = ov.op.replace(".", "_")
    src = (
        f"def {fn_name}({', '.join(params)}):\n"
        f"    if type({t}) in _fly_plain:\n"
        f"        _fly_k = {key}\n"
        f"        _fly_r = _fly_first.get(_fly_k, False)\n"
        f"        if _fly_r is False:\n"
        f"            _fly_r = _fly_first[_fly_k] = _fly_first_reason(_fly_b, _fly_ov, {t})\n"
        f"        if _fly_r is None or (type(_fly_r) is int and {t}.numel() >= _fly_r):\n"
        f"            _fly_r = _fly_reason(_fly_b, {every})\n"
        f"        elif type(_fly_r) is int:\n"
        f"            _fly_r = 'gate'\n"
        f"    else:\n"
        f"        _fly_r = 'subclass'\n"
        f"    if _fly_r is None:\n"
        f"        try:\n"
        f"            _fly_out = _fly_impl(_fly_b, {every})\n"
        f"            _fly_st.hits += 1\n"
        f"            return _fly_out\n"
        f"        except Exception as _fly_e:\n"
        f"            _fly_st.error(_fly_e)\n"
        f"    else:\n"
        f"        _fly_fb[_fly_r] = _fly_fb.get(_fly_r, 0) + 1\n"
        f"        if _fly_debug({logging.DEBUG}):\n"
        f"            _fly_log(_fly_r)\n"
        f"    return {fallback}\n"
    )
    st = _stat(ov.op)
    env = {
        "_fly_plain": eligibility.PLAIN,
        "_fly_first": {},  # (device,) dtype -> first_reason
        "_fly_first_reason": first_reason,
        "_fly_ov": ov,
        "_fly_reason": ov.reason,
        "_fly_impl": ov.impl,
        "_fly_b": b,
        "_fly_st": st,
        "_fly_fb": st.fallbacks,  # counted in place: reset() clears this very dict
        "_fly_debug": log.isEnabledFor,
        "_fly_log": functools.partial(log.debug, "%s: ATen fallback (%s)", ov.op),
        "_fly_orig": orig,
        "_fly_keyset": b.keyset,
        "_fly_fallback": ov.fallback,
    }
    exec(compile(src, f"<torch_flydsl dispatch aten::{ov.op}>", "exec"), env)
    fn = env[fn_name]
    fn.__torch_flydsl_source__ = src
    return fn


def is_aten_kernel(kernel) -> bool:
    """Whether a captured kernel is ATen's own (a C++ registration in PyTorch's build)."""
    d = repr(kernel)
    return "aten/src/ATen" in d or "torch/csrc" in d


def capture(op: str, key: str):
    """The kernel now at ``aten::op`` for ``key``, or None when there is none."""
    try:
        return torch.library.get_kernel(f"aten::{op}", key)
    except RuntimeError:
        return None


def group_ops(spec: OpSpec, device: str) -> tuple[tuple[str, str], ...]:
    """``(aten overload, dispatch key)`` pairs a spec overrides on ``device``."""
    key = _runtime.dispatch_key(device)
    return tuple((o.op, key) for o in spec.eager_overloads if device in o.devices)


class Installed:
    """One op group registered on one device: its library (destroy to remove) and what it holds."""

    def __init__(self, group, device, lib, captured):
        self.group = group
        self.device = device
        self.lib = lib
        self.captured = captured  # {(op, key): repr of the kernel we captured, or None}

    def remove(self) -> None:
        self.lib._destroy()


def prior_registrations(spec: OpSpec, device: str) -> dict[tuple[str, str], str]:
    """Non-ATen kernels already at the spec's (op, key) pairs: ``{(op, key): repr}``."""
    out = {}
    for op, key in group_ops(spec, device):
        k = capture(op, key)
        if k is not None and not is_aten_kernel(k):
            out[(op, key)] = repr(k)
    return out


def install(spec: OpSpec, ctx: EagerContext) -> Installed:
    """Capture the current kernels of ``spec``'s overloads, then register ours over them."""
    key = _runtime.dispatch_key(ctx.device)
    ovs = tuple(o for o in spec.eager_overloads if ctx.device in o.devices)
    origs = {o.op: capture(o.op, key) for o in ovs}  # all captured before any impl
    # an overload ATen has no kernel for on this key, and that we could not fall back from
    # (torch 2.11's aten::_scaled_mm_v2 on the CPU), is left alone: the call raises ATen's
    # own error, as it would without us
    bare = [o.op for o in ovs if origs[o.op] is None and o.fallback is None]
    if bare:
        log.info("%s on %s: ATen has no kernel for %s here; not overridden", spec.name,
                 ctx.device, ", ".join(bare))  # fmt: skip
        ovs = tuple(o for o in ovs if o.op not in bare)
        origs = {o.op: origs[o.op] for o in ovs}
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*operators may also be overridden.*")
            for o in ovs:
                lib.impl(o.op, make_kernel(o, ctx, origs[o.op]), key)
    except BaseException:
        lib._destroy()
        raise
    return Installed(
        spec.name,
        ctx.device,
        lib,
        {(op, key): (None if k is None else repr(k)) for op, k in origs.items()},
    )
