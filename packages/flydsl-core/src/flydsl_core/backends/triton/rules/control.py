"""Triton rules for structured control flow: ``for``, ``if`` and ``while``.

A loop's carried values (and an ``if``'s results) are Python variables named
after the loop's block arguments (the ``if``'s results): assigned before the
loop from the initial values and at the end of each region from what it
yields. ``carried`` says which operand goes to which name, for these rules
and for the emitter, which computes a value whose only use is to be carried
straight into its name.
"""

from __future__ import annotations

from ....ir.core import Op, Value
from ..emitter import CARRIED, TV, Lowering, lower


def carried(cx: Lowering, op: Op) -> list[tuple[Value, str]] | None:
    """The ``(value, name)`` assignments op ``op`` stands for: a ``for``'s or ``while``'s
    initial values, or a region terminator's yielded values; None for other ops."""
    if op.name == "for":
        return list(zip(op.operand_list("init"), _names(cx, op.regions[0].args[1:])))
    if op.name == "while":
        return list(zip(op.operand_list("init"), _names(cx, op.regions[0].args)))
    if op.name == "yield" and op.block is not None and op.block.parent is not None:
        parent = op.block.parent
        if parent.name == "for":
            names = _names(cx, parent.regions[0].args[1:])
        elif parent.name == "while":
            names = _names(cx, parent.regions[0].args)
        else:
            names = _names(cx, parent.results)
        return list(zip(op.operand_list("values"), names))
    return None


for _name in ("for", "while", "yield"):
    CARRIED[_name] = carried


def _names(cx: Lowering, values) -> list[str]:
    return [cx.name_of(v) for v in values]


def _assign(cx: Lowering, pairs: list[tuple[Value, str]], loc):
    """``name = value`` for carried values, at their full IR shapes (a parallel assignment
    where one name is read by another's value)."""
    pairs = [(n, cx.full(v)) for v, n in pairs]
    pairs = [(n, e) for n, e in pairs if n != e]
    if not pairs:
        return
    rhs_names = {e for _, e in pairs}
    if len(pairs) > 1 and any(n in rhs_names for n, _ in pairs):
        cx.emit(f"{', '.join(n for n, _ in pairs)} = {', '.join(e for _, e in pairs)}", loc)
        return
    for n, e in pairs:
        cx.emit(f"{n} = {e}", loc)


def _bind_all(cx: Lowering, values, names):
    for v, n in zip(values, names):
        cx.bind(v, TV(n, cx.ir_shape(v), v.type.dtype))


@lower("for")
def _for(cx: Lowering, op: Op):
    lo, hi, st = op.operand("lo"), op.operand("hi"), op.operand("step")
    (body,) = op.regions
    iv, *args = body.args
    loc = op.loc
    names = _names(cx, args)
    _assign(cx, carried(cx, op), loc)
    _bind_all(cx, args, names)
    b = [cx.ref(v) for v in (lo, hi, st)]
    kw = []
    if "stages" in op.attrs:
        kw.append(f"num_stages={int(op.attrs['stages'])}")
    if "unroll" in op.attrs:
        kw.append(f"loop_unroll_factor={int(op.attrs['unroll'])}")
    sv = cx.get(st)
    bounds = b[:2] if (sv.literal and sv.value == 1 and not kw) else b
    it = f"tl.range({', '.join(bounds + kw)})" if kw else f"range({', '.join(bounds)})"
    ivn = cx.name_of(iv)
    cx.bind(iv, TV(ivn, (), iv.type.dtype))
    cx.emit(f"for {ivn} in {it}:", loc)
    cx.indent += 1
    start = len(cx.lines)
    for a, n in zip(args, names):
        # Triton's AxisInfo does not see through the back edge: state what holds throughout.
        d = cx.facts.carried_divisor(a)
        if d >= 2:
            cx.emit(f"{n} = tl.multiple_of({n}, {d})", loc)
    cx.block(body)
    _assign(cx, carried(cx, body.terminator), loc)
    if len(cx.lines) == start:
        cx.emit("pass")
    cx.indent -= 1
    cx.forget_loc()
    _bind_all(cx, op.results, names)


@lower("if")
def _if(cx: Lowering, op: Op):
    then, other = op.regions
    loc = op.loc
    names = _names(cx, op.results)
    cx.emit(f"if {cx.ref(op.operand('cond'))}:", loc)
    for i, region in enumerate((then, other)):
        if i == 1:
            if not region.ops[:-1] and not names:
                break
            cx.emit("else:")
        cx.indent += 1
        start = len(cx.lines)
        cx.block(region)
        _assign(cx, carried(cx, region.terminator), loc)
        if len(cx.lines) == start:
            cx.emit("pass")
        cx.indent -= 1
        cx.forget_loc()
    _bind_all(cx, op.results, names)


@lower("while")
def _while(cx: Lowering, op: Op):
    # The condition is computed before the loop and again at the end of the body;
    # the second copy's temporaries get fresh names so Triton does not carry them.
    before, body = op.regions
    loc = op.loc
    names = _names(cx, before.args)
    _assign(cx, carried(cx, op), loc)
    for region in (before, body):
        _bind_all(cx, region.args, names)
    cond = before.terminator.operand("cond")
    cond_var = cx.tmp("cond")
    cx.block(before)
    cx.emit(f"{cond_var} = {cx.full(cond)}", loc)
    cx.emit(f"while {cond_var}:", loc)
    cx.indent += 1
    cx.block(body)
    _assign(cx, carried(cx, body.terminator), loc)
    for o in before.walk():
        for r in o.results:
            cx.fresh[r.id] = cx.fresh.get(r.id, 0) + 1
        for rg in o.regions:
            for a in rg.args:
                cx.fresh[a.id] = cx.fresh.get(a.id, 0) + 1
    cx.block(before)
    cx.emit(f"{cond_var} = {cx.full(cond)}", loc)
    cx.indent -= 1
    cx.forget_loc()
    _bind_all(cx, op.results, names)
