"""Mask elimination: prove bounds masks away, or make them uniform.

A view's bounds mask is a ``range_mask(start, extent)``: element ``i`` along
an axis of length ``T`` is in bounds when ``start + i < extent``. Given the
divisibility facts:

* in a loop ``for k in range(lo, hi, step)`` with ``start = k`` and
  ``extent = hi``, where ``lo``, ``step`` and ``hi`` are all multiples of
  ``T``, ``k + T <= hi`` always holds: the mask is all true and goes away
  (the K loop of a GEMM whose K divides the tile);
* with constants, ``start + T <= extent`` is decided outright;
* when both ``start`` and ``extent`` are multiples of ``T``, a tile is
  either wholly in or wholly out, so the mask becomes the scalar test
  ``start < extent`` broadcast: uniform, which keeps loads vectorized.
"""

from __future__ import annotations

from ..ir.core import Block, Function, Op
from .facts import Facts
from .fold import const_value


def _strip(v, facts: Facts):
    """``(x // c) * c`` is ``x`` when ``c`` divides ``x`` (a tile index times its size)."""
    op = v.owner
    if isinstance(op, Op) and op.name == "mul":
        a, c = op.operand("lhs"), op.operand("rhs")
        cv = const_value(c)
        inner = a.owner
        if (
            cv
            and isinstance(inner, Op)
            and inner.name == "intdiv"
            and const_value(inner.operand("rhs")) == cv
        ):
            x = inner.operand("lhs")
            if facts.divisor(x) % cv == 0:
                return x
    return v


def _in_loop_bounds(facts: Facts, op: Op, length: int) -> bool:
    start, extent = op.operand("start"), op.operand("extent")
    start = _strip(start, facts)
    loop = facts.loop_of(start)
    if loop is None:
        return False
    lo, hi, step = loop.operand("lo"), loop.operand("hi"), loop.operand("step")
    if not (
        hi is extent or (const_value(hi) is not None and const_value(hi) == const_value(extent))
    ):
        return False
    return all(facts.divisor(v) % length == 0 for v in (lo, hi, step))


def _rewrite(block: Block, facts: Facts) -> int:
    n = 0
    out: list[Op] = []
    for op in block.ops:
        for r in op.regions:
            n += _rewrite(r, facts)
        if op.name != "range_mask":
            out.append(op)
            continue
        axis, length, shape = op.attrs["axis"], op.attrs["length"], op.attrs["shape"]
        start, extent = op.operand("start"), op.operand("extent")
        uniform = axis < 0 or length == 1
        if _in_loop_bounds(facts, op, length):
            op.name, op.operands = "constant", []
            op.attrs = {"value": True, "dtype": op.results[0].type.dtype, "shape": tuple(shape)}
            n += 1
        elif (
            not uniform
            and facts.divisor(start) % length == 0
            and facts.divisor(extent) % length == 0
        ):
            # Whole tiles only: one scalar test decides the tile.
            op.attrs = {"axis": -1, "length": 1, "shape": tuple(shape)}
            n += 1
        out.append(op)
    block.ops[:] = out
    return n


def eliminate_masks(fn: Function) -> Function:
    _rewrite(fn.body, Facts(fn))
    return fn
