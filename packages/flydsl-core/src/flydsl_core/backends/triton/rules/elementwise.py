"""Triton rules for leaves, elementwise arithmetic and math, casts, hints and ``where``."""

from __future__ import annotations

from .... import dtypes as dt
from ....ir.core import Op
from ..emitter import TV, Lowering, broadcast_shape, literal, lower, tl_dtype

# -- leaves ---------------------------------------------------------------------------------------


@lower("constant")
def _constant(cx: Lowering, op: Op):
    r = op.results[0]
    d = r.type.dtype
    cx.bind(r, TV(literal(op.attrs["value"], d), (), d, literal=True, value=op.attrs["value"]))


@lower("arange")
def _arange(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.arange({op.attrs['start']}, {op.attrs['end']})", loc=op.loc)


@lower("program_id")
def _program_id(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.program_id({op.attrs['axis']})", loc=op.loc)


@lower("num_programs")
def _num_programs(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.num_programs({op.attrs['axis']})", loc=op.loc)


# -- arithmetic -------------------------------------------------------------------------------------

_BINOP = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "intdiv": "//",  # Triton's // on integers is sdiv/udiv: truncation, like FlyIR's
    "mod": "%",  # srem / frem: C fmod, like FlyIR's
    "truediv": "/",
    "and": "&",
    "or": "|",
    "xor": "^",
    "shl": "<<",
    "shr": ">>",  # arithmetic for signed, logical for unsigned: as torch
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
}


def _binary_operands(cx: Lowering, op: Op) -> tuple[str, str, tuple]:
    a, b = op.operand("lhs"), op.operand("rhs")
    ta, tb = cx.get(a), cx.get(b)
    # Two literals would fold in Python, untyped: make the left one a tensor.
    ea = cx.scalar_tensor(ta) if ta.literal and tb.literal else cx.ref(a)
    return ea, cx.ref(b), broadcast_shape(ta.shape, tb.shape)


@lower(*_BINOP)
def _binary(cx: Lowering, op: Op):
    a, b, shape = _binary_operands(cx, op)
    d = op.operand("lhs").type.dtype
    expr = f"{a} {_BINOP[op.name]} {b}"
    # Triton computes / and % of 16-bit floats in fp32: round back, as torch does.
    if op.name in ("truediv", "mod") and d.is_float and d.bits < 32:
        expr = cx.convert(f"({expr})", dt.fp32, d)
    cx.define(op.results[0], expr, shape, op.loc)


@lower("maximum", "minimum")
def _minmax(cx: Lowering, op: Op):
    a, b, shape = _binary_operands(cx, op)
    d = op.operand("lhs").type.dtype
    f = "tl.maximum" if op.name == "maximum" else "tl.minimum"
    # FlyIR's max/min propagate NaN
    nan = ", propagate_nan=tl.PropagateNan.ALL" if d.is_float else ""
    cx.define(op.results[0], f"{f}({a}, {b}{nan})", shape, op.loc)


def lower_pow(cx: Lowering, op: Op, fn: str):
    """``fn(a, b)`` computing ``pow``, in fp32 for 16-bit floats."""
    x, y = op.operand("lhs"), op.operand("rhs")
    shape = broadcast_shape(cx.get(x).shape, cx.get(y).shape)
    d = x.type.dtype
    a, b = cx.tensor(x), cx.tensor(y)  # function arguments: tensors, not literals
    if d.bits < 32:
        a, b = cx.convert(a, d, dt.fp32), cx.convert(b, d, dt.fp32)
    expr = f"{fn}({a}, {b})"
    if d.bits < 32:
        expr = cx.convert(expr, dt.fp32, d)
    cx.define(op.results[0], expr, shape, op.loc)


@lower("pow")
def _pow(cx: Lowering, op: Op):
    lower_pow(cx, op, cx.libdevice("pow"))


_UNARY = {
    "exp": "tl.exp",
    "exp2": "tl.exp2",
    "log": "tl.log",
    "log2": "tl.log2",
    "sqrt": "tl.sqrt",
    "rsqrt": "tl.rsqrt",
    "erf": "tl.erf",
    "sigmoid": "tl.sigmoid",
    "sin": "tl.sin",
    "cos": "tl.cos",
    "floor": "tl.floor",
    "ceil": "tl.ceil",
}


def lower_unary(cx: Lowering, op: Op, fn: str):
    """``fn(x)``; Triton's math functions take fp32/fp64, so 16-bit floats compute in fp32."""
    a = op.operand("x")
    tv = cx.get(a)
    x = cx.tensor(a)
    d = a.type.dtype
    if d.bits < 32:
        x = f"{x}.to(tl.float32)"
    expr = f"{fn}({x})"
    if d.bits < 32:
        expr = cx.convert(expr, dt.fp32, d)
    cx.define(op.results[0], expr, tv.shape, op.loc)


@lower(*_UNARY)
def _unary_float(cx: Lowering, op: Op):
    lower_unary(cx, op, _UNARY[op.name])


@lower("tanh")
def _tanh(cx: Lowering, op: Op):
    lower_unary(cx, op, cx.libdevice("tanh"))


@lower("neg")
def _neg(cx: Lowering, op: Op):
    a = op.operand("x")
    cx.define(op.results[0], f"-{cx.tensor(a)}", cx.get(a).shape, op.loc)


@lower("abs")
def _abs(cx: Lowering, op: Op):
    a = op.operand("x")
    cx.define(op.results[0], f"tl.abs({cx.tensor(a)})", cx.get(a).shape, op.loc)


@lower("invert")
def _invert(cx: Lowering, op: Op):
    a = op.operand("x")
    cx.define(op.results[0], f"~{cx.tensor(a)}", cx.get(a).shape, op.loc)


# -- conversions and facts ---------------------------------------------------------------------------


@lower("hint")
def _hint(cx: Lowering, op: Op):
    # tl.multiple_of / tl.max_contiguous set AxisInfo divisibility and contiguity, which
    # decide vector widths where Triton's own analysis cannot see them (xor swizzles).
    a = op.operand("x")
    c, m = op.attrs["contiguous"], op.attrs["multiple_of"]
    if a.type.shape == ():
        expr = cx.full(a)
        if m[0] > 1:
            expr = f"tl.multiple_of({expr}, {m[0]})"
        cx.define(op.results[0], expr, (), op.loc)
        return
    expr = cx.full(a)
    if any(x > 1 for x in m):
        expr = f"tl.multiple_of({expr}, {list(m)})"
    if any(x > 1 for x in c):
        expr = f"tl.max_contiguous({expr}, {list(c)})"
    cx.define(op.results[0], expr, loc=op.loc)


@lower("cast")
def _cast(cx: Lowering, op: Op):
    a = op.operand("x")
    tv = cx.get(a)
    expr = cx.convert(cx.tensor(a), a.type.dtype, op.attrs["dtype"])
    cx.define(op.results[0], expr, tv.shape, op.loc)


@lower("bitcast")
def _bitcast(cx: Lowering, op: Op):
    a = op.operand("x")
    tv = cx.get(a)
    to = op.attrs["dtype"]
    cx.define(op.results[0], f"{cx.tensor(a)}.to({tl_dtype(to)}, bitcast=True)", tv.shape, op.loc)


@lower("where")
def _where(cx: Lowering, op: Op):
    c, a, b = op.operand("cond"), op.operand("x"), op.operand("y")
    tc, ta, tb = cx.get(c), cx.get(a), cx.get(b)
    ea = cx.scalar_tensor(ta) if ta.literal and tb.literal else cx.ref(a)
    shape = broadcast_shape(tc.shape, ta.shape, tb.shape)
    cx.define(op.results[0], f"tl.where({cx.ref(c)}, {ea}, {cx.ref(b)})", shape, op.loc)
