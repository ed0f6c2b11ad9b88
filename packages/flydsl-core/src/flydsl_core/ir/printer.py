"""The readable text form of FlyIR (``print(fn)``).

Values are numbered in order of appearance, so two traces of one kernel
print the same text, which makes the printed IR usable in golden tests and
as part of a cache key. ``value_numbers`` is that numbering; the Triton
lowering names its values after it (``%7`` is ``v7``). Optional operands
print with their slot name (``mask=%20``), the others by position.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .ops import OPS

if TYPE_CHECKING:  # annotations only: core imports this module (``Function.__str__``)
    from .core import Block, Function, Op


def value_numbers(fn: Function) -> dict[int, int]:
    """Value id -> its number ``N`` in the printed form (``%N``): parameters, then every
    op's results, operands and regions (block arguments first) in order."""
    nums: dict[int, int] = {}

    def see(v):
        if v.id not in nums:
            nums[v.id] = len(nums)

    def block(b: Block):
        for a in b.args:
            see(a)
        for op in b.ops:
            for r in op.results:
                see(r)
            for v in op.operands:
                see(v)
            for r in op.regions:
                block(r)

    for p in fn.params:
        if p.value is not None:
            see(p.value)
    block(fn.body)
    return nums


def _fmt_attr(v) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return str(v)


def _operand_labels(op: Op) -> list[str]:
    """``"mask="`` for an operand in an optional slot, ``""`` for the others."""
    d = OPS.get(op.name)
    labels = []
    for i in range(len(op.operands)):
        s = d.slots[i] if d is not None and i < len(d.slots) else None
        labels.append(f"{s.name}=" if s is not None and s.kind == "optional" else "")
    return labels


def _print_op(op: Op, nums: dict[int, int], out: list[str], indent: int, locs: bool):
    pad = "  " * indent
    lhs = ", ".join(f"%{nums[r.id]}" for r in op.results)
    lhs = f"{lhs} = " if lhs else ""
    operands = ", ".join(
        f"{label}%{nums[v.id]}" for label, v in zip(_operand_labels(op), op.operands)
    )
    attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(op.attrs.items()))
    attrs = f" {{{attrs}}}" if attrs else ""
    types = ", ".join(str(r.type) for r in op.results)
    types = f" : {types}" if types else ""
    line = f"{pad}{lhs}{op.name} {operands}".rstrip() + f"{attrs}{types}"
    if locs and op.loc:
        line += f"  # {os.path.basename(op.loc.file)}:{op.loc.line}"
    if op.regions:
        line += " {"
    out.append(line)
    for i, r in enumerate(op.regions):
        if i:
            out.append(f"{pad}}} {{")
        _print_block(r, nums, out, indent + 1, locs)
    if op.regions:
        out.append(f"{pad}}}")


def _print_block(block: Block, nums: dict[int, int], out: list[str], indent: int, locs: bool):
    if block.args:
        args = ", ".join(f"%{nums[a.id]}: {a.type}" for a in block.args)
        out.append(f"{'  ' * indent}^({args}):")
    for op in block.ops:
        _print_op(op, nums, out, indent, locs)


def print_function(fn: Function, *, locs: bool = False) -> str:
    nums = value_numbers(fn)
    params = []
    for p in fn.params:
        if p.value is None:
            continue
        facts = ", ".join(f"{k}={v}" for k, v in sorted(p.facts.items()))
        facts = f" {{{facts}}}" if facts else ""
        params.append(f"%{nums[p.value.id]} {p.name}: {p.value.type}{facts}")
    out = [f"kernel @{fn.name}("]
    out += [f"    {p}," for p in params]
    consts = ", ".join(f"{k}={v!r}" for k, v in sorted(fn.constexprs.items()))
    out.append(f") [{consts}] {{" if consts else ") {")
    _print_block(fn.body, nums, out, 1, locs)
    out.append("}")
    return "\n".join(out)
