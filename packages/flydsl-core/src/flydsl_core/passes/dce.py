"""Dead-code elimination: drop ops without effects whose results nobody uses.

Also drops loop-carried values of ``for`` loops that nothing reads: the
carried value, its block argument and its yield operand go together.
"""

from __future__ import annotations

from ..ir import ops as O
from ..ir.core import Block, Function, Op
from .rewrite import use_counts


def _removable(op: Op) -> bool:
    d = O.OPS[op.name]
    if d.effects or d.terminator:
        return False
    return not any(_has_effects(r) for r in op.regions)


def _has_effects(block: Block) -> bool:
    for op in block.walk():
        d = O.OPS[op.name]
        if d.effects and not d.terminator:
            return True
    return False


def _prune_for(op: Op, counts) -> bool:
    """Remove carried values of a loop that are unused after it and in it (but by their own yield)."""
    (body,) = op.regions
    y = body.terminator
    changed = False
    for i in reversed(range(len(op.results))):
        arg = body.args[i + 1]
        res = op.results[i]
        # the block arg is used only by the yield (or not at all) and the result is dead
        arg_uses = counts.get(arg.id, 0)
        passthrough = arg_uses == 1 and y.operands[i] is arg
        if counts.get(res.id, 0) == 0 and (arg_uses == 0 or passthrough):
            del op.results[i]
            del body.args[i + 1]
            del y.operands[i]
            del op.operands[3 + i]
            changed = True
    for i, r in enumerate(op.results):
        r.index = i
    for i, a in enumerate(body.args):
        a.index = i
    return changed


def dce(fn: Function) -> Function:
    changed = True
    while changed:
        changed = False
        counts = use_counts(fn)
        for block in _all_blocks(fn.body):
            keep = []
            for op in block.ops:
                if _removable(op) and all(counts.get(r.id, 0) == 0 for r in op.results):
                    changed = True
                    continue
                if op.name == "for" and _prune_for(op, counts):
                    changed = True
                keep.append(op)
            block.ops[:] = keep
    return fn


def _all_blocks(block: Block):
    yield block
    for op in block.ops:
        for r in op.regions:
            yield from _all_blocks(r)
