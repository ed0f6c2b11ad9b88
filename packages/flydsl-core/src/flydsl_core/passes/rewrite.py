"""Small rewriting utilities shared by the passes."""

from __future__ import annotations

import dataclasses

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


def clone_function(fn: Function) -> Function:
    """A copy of ``fn`` with fresh values and ops, for a rewrite that must not touch ``fn``."""
    vmap: dict[int, Value] = {}
    params = []
    for p in fn.params:
        value = None
        if p.value is not None:
            value = vmap[p.value.id] = Value(p.value.type, name=p.value.name)
        params.append(dataclasses.replace(p, value=value, facts=dict(p.facts)))

    def block(b: Block) -> Block:
        nb = Block([a.type for a in b.args])
        for a, na in zip(b.args, nb.args):
            vmap[a.id] = na
        for op in b.ops:
            regions = [block(r) for r in op.regions]
            new = Op(
                op.name,
                [vmap[v.id] for v in op.operands],
                dict(op.attrs),
                [r.type for r in op.results],
                regions,
                op.loc,
            )
            for r, nr in zip(op.results, new.results):
                vmap[r.id] = nr
            nb.append(new)
        return nb

    return Function(fn.name, params, block(fn.body), dict(fn.constexprs), fn.loc)
