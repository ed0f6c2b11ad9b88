"""One declarative spec per op: what torch_flydsl takes over, when, and what it runs instead.

An ``OpSpec`` names an op group (what ``enable(ops=[...])`` and ``torch.compile(...,
options={"ops": [...]})`` accept) and lists its ATen overloads. Each ``Overload`` carries:

* ``reason(ctx, *args)``: the predicate, called with ATen's own arguments (schema order,
  keyword-only ones included); ``None`` means FlyDSL runs, a string is the fallback reason
  counted in ``torch_flydsl.stats()`` (``stats.REASONS``);
* ``impl(ctx, *args)``: the eager implementation, returning what ATen returns;
* ``fallback(*args)``: only where the dispatch key may have no ATen kernel to capture
  (CPU ``_fused_rms_norm_backward``); otherwise the captured kernel is the fallback;
* ``lower(ctx, *args)``: for the torch.compile pass, the ``flydsl::`` op call that replaces
  the node (``inductor.Call``); ``eager=False`` overloads are compile-only (``aten.mm``);
* ``devices``: the devices the eager override registers on (``"cuda"``, ``"cpu"``): an
  overload ATen only has for one of them (``_scaled_dot_product_flash_attention`` on CUDA,
  its ``_for_cpu`` twin on CPU) names that one;
* ``gate``, ``dtypes``, ``key``: the gate-table op the predicate consults (None: none), the
  dtypes it takes for its key tensor (argument ``key``). The eager wrapper decides these
  first, once per (device, dtype) of the key tensor (``dispatch.make_kernel``): a dtype the
  op does not take (``dtype``), a device FlyDSL does not run on (``arch``), a gate closed
  for every shape and, with ``numel_mn``, a key tensor smaller than every gate rule
  (``gate``) fall back before the predicate runs.

``ctx`` is the eager ``dispatch.EagerContext`` or the pass's ``inductor.CompileContext``: both
answer ``arch(t)`` ("" where FlyDSL may not run), ``table`` (the gates), ``target_of(t)`` and
``plain(t)`` (a tensor the predicate may look at: plain tensors in eager mode, FakeTensors
in the pass); both answer from ``torch_flydsl.eligibility``. ``gate_ops`` (derived from the
overloads' ``gate``) are the gate table ops the predicates consult, ``calibration`` the cases
``torch_flydsl calibrate`` times for them.

One generic wrapper (``dispatch.make_kernel``) serves every eager overload, and the
Inductor pass (``inductor.graph_pass``) walks the same overloads; ``torch_flydsl.OPS``, the
gate table's ops (``gates.OPS``) and ``enable(ops=...)``'s names are derived from the specs,
so adding an op is one spec module under ``torch_flydsl.ops`` and one line in
``ops.SPEC_MODULES``. Importing specs imports no kernels: implementations import
``flydsl_kernels`` on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Overload:
    """One ATen overload of an op spec (``"topk.values"``, ``"_scaled_mm_v2"``)."""

    op: str
    reason: Callable[..., str | None]
    impl: Callable | None = None
    fallback: Callable | None = None
    lower: Callable | None = None
    eager: bool = True
    devices: tuple[str, ...] = ("cuda", "cpu")
    gate: str | None = None
    dtypes: tuple = ()  # torch dtypes of the key tensor the predicate takes
    key: int = 0
    #: the key tensor's numel is the gate's ``m * n`` (RMSNorm, TopK): a call smaller than
    #: every rule's lowest corner is outside the gate before the predicate runs
    numel_mn: bool = False

    @property
    def name(self) -> str:
        """The overload's packet name (``topk`` for ``topk.values``)."""
        return self.op.split(".")[0]

    @property
    def overload_name(self) -> str:
        return self.op.split(".")[1] if "." in self.op else "default"


@dataclass(frozen=True)
class Calibration:
    """What ``torch_flydsl calibrate`` times for one gate op.

    ``cases(dtypes, quick)`` yields ``(dtype, m, n, k)`` buckets (closed ranges, ``k`` None
    where the op has none); ``make(dtype, m, n, k, device)`` returns ``(ours, aten)``,
    zero-argument callables for one representative shape of the bucket (its lower corner
    unless the spec says otherwise).
    """

    op: str
    cases: Callable[[Iterable, bool], Iterable]
    make: Callable
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    rule_extra: Callable | None = None  # (k bucket) -> extra rule fields (topk: largest/sorted)


@dataclass(frozen=True)
class OpSpec:
    name: str
    overloads: tuple[Overload, ...]
    calibration: tuple[Calibration, ...] = ()
    aliases: tuple[str, ...] = ()
    summary: str = ""
    #: the devices where ``enable()`` without ``ops=`` takes this group (``sdpa``: none, it is
    #: opt-in; ``rms_norm``: the GPU only, see ``ops/rms_norm.py``)
    default: tuple[str, ...] = ("cuda", "cpu")
    extra: dict = field(default_factory=dict)

    @property
    def gate_ops(self) -> tuple[str, ...]:
        """The gate table ops the predicates consult, in overload order."""
        return tuple(dict.fromkeys(o.gate for o in self.overloads if o.gate is not None))

    @property
    def eager_overloads(self) -> tuple[Overload, ...]:
        return tuple(o for o in self.overloads if o.eager and o.impl is not None)

    @property
    def compile_overloads(self) -> tuple[Overload, ...]:
        return tuple(o for o in self.overloads if o.lower is not None)
