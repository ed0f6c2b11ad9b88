"""Constexpr specialization: parameters whose value the specialization knows become constants.

Tracing keeps every size and stride as a parameter, so one trace serves any
call. This pass substitutes the ones the specialization key pins down (a
stride of 1, a size listed in ``static_dims``) with ``constant`` ops, which
lets folding and mask elimination see through them.
"""

from __future__ import annotations

from ..ir.core import Function
from ..ir.types import TileType
from .rewrite import make_constant, replace_uses


def specialize(fn: Function) -> Function:
    new_consts = []
    for p in fn.params:
        if p.value is None or "value" not in p.facts or not isinstance(p.value.type, TileType):
            continue
        c = make_constant(p.facts["value"], p.value.type, loc=fn.loc)
        c.block = fn.body
        c.results[0].block = fn.body
        if replace_uses(fn, p.value, c.result):
            new_consts.append(c)
    fn.body.ops[:0] = new_consts
    return fn
