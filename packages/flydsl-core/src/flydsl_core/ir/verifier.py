"""Checks FlyIR invariants: dominance, types and terminators.

Run after tracing and, unless ``FLYDSL_VERIFY=0``, after every pass. A
failure here is a compiler bug or a value that escaped its region (for
example a tile computed inside a loop and used after it without being
carried); the message names the op and the kernel line.
"""

from __future__ import annotations

from ..exc import VerifyError
from . import ops as O
from .core import Block, Function, Op


def verify(fn: Function) -> Function:
    visible: set[int] = {p.value.id for p in fn.params if p.value is not None}
    _verify_block(fn.body, visible, fn, top=True)
    return fn


def _fail(op: Op, msg: str):
    raise VerifyError(f"op '{op.name}': {msg}", loc=op.loc)


def _verify_block(block: Block, visible: set[int], fn: Function, top=False):
    scope = set(visible)
    scope.update(a.id for a in block.args)
    for i, op in enumerate(block.ops):
        d = O.OPS.get(op.name)
        if d is None:
            _fail(op, "is not a FlyIR op")
        for v in op.operands:
            if v.id not in scope:
                _fail(
                    op,
                    "uses a value that is not visible here: it was computed inside a loop or "
                    "branch body and used outside it. Loop-carried and branch results must be "
                    "updated in place (acc += x, or acc.set(x)) on a tile created before the loop",
                )
        try:
            types = d.infer(d.bind([v.type for v in op.operands]), op.attrs)
        except Exception as e:  # the type rule's own message is the useful part
            _fail(op, f"type rule failed: {e}")
        if [r.type for r in op.results] != list(types):
            _fail(
                op, f"result types {[str(r.type) for r in op.results]} != {list(map(str, types))}"
            )
        if len(op.regions) != d.num_regions:
            _fail(op, f"has {len(op.regions)} regions, expects {d.num_regions}")
        if d.terminator and i != len(block.ops) - 1:
            _fail(op, "a terminator must be the last op of its block")
        _verify_regions(op, scope, fn)
        scope.update(r.id for r in op.results)
    term = block.terminator
    if not top and (term is None or not O.OPS[term.name].terminator):
        raise VerifyError(
            "a region block must end with yield or condition",
            loc=block.parent.loc if block.parent else None,
        )


def _expect_yield(op: Op, block: Block, types):
    term = block.terminator
    if term is None or term.name != "yield":
        _fail(op, "region must end with yield")
    got = [v.type for v in term.operand_list("values")]
    if got != list(types):
        _fail(op, f"region yields {list(map(str, got))}, expected {list(map(str, types))}")


def _verify_regions(op: Op, scope: set[int], fn: Function):
    res = [r.type for r in op.results]
    if op.name == "for":
        (body,) = op.regions
        if [a.type for a in body.args[1:]] != res or len(body.args) != len(res) + 1:
            _fail(op, "loop block arguments must be the induction variable and the carried values")
        _verify_block(body, scope, fn)
        _expect_yield(op, body, res)
    elif op.name == "if":
        for r in op.regions:
            if r.args:
                _fail(op, "if regions take no arguments")
            _verify_block(r, scope, fn)
            _expect_yield(op, r, res)
    elif op.name == "while":
        before, body = op.regions
        for r in (before, body):
            if [a.type for a in r.args] != res:
                _fail(op, "while regions take the carried values as arguments")
            _verify_block(r, scope, fn)
        if before.terminator is None or before.terminator.name != "condition":
            _fail(op, "the condition region of a while must end with condition")
        _expect_yield(op, body, res)
