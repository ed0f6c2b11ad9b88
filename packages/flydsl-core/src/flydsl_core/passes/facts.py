"""Divisibility facts about integer scalars.

``divisor(v)`` is the largest power of two known to divide ``v`` (with 2**30
standing for "0 / unbounded"). Facts come from the specialization (a size
or stride divisible by 16), from constants and from arithmetic: a sum is
divisible by the gcd of its terms' divisors, a product by their product. A
loop's induction variable is divisible by the gcd of its start and step.
This is what Triton calls AxisInfo divisibility, restricted to scalars,
which is all mask elimination needs.
"""

from __future__ import annotations

import math

from ..ir.core import Function, Op, Value

UNBOUNDED = 1 << 30


def _pow2_divisor(c: int) -> int:
    if c == 0:
        return UNBOUNDED
    return min(UNBOUNDED, c & -c)


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
            return math.gcd(self.divisor(loop.operands[0]), self.divisor(loop.operands[2]))
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
            sh = op.operands[1].owner
            if isinstance(sh, Op) and sh.name == "constant":
                return min(UNBOUNDED, self.divisor(op.operands[0]) << sh.attrs["value"])
            return self.divisor(op.operands[0])
        if op.name == "hint":
            return max(op.attrs["multiple_of"][0], self.divisor(op.operands[0]))
        if op.name == "cast" and op.operands[0].type.dtype.is_int:
            return self.divisor(op.operands[0])
        return 1
