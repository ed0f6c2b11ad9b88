"""Constant folding and algebraic simplification.

One forward sweep per block: operands are rewritten through a substitution
map, then each op is folded if its operands allow. Because FlyIR is SSA and
blocks are ordered, one sweep folds whole chains. Integer arithmetic is
folded exactly (two's-complement wrap at the dtype's width, C division);
floats fold only in fp32/fp64, where Python's doubles round correctly.
"""

from __future__ import annotations

import math
import struct

from .. import dtypes as dt
from ..ir.core import Block, Function, Op, Value
from ..ir.types import TileType
from .rewrite import make_constant


def const_value(v: Value):
    """The splat value of ``v`` if a ``constant`` op defines it, else None."""
    op = v.owner
    if isinstance(op, Op) and op.name == "constant":
        return op.attrs["value"]
    return None


def is_const(v: Value) -> bool:
    op = v.owner
    return isinstance(op, Op) and op.name == "constant"


def _wrap(x: int, d: dt.DType) -> int:
    if d.is_bool:
        return int(bool(x))
    m = 1 << d.bits
    x &= m - 1
    if d.kind == "int" and x >= m >> 1:
        x -= m
    return x


def _round(x: float, d: dt.DType) -> float:
    if d == dt.fp32:
        return struct.unpack("f", struct.pack("f", x))[0]
    return x


def _trunc_div(a: int, b: int) -> int:
    """``a / b`` rounded toward zero: FlyIR's ``intdiv`` (C's and Triton's), not Python's ``//``."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_INT_BIN = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "intdiv": lambda a, b: _trunc_div(a, b),
    "mod": lambda a, b: a - _trunc_div(a, b) * b,
    "maximum": max,
    "minimum": min,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b,
    "shr": lambda a, b: a >> b,
}
_FLOAT_BIN = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b,
}
_CMP = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _fold_value(op: Op):
    """A Python value for the op's (splat) result, or None."""
    vals = [const_value(v) for v in op.operands]
    if any(v is None for v in vals) or not op.results:
        return None
    t: TileType = op.results[0].type
    d = op.operands[0].type.dtype if op.operands else None
    try:
        if d is not None and d.is_float and op.name not in ("broadcast", "reshape"):
            # A float constant holds the Python value it was written with; the backends
            # hold it rounded to its dtype. Fold with the rounded value, and only where
            # Python can round it (fp32, fp64).
            if d not in (dt.fp32, dt.fp64):
                return None
            vals = [_round(float(v), d) for v in vals]
        if op.name in _CMP:
            return bool(_CMP[op.name](*vals))
        if d is not None and (d.is_int or d.is_bool) and op.name in _INT_BIN:
            if op.name in ("intdiv", "mod") and vals[1] == 0:
                return None
            if op.name in ("shl", "shr") and not 0 <= vals[1] < d.bits:
                return None
            return _wrap(_INT_BIN[op.name](*vals), t.dtype)
        if d in (dt.fp32, dt.fp64) and op.name in _FLOAT_BIN:
            if op.name == "truediv" and vals[1] == 0:
                return None
            return _round(_FLOAT_BIN[op.name](*vals), t.dtype)
        if op.name == "neg" and (d.is_int or d in (dt.fp32, dt.fp64)):
            return _wrap(-vals[0], d) if d.is_int else -vals[0]
        if op.name == "invert" and (d.is_int or d.is_bool):
            return (not vals[0]) if d.is_bool else _wrap(~vals[0], d)
        if op.name == "cast":
            to = t.dtype
            x = vals[0]
            if to.is_bool:
                return bool(x)
            if to.is_int and (d.is_int or d.is_bool):
                return _wrap(int(x), to)
            if to.is_int and d in (dt.fp32, dt.fp64) and math.isfinite(x):
                return (
                    _wrap(int(x), to)
                    if -(2 ** (to.bits - 1)) <= int(x) < 2 ** (to.bits - 1)
                    else None
                )
            if to in (dt.fp32, dt.fp64) and (d.is_int or d.is_bool or d in (dt.fp32, dt.fp64)):
                return _round(float(x), to)
            return None
        if op.name in ("broadcast", "reshape"):
            return vals[0]
        if op.name == "range_mask":
            start, ext = vals
            axis, length = op.attrs["axis"], op.attrs["length"]
            if axis < 0 or length == 1:
                return bool(start < ext)
            if start + length <= ext:
                return True
            if start >= ext:
                return False
            return None
    except (OverflowError, ValueError, ZeroDivisionError):
        return None
    return None


def _identity(op: Op) -> Value | None:
    """An existing value equal to the op's result (x + 0 -> x), or None."""
    if len(op.operands) != 2 and op.name != "where":
        return None
    if op.name == "where":
        c, x, y = op.args.cond, op.args.x, op.args.y
        if const_value(c) is True:
            return x
        if const_value(c) is False:
            return y
        return x if x is y else None
    a, b = op.operands
    ca, cb = const_value(a), const_value(b)
    if op.name == "add":
        return a if cb == 0 and cb is not None else (b if ca == 0 and ca is not None else None)
    if op.name == "sub" and cb == 0 and cb is not None:
        return a
    if op.name == "mul":
        if cb == 1:
            return a
        if ca == 1:
            return b
    if op.name == "intdiv" and cb == 1:
        return a
    if op.name == "and":
        if cb is True:
            return a
        if ca is True:
            return b
        if a is b:
            return a
    if op.name == "or":
        if cb is False:
            return a
        if ca is False:
            return b
    return None


def _absorbing(op: Op):
    """A constant result forced by one operand (x * 0 for ints, x & false)."""
    if len(op.operands) != 2:
        return None
    ca, cb = (const_value(v) for v in op.operands)
    d = op.operands[0].type.dtype
    if (
        op.name == "mul"
        and d.is_int
        and ((ca == 0 and ca is not None) or (cb == 0 and cb is not None))
    ):
        return 0
    if op.name == "and" and (ca is False or cb is False):
        return False
    if op.name == "or" and (ca is True or cb is True):
        return True
    return None


def _drop_true_mask(op: Op):
    """An op whose optional ``mask`` folded to all-true needs no mask (nor a load its ``other``)."""
    if any(s.name == "mask" and s.kind == "optional" for s in op.opdef.slots):
        m = op.operand("mask")
        if m is not None and const_value(m) is True:
            op.drop_operand("mask")


def _fold_block(block: Block, subst: dict[int, Value]) -> bool:
    changed = False
    out: list[Op] = []
    for op in block.ops:
        op.operands = [subst.get(v.id, v) for v in op.operands]
        if op.name == "if" and is_const(op.operand("cond")):
            taken = op.regions[0 if const_value(op.operand("cond")) else 1]
            changed |= _fold_block(taken, subst)
            y = taken.ops.pop()
            for o in taken.ops:
                o.block = block
                for r in o.results:
                    r.block = block
            out.extend(taken.ops)
            for r, v in zip(op.results, y.operand_list("values")):
                subst[r.id] = subst.get(v.id, v)
            changed = True
            continue
        for r in op.regions:
            changed |= _fold_block(r, subst)
        _drop_true_mask(op)
        if not op.opdef.pure or op.name == "constant" or op.regions:
            out.append(op)
            continue
        same = _identity(op)
        if same is not None and same.type == op.results[0].type:
            subst[op.results[0].id] = same
            changed = True
            continue
        value = _fold_value(op)
        if value is None:
            value = _absorbing(op)
        if value is not None and len(op.results) == 1:
            t = op.results[0].type
            if t.dtype.is_bool:
                value = bool(value)
            c = make_constant(value, t, op.loc)
            c.block = block
            c.results[0].block = block
            subst[op.results[0].id] = c.results[0]
            out.append(c)
            changed = True
            continue
        out.append(op)
    block.ops[:] = out
    return changed


def fold(fn: Function) -> Function:
    subst: dict[int, Value] = {}
    while _fold_block(fn.body, subst):
        pass
    return fn
