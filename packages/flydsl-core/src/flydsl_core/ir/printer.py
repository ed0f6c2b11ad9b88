"""The readable text form of FlyIR (``print(fn)``).

Values are numbered in order of appearance, so two traces of one kernel
print the same text, which makes the printed IR usable in golden tests and
as part of a cache key.
"""

from __future__ import annotations

import os

from .core import Block, Function, Op, Value


class _Namer:
    def __init__(self):
        self.names: dict[int, str] = {}

    def __call__(self, v: Value) -> str:
        name = self.names.get(v.id)
        if name is None:
            name = f"%{len(self.names)}"
            self.names[v.id] = name
        return name


def _fmt_attr(v) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return str(v)


def _print_op(op: Op, name: _Namer, out: list[str], indent: int, locs: bool):
    pad = "  " * indent
    lhs = ", ".join(name(r) for r in op.results)
    lhs = f"{lhs} = " if lhs else ""
    operands = ", ".join(name(v) for v in op.operands)
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
        _print_block(r, name, out, indent + 1, locs)
    if op.regions:
        out.append(f"{pad}}}")


def _print_block(block: Block, name: _Namer, out: list[str], indent: int, locs: bool):
    if block.args:
        args = ", ".join(f"{name(a)}: {a.type}" for a in block.args)
        out.append(f"{'  ' * indent}^({args}):")
    for op in block.ops:
        _print_op(op, name, out, indent, locs)


def print_function(fn: Function, *, locs: bool = False) -> str:
    name = _Namer()
    params = []
    for p in fn.params:
        if p.value is None:
            continue
        facts = ", ".join(f"{k}={v}" for k, v in sorted(p.facts.items()))
        facts = f" {{{facts}}}" if facts else ""
        params.append(f"{name(p.value)} {p.name}: {p.value.type}{facts}")
    out = [f"kernel @{fn.name}("]
    out += [f"    {p}," for p in params]
    consts = ", ".join(f"{k}={v!r}" for k, v in sorted(fn.constexprs.items()))
    out.append(f") [{consts}] {{" if consts else ") {")
    _print_block(fn.body, name, out, 1, locs)
    out.append("}")
    return "\n".join(out)
