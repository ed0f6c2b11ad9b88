"""Triton rules for whole-tile ops: shapes, reductions, scans, sorting and histograms."""

from __future__ import annotations

from .... import dtypes as dt
from ....exc import LoweringError
from ....ir.core import Op
from ..emitter import BACKEND, TV, Lowering, lower, shape_str, tl_dtype

# -- shape --------------------------------------------------------------------------------------------


@lower("broadcast")
def _broadcast(cx: Lowering, op: Op):
    # Lazy: Triton broadcasts implicitly; ops that need the full shape ask for it.
    cx.bind(op.results[0], cx.get(op.operand("x")))


def _unit_map(src, dst):
    """For a reshape that only adds or drops size-1 dims: src dim -> dst dim of each non-unit dim."""
    si = [i for i, s in enumerate(src) if s != 1]
    di = [i for i, s in enumerate(dst) if s != 1]
    if [src[i] for i in si] != [dst[i] for i in di]:
        return None
    return dict(zip(si, di))


def _insert_index(vin, vout) -> str | None:
    """``[None, :]``-style indexing turning shape ``vin`` into ``vout`` by inserting unit dims."""
    parts, j = [], 0
    for s in vout:
        if j < len(vin) and vin[j] == s:
            parts.append(":")
            j += 1
        elif s == 1:
            parts.append("None")
        else:
            return None
    if j != len(vin):
        return None
    return "[" + ", ".join(parts) + "]"


@lower("reshape")
def _reshape(cx: Lowering, op: Op):
    a = op.operand("x")
    r = op.results[0]
    tv = cx.get(a)
    src, dst = cx.ir_shape(a), cx.ir_shape(r)
    m = _unit_map(src, dst)
    if m is not None and (tv.shape == () or tv.literal):
        cx.bind(r, tv)  # a scalar stands for a splat of any shape
        return
    if m is not None:
        vout = [1] * len(dst)
        for i, j in m.items():
            vout[j] = tv.shape[i]
        vout = tuple(vout)
        if vout == tv.shape:
            cx.bind(r, TV(tv.expr, vout, tv.dtype))
            return
        idx = _insert_index(tv.shape, vout)
        expr = f"{tv.expr}{idx}" if idx else f"tl.reshape({tv.expr}, {shape_str(vout)})"
        cx.define(r, expr, vout, op.loc)
        return
    cx.define(r, f"tl.reshape({cx.full(a)}, {shape_str(dst)})", dst, op.loc)


@lower("permute")
def _permute(cx: Lowering, op: Op):
    a = op.operand("x")
    order = tuple(op.attrs["order"])
    tv = cx.get(a)
    if tv.shape == () or tv.literal:
        cx.bind(op.results[0], tv)
        return
    shape = tuple(tv.shape[i] for i in order)
    cx.define(op.results[0], f"tl.permute({tv.expr}, {shape_str(order)})", shape, op.loc)


@lower("concat")
def _concat(cx: Lowering, op: Op):
    # Power-of-two tiles concatenate only in equal halves: join them along a new minor
    # axis, move it in front of `axis` and merge the two (a's block first).
    a, b = op.operand("a"), op.operand("b")
    axis = op.attrs["axis"]
    shape = cx.ir_shape(a)
    if shape != cx.ir_shape(b):
        raise LoweringError(
            f"{BACKEND}: concat of unequal tiles {shape} and {cx.ir_shape(b)}", loc=op.loc
        )
    rank = len(shape)
    joined = f"tl.join({cx.full(a)}, {cx.full(b)})"
    order = list(range(rank))
    order.insert(axis, rank)
    out = cx.ir_shape(op.results[0])
    cx.define(
        op.results[0],
        f"tl.reshape(tl.permute({joined}, {shape_str(order)}), {shape_str(out)})",
        out,
        op.loc,
    )


# -- reductions and scans -------------------------------------------------------------------------------

_COMBINE = {
    "_fly_max_nan": "return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)",
    "_fly_min_nan": "return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)",
    "_fly_max": "return tl.maximum(a, b)",
    "_fly_min": "return tl.minimum(a, b)",
    "_fly_prod": "return a * b",
}


def _combine(cx: Lowering, name: str) -> str:
    return cx.helper(name, f"\n@triton.jit\ndef {name}(a, b):\n    {_COMBINE[name]}\n")


_ARG_HELPER = """
@triton.jit
def {name}(v1, i1, v2, i2):
    # {what}: the first extreme index wins; NaN ranks highest (torch's order).
    n1 = v1 != v1
    n2 = v2 != v2
    better = (v1 {cmp} v2) | ((v1 == v2) & (i1 < i2))
    pick = (n1 & (~n2 | (i1 < i2))) | (~n1 & ~n2 & better)
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)
"""

_ARG_INT_HELPER = """
@triton.jit
def {name}(v1, i1, v2, i2):
    # {what}: the first extreme index wins.
    pick = (v1 {cmp} v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)
"""


@lower("reduce")
def _reduce(cx: Lowering, op: Op):
    a = op.operand("x")
    kind, axis = op.attrs["kind"], op.attrs["axis"]
    d = a.type.dtype
    x = cx.full(a)
    if kind == "sum":
        extra = f", dtype={tl_dtype(d)}" if (d.is_int and d.bits < 32) else ""
        expr = f"tl.sum({x}, axis={axis}{extra})"
    elif kind == "xor_sum":
        expr = f"tl.xor_sum({x}, axis={axis})"
    elif kind == "prod":
        expr = f"tl.reduce({x}, {axis}, {_combine(cx, '_fly_prod')})"
    elif kind in ("max", "min"):
        if d.is_float:
            name = "_fly_max_nan" if kind == "max" else "_fly_min_nan"
        else:
            name = "_fly_max" if kind == "max" else "_fly_min"
        expr = f"tl.reduce({x}, {axis}, {_combine(cx, name)})"
    else:
        raise LoweringError(f"{BACKEND}: unknown reduction {kind!r}", loc=op.loc)
    cx.define(op.results[0], expr, loc=op.loc)


def _index_along(shape, axis) -> str:
    """An int32 tile of ``shape`` holding each element's index along ``axis``."""
    n = shape[axis]
    idx = f"tl.arange(0, {n})"
    if len(shape) > 1:
        idx += "[" + ", ".join(":" if i == axis else "None" for i in range(len(shape))) + "]"
        idx = f"tl.broadcast_to({idx}, {shape_str(shape)})"
    return idx


@lower("argreduce")
def _argreduce(cx: Lowering, op: Op):
    a = op.operand("x")
    kind, axis = op.attrs["kind"], op.attrs["axis"]
    d = a.type.dtype
    shape = cx.ir_shape(a)
    cmp = ">" if kind == "argmax" else "<"
    if d.is_float:
        name = cx.helper(
            f"_fly_{kind}", _ARG_HELPER.format(name=f"_fly_{kind}", what=kind, cmp=cmp)
        )
    else:
        name = cx.helper(
            f"_fly_{kind}_int", _ARG_INT_HELPER.format(name=f"_fly_{kind}_int", what=kind, cmp=cmp)
        )
    rv, ri = op.results
    nv, ni = cx.name_of(rv), cx.name_of(ri)
    x = cx.full(a)
    cx.emit(f"{nv}, {ni} = tl.reduce(({x}, {_index_along(shape, axis)}), {axis}, {name})", op.loc)
    cx.bind(rv, TV(nv, cx.ir_shape(rv), rv.type.dtype))
    cx.bind(ri, TV(ni, cx.ir_shape(ri), ri.type.dtype))


@lower("scan")
def _scan(cx: Lowering, op: Op):
    a = op.operand("x")
    kind, axis, rev = op.attrs["kind"], op.attrs["axis"], bool(op.attrs.get("reverse", False))
    d = a.type.dtype
    x = cx.full(a)
    r = ", reverse=True" if rev else ""
    if kind in ("cumsum", "cumprod"):
        extra = f", dtype={tl_dtype(d)}" if (d.is_int and d.bits < 32) else ""
        expr = f"tl.{kind}({x}, axis={axis}{r}{extra})"
    else:
        base = "_fly_max" if kind == "cummax" else "_fly_min"
        name = _combine(cx, base + ("_nan" if d.is_float else ""))
        expr = f"tl.associative_scan({x}, {axis}, {name}{r})"
    cx.define(op.results[0], expr, loc=op.loc)


# -- sorting -------------------------------------------------------------------------------------------


def _sort_key(cx: Lowering, x: str, d: dt.DType, loc) -> str:
    """Emit an int32 key whose signed order is FlyDSL's order of ``x`` (NaN highest, -0 == +0)."""
    if d.bits > 32:
        raise LoweringError(
            f"the {BACKEND} backend sorts 8- to 32-bit values; {d} keys do not fit beside the index"
        )
    if not d.is_float:
        key = cx.tmp("key")
        cx.emit(f"{key} = {x}.to(tl.int32)", loc)
        return key
    w = d.bits
    ity = {8: "tl.int8", 16: "tl.int16", 32: "tl.int32"}[w]
    bits = cx.tmp("bits")
    src = x if not d.storage_only else cx.convert(x, d, dt.fp32)
    if d.storage_only:
        ity, w = "tl.int32", 32
    cx.emit(f"{bits} = {src}.to({ity}, bitcast=True).to(tl.int32)", loc)
    mask = (1 << (w - 1)) - 1
    key = cx.tmp("key")
    cx.emit(f"{key} = {bits} ^ (({bits} >> 31) & {mask})", loc)
    # NaN and zero tests by value
    cx.emit(f"{key} = tl.where({src} == 0, 0, tl.where({src} != {src}, {mask}, {key}))", loc)
    return key


def _sort_common(cx: Lowering, op: Op, k: int | None, descending: bool):
    """Stable sort / top-k by packing (key << 32) | index into int64 and sorting that."""
    a = op.operand("x")
    axis = op.attrs["axis"]
    shape = cx.ir_shape(a)
    rank = len(shape)
    d = a.type.dtype
    loc = op.loc
    x = cx.full(a)
    last = rank - 1
    if axis != last:  # Triton sorts along the last axis: move `axis` there and back
        order = [i for i in range(rank) if i != axis] + [axis]
        inv = [order.index(i) for i in range(rank)]
        xs = cx.tmp("x")
        cx.emit(f"{xs} = tl.permute({x}, {shape_str(order)})", loc)
        x = xs
        pshape = tuple(shape[i] for i in order)
    else:
        pshape = shape
        if not x.isidentifier():
            xs = cx.tmp("x")
            cx.emit(f"{xs} = {x}", loc)
            x = xs
    key = _sort_key(cx, x, d, loc)
    if descending:
        cx.emit(f"{key} = ~{key}", loc)  # reverses the order; ties keep ascending indices
    packed = cx.tmp("packed")
    cx.emit(
        f"{packed} = ({key}.to(tl.int64) << 32) | {_index_along(pshape, last)}.to(tl.int64)", loc
    )
    if k is None:
        cx.emit(f"{packed} = tl.sort({packed}, dim={last})", loc)
    else:
        # sort_impl, not tl.topk(descending=False): the keyword is Triton 3.9's, while
        # sort_impl(k=, descending=) is what tl.topk calls in 3.6 through 3.9 alike
        cx.emit(
            f"{packed} = tl.standard.sort_impl({packed}, k={k}, dim={last}, descending=False)", loc
        )
    idx = cx.tmp("idx")
    cx.emit(f"{idx} = ({packed} & 0xFFFFFFFF).to(tl.int32)", loc)
    vals = f"tl.gather({x}, {idx}, {last})"
    rv, ri = op.results
    if axis != last:
        vals = f"tl.permute({vals}, {shape_str(inv)})"
        idx = f"tl.permute({idx}, {shape_str(inv)})"
    cx.define(rv, vals, loc=loc)
    cx.define(ri, idx, loc=loc)


@lower("sort")
def _sort(cx: Lowering, op: Op):
    _sort_common(cx, op, None, bool(op.attrs["descending"]))


@lower("topk")
def _topk(cx: Lowering, op: Op):
    _sort_common(cx, op, op.attrs["k"], bool(op.attrs["largest"]))


@lower("histogram")
def _histogram(cx: Lowering, op: Op):
    # tl.histogram drops masked-off and out-of-range values, as the FlyIR op defines.
    args = [cx.full(op.operand("values")), str(op.attrs["num_bins"])]
    mask = op.operand("mask")
    if mask is not None:
        args.append(f"mask={cx.full(mask)}")
    cx.define(op.results[0], f"tl.histogram({', '.join(args)})", loc=op.loc)
