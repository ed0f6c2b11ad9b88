"""Dead-code elimination: drop ops whose results nobody uses and that write no memory.

What an op may do besides computing its results is declared on its ``OpDef``:
an op that reads memory (a load) goes when unused, one that writes (a store,
an atomic) or a terminator stays, and so does a region op whose body writes.

Also drops loop-carried values of ``for`` loops that nothing reads: the
carried value, its block argument and its yield operand go together.
"""

from __future__ import annotations

from ..ir.core import Block, Function, Op
from .rewrite import use_counts


def _removable(op: Op) -> bool:
    d = op.opdef
    if d.writes_memory or d.terminator:
        return False
    return not any(_writes(r) for r in op.regions)


def _writes(block: Block) -> bool:
    return any(op.opdef.writes_memory for op in block.walk())


def _prune_for(op: Op, counts) -> bool:
    """Remove carried values of a loop that are unused after it and in it (but by their own yield)."""
    (body,) = op.regions
    y = body.terminator
    init = op.opdef.index("init")
    changed = False
    for i in reversed(range(len(op.results))):
        arg = body.args[i + 1]
        res = op.results[i]
        # the block arg is used only by the yield (or not at all) and the result is dead
        arg_uses = counts.get(arg.id, 0)
        passthrough = arg_uses == 1 and y.operand_list("values")[i] is arg
        if counts.get(res.id, 0) == 0 and (arg_uses == 0 or passthrough):
            del op.results[i]
            del body.args[i + 1]
            del y.operands[y.opdef.index("values") + i]
            del op.operands[init + i]
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
