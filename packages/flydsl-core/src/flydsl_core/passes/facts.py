"""Divisibility facts about integer scalars.

``divisor(v)`` is the largest power of two known to divide ``v`` (with 2**30
standing for "0 / unbounded"). Facts come from the specialization (a size
or stride divisible by 16), from constants and from arithmetic: a sum is
divisible by the gcd of its terms' divisors, a product by their product. A
loop's induction variable is divisible by the gcd of its start and step.
This is what Triton calls AxisInfo divisibility, restricted to scalars,
which is all mask elimination needs.

``carried_divisor(arg)`` looks through a loop-carried scalar: the divisor
that holds on every iteration (a fixed point from the initial value through
the body's update, ``off += BLOCK``). Triton cannot see that across the
loop's back edge, so its lowering states it with ``tl.multiple_of``.
"""

from __future__ import annotations

import math

from ..ir.core import Block, Function, Op, Value
from ..ir.types import TileType

UNBOUNDED = 1 << 30


def _pow2_divisor(c: int) -> int:
    if c == 0:
        return UNBOUNDED
    return min(UNBOUNDED, c & -c)


def _int_scalar(v: Value) -> bool:
    return isinstance(v.type, TileType) and v.type.shape == () and v.type.dtype.is_int


class Facts:
    def __init__(self, fn: Function):
        self._div: dict[int, int] = {}
        self._loops: dict[int, Op] = {}  # induction variable id -> its for op
        for p in fn.params:
            if p.value is not None and "div" in p.facts:
                self._div[p.value.id] = p.facts["div"]
        for op in fn.walk():
            if op.name == "for":
                self._loops[op.regions[0].args[0].id] = op

    def loop_of(self, v: Value) -> Op | None:
        return self._loops.get(v.id)

    def divisor(self, v: Value) -> int:
        if v.id in self._div:
            return self._div[v.id]
        d = self._compute(v)
        self._div[v.id] = d
        return d

    def _compute(self, v: Value) -> int:
        op = v.owner
        loop = self._loops.get(v.id)
        if loop is not None:
            return math.gcd(self.divisor(loop.operand("lo")), self.divisor(loop.operand("step")))
        if not isinstance(op, Op) or v.type.shape != ():
            return 1
        if op.name == "constant":
            c = op.attrs["value"]
            return _pow2_divisor(int(c)) if isinstance(c, int) and not isinstance(c, bool) else 1
        if op.name in ("add", "sub"):
            return math.gcd(*(self.divisor(x) for x in op.operands))
        if op.name == "mul":
            a, b = (self.divisor(x) for x in op.operands)
            return min(UNBOUNDED, a * b)
        if op.name == "shl":
            sh = op.operand("rhs").owner
            if isinstance(sh, Op) and sh.name == "constant":
                return min(UNBOUNDED, self.divisor(op.operand("lhs")) << sh.attrs["value"])
            return self.divisor(op.operand("lhs"))
        if op.name == "hint":
            return max(op.attrs["multiple_of"][0], self.divisor(op.operand("x")))
        if op.name == "cast" and op.operand("x").type.dtype.is_int:
            return self.divisor(op.operand("x"))
        return 1

    # -- loop-carried scalars ------------------------------------------------------------
    def carried_divisor(self, arg: Value) -> int:
        """The largest power of two dividing loop-carried scalar ``arg`` on every iteration
        (1 where nothing is known, or for anything but an integer scalar of a ``for``)."""
        body = arg.owner
        if not (isinstance(body, Block) and _int_scalar(arg)):
            return 1
        loop = body.parent
        i = body.args.index(arg) - 1  # after the induction variable
        if loop is None or loop.name != "for" or i < 0:
            return 1
        init = loop.operand_list("init")[i]
        update = body.terminator.operand_list("values")[i]
        d = self.divisor(init)
        while d > 1:
            nd = math.gcd(d, self._divisor_assuming(update, {arg.id: d}))
            if nd == d:
                break
            d = nd
        return d if d < UNBOUNDED else 1

    def _divisor_assuming(self, v: Value, assume: dict[int, int]) -> int:
        """``divisor(v)`` through sums and products, with the divisors in ``assume`` taken as given."""
        if v.id in assume:
            return assume[v.id]
        op = v.owner
        if isinstance(op, Op) and op.name in ("add", "sub", "mul") and v.type.shape == ():
            a, b = (self._divisor_assuming(x, assume) for x in op.operands)
            return math.gcd(a, b) if op.name != "mul" else min(UNBOUNDED, a * b)
        return self.divisor(v)
