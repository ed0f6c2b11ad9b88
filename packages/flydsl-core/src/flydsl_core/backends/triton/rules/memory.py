"""Triton rules for memory: loads, stores, atomics and the bounds masks that guard them."""

from __future__ import annotations

from ....ir.core import Op, Value
from ..emitter import Lowering, broadcast_shape, lower, shape_str, tl_dtype

_CACHE = {"ca": ".ca", "cg": ".cg", "cv": ".cv", "cs": ".cs", "wb": ".wb", "wt": ".wt"}
_EVICT = {"first": "evict_first", "last": "evict_last", "normal": ""}


def _pointer(cx: Lowering, tensor: Value, offs: Value, shape) -> str:
    ptr = cx.pnames[tensor.id]
    to = cx.get(offs)
    if to.literal and to.value == 0:
        p = ptr
        pshape = ()
    else:
        p = f"{ptr} + {cx.ref(offs)}"
        pshape = to.shape
    if tuple(pshape) != tuple(shape):
        p = f"tl.broadcast_to({p}, {shape_str(shape)})"
    return p


@lower("load")
def _load(cx: Lowering, op: Op):
    offs, mask, other = op.operand("offsets"), op.operand("mask"), op.operand("other")
    shape = broadcast_shape(*(cx.get(v).shape for v in (offs, mask, other) if v is not None))
    args = [_pointer(cx, op.operand("tensor"), offs, shape)]
    if mask is not None:
        args.append(f"mask={cx.ref(mask)}")
        args.append(f"other={cx.ref(other)}" if other is not None else "other=0")
    cache = op.attrs.get("cache")
    if cache:
        args.append(f'cache_modifier="{_CACHE.get(cache.lstrip("."), cache)}"')
    ev = op.attrs.get("eviction")
    if ev and cache and not cx.target.eviction_hint_with_cache_modifier:
        ev = None  # both are hints: keep the cache operator
    if ev:
        args.append(f'eviction_policy="{_EVICT.get(ev.removeprefix("evict_"), ev)}"')
    cx.define(op.results[0], f"tl.load({', '.join(args)})", shape, op.loc)


def _param(cx: Lowering, tensor: Value):
    for p in cx.fn.params:
        if p.value is not None and p.value.id == tensor.id:
            return p
    return None


def _based_pointer(
    cx: Lowering, tensor: Value, base: Value, offs: Value, shape, fold: bool = True
) -> str:
    """The pointers of ``load_at``: ``tensor + base + offs``. On targets with buffer loads
    (a tensor with 32-bit offsets), unless ``fold`` is False (the op's ``fold_base``), the
    base goes into a scalar pointer first, through an
    integer address so that Triton's pointer canonicalization cannot fold it back into the
    per-element offsets: the buffer load then takes that pointer as its base, and offsets
    that do not change across a loop are hoisted out of it whole. The pointer's alignment
    (lost through the integer) is restated from the tensor's and the base's divisibility.
    A scalar load's pointer is ``(tensor + base) + offs``, on every target (unless ``fold``
    is False)."""
    ptr = cx.pnames[tensor.id]
    p = _param(cx, tensor)
    d = tensor.type.dtype
    if fold and shape == ():
        # a scalar load: the base added to the pointer first (through an integer address,
        # which Triton's pointer canonicalization does not fold back into the offset), so
        # that a base that does not change across a loop (a block table's row) is a pointer
        # LLVM computes before it, and an offset it can prove non-negative (a page index) an
        # SMEM load's scalar offset: gfx950 decode d64 page256, 7 -> 3 instructions per KV
        # tile for the page id
        bp = cx.tmp("base")
        cx.emit(
            f"{bp} = ({ptr}.to(tl.int64) + {cx.tensor(base)}.to(tl.int64) * {d.bits // 8})"
            f".to(tl.pointer_type({tl_dtype(d)}))"
        )
        return f"{bp} + {cx.ref(offs)}"
    if (
        not fold
        or not (cx.target.has_buffer_ops and p is not None and p.facts.get("index_bits", 64) == 32)
        or shape == ()
    ):
        return _pointer_expr(cx, f"{ptr} + ({cx.ref(base)} + {cx.ref(offs)})", shape)
    es = d.bits // 8
    align = min(16 if p.facts.get("aligned") else es, es * cx.facts.divisor(base))
    bp = cx.tmp("base")
    cx.emit(
        f"{bp} = ({ptr}.to(tl.int64) + {cx.tensor(base)}.to(tl.int64) * {es})"
        f".to(tl.pointer_type({tl_dtype(d)}))"
    )
    whole = f"tl.broadcast_to({bp}, {shape_str(shape)})"
    if align > 1:
        whole = f"tl.multiple_of({whole}, {[align] * len(shape)})"
    return f"{whole} + {cx.ref(offs)}"


def _pointer_expr(cx: Lowering, p: str, shape) -> str:
    return f"tl.broadcast_to({p}, {shape_str(shape)})" if shape != () else p


@lower("load_at")
def _load_at(cx: Lowering, op: Op):
    offs, mask, other = op.operand("offsets"), op.operand("mask"), op.operand("other")
    shape = broadcast_shape(*(cx.get(v).shape for v in (offs, mask, other) if v is not None))
    shape = tuple(cx.ir_shape(op.results[0])) if shape != () else shape
    fold = op.attrs.get("fold_base", True)
    args = [_based_pointer(cx, op.operand("tensor"), op.operand("base"), offs, shape, fold)]
    if mask is not None:
        args.append(f"mask={cx.ref(mask)}")
        args.append(f"other={cx.ref(other)}" if other is not None else "other=0")
    cx.define(op.results[0], f"tl.load({', '.join(args)})", shape, op.loc)


@lower("store")
def _store(cx: Lowering, op: Op):
    offs, val, mask = op.operand("offsets"), op.operand("value"), op.operand("mask")
    shape = broadcast_shape(*(cx.get(v).shape for v in (offs, val, mask) if v is not None))
    args = [_pointer(cx, op.operand("tensor"), offs, shape), cx.ref(val)]
    if mask is not None:
        args.append(f"mask={cx.ref(mask)}")
    cx.emit(f"tl.store({', '.join(args)})", op.loc)


_ATOMIC_FN = {
    "add": "tl.atomic_add",
    "max": "tl.atomic_max",
    "min": "tl.atomic_min",
    "xchg": "tl.atomic_xchg",
    "and": "tl.atomic_and",
    "or": "tl.atomic_or",
    "xor": "tl.atomic_xor",
}


def atomic_args(cx: Lowering, op: Op) -> list[str]:
    """pointer, value, (mask=), sem= of an ``atomic_rmw``."""
    mask = op.operand("mask")
    shape = cx.ir_shape(op.results[0])
    args = [_pointer(cx, op.operand("tensor"), op.operand("offsets"), shape)]
    args.append(cx.full(op.operand("value")))
    if mask is not None:
        args.append(f"mask={cx.full(mask)}")
    args.append(f'sem="{op.attrs.get("sem", "acq_rel")}"')
    return args


def define_atomic(cx: Lowering, op: Op, expr: str):
    r, mask = op.results[0], op.operand("mask")
    if mask is not None and cx.used(r):
        # Masked-off lanes return 0 in FlyIR; Triton leaves them undefined.
        expr = f"tl.where({cx.full(mask)}, {expr}, 0)"
    cx.define(r, expr, cx.ir_shape(r), op.loc)


@lower("atomic_rmw")
def _atomic_rmw(cx: Lowering, op: Op):
    expr = f"{_ATOMIC_FN[op.attrs['kind']]}({', '.join(atomic_args(cx, op))})"
    define_atomic(cx, op, expr)


@lower("atomic_cas")
def _atomic_cas(cx: Lowering, op: Op):
    shape = cx.ir_shape(op.results[0])
    ptr = _pointer(cx, op.operand("tensor"), op.operand("offsets"), shape)
    cmp, val = cx.full(op.operand("cmp")), cx.full(op.operand("value"))
    cx.define(op.results[0], f'tl.atomic_cas({ptr}, {cmp}, {val}, sem="acq_rel")', shape, op.loc)


@lower("range_mask")
def _range_mask(cx: Lowering, op: Op):
    start, extent = op.operand("start"), op.operand("extent")
    axis, length, shape = op.attrs["axis"], op.attrs["length"], tuple(op.attrs["shape"])
    ts = cx.get(start)
    s, e = cx.ref(start), cx.ref(extent)
    if axis < 0 or length == 1:
        if ts.literal and cx.get(extent).literal:
            s = cx.scalar_tensor(ts)
        cx.define(op.results[0], f"{s} < {e}", (), op.loc)  # one test for the whole tile
        return
    ar = f"tl.arange(0, {length})"
    vshape = [1] * len(shape)
    vshape[axis] = length
    if len(shape) > 1:
        ar += "[" + ", ".join(":" if i == axis else "None" for i in range(len(shape))) + "]"
    lhs = ar if (ts.literal and ts.value == 0) else f"{s} + {ar}"
    cx.define(op.results[0], f"{lhs} < {e}", tuple(vshape), op.loc)
