"""Common-subexpression elimination of pure ops.

Two pure ops (``OpDef.pure``: no memory effects, no regions, not a
terminator) with the same name, operands and attrs compute the same value;
the later one is replaced by the earlier. Scoping follows the blocks: a value
found in an enclosing block may be reused inside a nested one, never the
other way around. The tracer repeats index arithmetic freely (every view
recomputes ``pid * BLOCK``), and this keeps the generated code tidy.
"""

from __future__ import annotations

from ..ir.core import Block, Function, Value


def _key(op):
    try:
        attrs = tuple(sorted((k, _hashable(v)) for k, v in op.attrs.items()))
        return (op.name, tuple(v.id for v in op.operands), attrs)
    except TypeError:
        return None


def _hashable(v):
    hash(v)
    if isinstance(v, float):
        return (v, repr(v))  # 0.0 == -0.0, but they are different constants
    return v


def _cse_block(block: Block, seen: dict, subst: dict[int, Value]):
    local = dict(seen)
    keep = []
    for op in block.ops:
        op.operands = [subst.get(v.id, v) for v in op.operands]
        for r in op.regions:
            _cse_block(r, local, subst)
        if op.regions or not op.opdef.pure:
            keep.append(op)
            continue
        k = _key(op)
        prev = local.get(k) if k is not None else None
        if prev is not None:
            for a, b in zip(op.results, prev.results):
                subst[a.id] = b
            continue
        if k is not None:
            local[k] = op
        keep.append(op)
    block.ops[:] = keep


def cse(fn: Function) -> Function:
    _cse_block(fn.body, {}, {})
    return fn
