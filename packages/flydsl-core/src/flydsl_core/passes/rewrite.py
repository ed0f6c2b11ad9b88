"""Small rewriting utilities shared by the passes."""

from __future__ import annotations

from ..ir.core import Block, Function, Op, Value


def replace_uses(fn: Function, old: Value, new: Value) -> int:
    """Point every use of ``old`` at ``new``; returns how many uses moved."""
    n = 0
    for op in fn.walk():
        for i, v in enumerate(op.operands):
            if v is old:
                op.operands[i] = new
                n += 1
    return n


def use_counts(fn: Function) -> dict[int, int]:
    counts: dict[int, int] = {}
    for op in fn.walk():
        for v in op.operands:
            counts[v.id] = counts.get(v.id, 0) + 1
    return counts


def insert_before(block: Block, anchor: Op, op: Op) -> Op:
    op.block = block
    for r in op.results:
        r.block = block
    block.ops.insert(block.ops.index(anchor), op)
    return op


def blocks(fn: Function):
    """Every block of the function, outermost first."""
    out = [fn.body]
    for op in fn.walk():
        out.extend(op.regions)
    return out


def make_constant(value, type, loc=None) -> Op:
    return Op(
        "constant", [], {"value": value, "dtype": type.dtype, "shape": type.shape}, [type], loc=loc
    )
