"""Structured control flow: run-time loops, branches and while loops.

Loops trace their body twice. The first pass discovers which tile handles
the body updates in place; the second traces the real body with those
handles bound to loop-carried block arguments. Python code in a loop body
therefore runs twice at trace time, and must not have side effects that
matter (printing is fine).

    acc = fly.zeros((BM, BN), fly.fp32)
    for k in fly.range(0, K, BK, stages=2):
        acc += fly.dot(a.tile(...).load(), b.tile(...).load())

A loop over compile-time bounds that should be unrolled is ``fly.static_range``.
"""

from __future__ import annotations

import builtins

from .. import dtypes as dt
from ..exc import ControlFlowError, TypeCheckError
from ..ir.core import Block
from ..ir.types import TileType
from ..trace.context import WriteRecorder, current
from .exits import check_region
from .tile import Tile, as_tile, cast


def static_range(start, stop=None, step=1):
    """An unrolled loop: the body is traced once per iteration. Bounds are ints."""
    if stop is None:
        start, stop = 0, start
    for v, n in ((start, "start"), (stop, "stop"), (step, "step")):
        if not isinstance(v, int):
            raise ControlFlowError(
                f"static_range {n} must be a compile-time int, got {v!r}; use fly.range for "
                "run-time bounds"
            )
    return builtins.range(start, stop, step)


def _scalar_int(x, what) -> Tile:
    t = as_tile(x)
    if t.shape != () or not t.dtype.is_int:
        raise TypeCheckError(f"loop {what} must be a scalar integer, got {t.type}")
    return t


def _restore(writes):
    for h, old in writes:
        h._v = old


class range:
    """A run-time loop ``for i in fly.range(start, stop, step)``.

    ``stages`` is a software-pipelining hint for backends that pipeline
    loads across iterations (Triton's ``num_stages`` for this loop); ``unroll``
    asks the backend to unroll by that factor.
    """

    def __init__(
        self, start, stop=None, step=1, *, stages: int | None = None, unroll: int | None = None
    ):
        if stop is None:
            start, stop = 0, start
        if isinstance(step, int) and step <= 0:
            raise ControlFlowError(f"fly.range step must be positive, got {step}")
        self.bounds = (start, stop, step)
        self.attrs = {}
        if stages is not None:
            self.attrs["stages"] = int(stages)
        if unroll is not None:
            self.attrs["unroll"] = int(unroll)

    def __iter__(self):
        ctx = current()
        check_region("loop")
        lo, hi, st = (_scalar_int(v, n) for v, n in zip(self.bounds, ("start", "stop", "step")))
        ivt = dt.promote(dt.promote(lo.dtype, hi.dtype), st.dtype)
        lo, hi, st = cast(lo, ivt), cast(hi, ivt), cast(st, ivt)

        # Pass 1: discover the handles the body updates.
        rec = WriteRecorder()
        ctx.recorders.append(rec)
        scratch = ctx.push(Block([TileType(ivt)]))
        rec.blocks.add(id(scratch))
        yield Tile(scratch.args[0])
        ctx.pop()
        ctx.recorders.pop()
        carried = rec.carried()
        _restore(rec.writes.values())

        # Pass 2: the real body, carried handles bound to block arguments.
        body = ctx.push(Block([TileType(ivt)] + [old.type for _, old in carried]))
        rec2 = WriteRecorder()
        rec2.blocks.add(id(body))
        ctx.recorders.append(rec2)
        for (h, _), arg in zip(carried, body.args[1:]):
            h._v = arg
        yield Tile(body.args[0])
        ctx.recorders.pop()
        _check_same(rec2, carried, "loop")
        ctx.emit("yield", [h._v for h, _ in carried])
        ctx.pop()
        op = ctx.emit(
            "for", [lo._v, hi._v, st._v] + [old for _, old in carried], self.attrs, regions=[body]
        )
        for (h, old), r in zip(carried, op.results):
            h._v = old
            h._rebind(r)


def _check_same(rec: WriteRecorder, carried, what):
    known = {id(h) for h, _ in carried}
    for h, _ in rec.carried():
        if id(h) not in known:
            raise ControlFlowError(
                f"the {what} body updated a different set of tiles in its two trace passes; "
                "keep the body's Python control flow independent of trace-time state"
            )


def _cond(c) -> Tile:
    if isinstance(c, bool):
        raise ControlFlowError(
            "this condition is a compile-time Python bool: use a plain Python `if` for it"
        )
    t = as_tile(c)
    if t.shape != ():
        raise TypeCheckError(
            f"a branch condition must be a scalar, got {t.type}; reduce it first, or use fly.where "
            "for elementwise selection"
        )
    return t if t.dtype.is_bool else t != 0


def _open_branch(ctx):
    """Start recording a branch body: its in-place writes and its new block."""
    rec = WriteRecorder()
    ctx.recorders.append(rec)
    block = ctx.push(Block())
    rec.blocks.add(id(block))
    return rec, block


def _close_branch(ctx):
    ctx.pop()
    ctx.recorders.pop()


class if_:
    """A data-dependent branch: ``with fly.if_(cond): ...``, optionally followed by ``fly.else_()``.

    Tiles updated in place inside the branch keep their new values after it
    where the condition held, and their old values elsewhere.
    """

    def __init__(self, cond):
        self.cond = _cond(cond)

    def __enter__(self):
        ctx = current()
        check_region("branch")
        self.rec, self.block = _open_branch(ctx)
        return self

    def __exit__(self, exc_type, exc, tb):
        ctx = current()
        _close_branch(ctx)
        if exc_type is not None:
            return False
        carried = self.rec.carried()
        then_vals = [h._v for h, _ in carried]
        _restore(self.rec.writes.values())
        ctx.push(self.block)
        ctx.emit("yield", then_vals)
        ctx.pop()
        other = ctx.push(Block())
        ctx.emit("yield", [old for _, old in carried])
        ctx.pop()
        op = ctx.emit(
            "if", [self.cond._v] + [old for _, old in carried], regions=[self.block, other]
        )
        for (h, old), r in zip(carried, op.results):
            h._v = old
            h._rebind(r)
        ctx.last_if = (op, carried, then_vals)
        return False


class else_:
    """The else branch of the ``fly.if_`` block directly before it."""

    def __enter__(self):
        ctx = current()
        check_region("branch")
        last = getattr(ctx, "last_if", None)
        if last is None or not ctx.block.ops or ctx.block.ops[-1] is not last[0]:
            raise ControlFlowError("fly.else_() must directly follow a `with fly.if_(...)` block")
        self.op, self.then_carried, self.then_vals = last
        ctx.last_if = None
        _restore(self.then_carried)
        self.rec, self.block = _open_branch(ctx)
        return self

    def __exit__(self, exc_type, exc, tb):
        ctx = current()
        _close_branch(ctx)
        if exc_type is not None:
            return False
        known = {id(h) for h, _ in self.then_carried}
        extra = [(h, old) for h, old in self.rec.carried() if id(h) not in known]
        union = list(self.then_carried) + extra
        else_vals = [h._v for h, _ in union]
        _restore(self.rec.writes.values())
        then_block = self.op.regions[0]
        then_block.ops[-1].operands = list(self.then_vals) + [old for _, old in extra]
        ctx.push(self.block)
        ctx.emit("yield", else_vals)
        ctx.pop()
        ctx.block.ops.pop()  # replace the if op, which had no else branch yet
        op = ctx.emit(
            "if",
            [self.op.operand("cond")] + [old for _, old in union],
            regions=[then_block, self.block],
        )
        for (h, old), r in zip(union, op.results):
            h._v = old
            h._rebind(r)
        return False


class while_:
    """A run-time while loop: ``for _ in fly.while_(lambda: i < n): ...``.

    ``cond`` is a function of no arguments, re-evaluated before every
    iteration; tiles it reads that the body updates are loop-carried.
    """

    def __init__(self, cond):
        if not callable(cond):
            raise ControlFlowError(
                "fly.while_ takes a function returning the condition, e.g. lambda: i < n"
            )
        self.cond = cond

    def __iter__(self):
        ctx = current()
        check_region("loop")
        rec = WriteRecorder()
        ctx.recorders.append(rec)
        scratch = ctx.push(Block())
        rec.blocks.add(id(scratch))
        _cond(self.cond())
        yield None
        ctx.pop()
        ctx.recorders.pop()
        carried = rec.carried()
        _restore(rec.writes.values())
        types = [old.type for _, old in carried]

        before = ctx.push(Block(types))
        for (h, _), arg in zip(carried, before.args):
            h._v = arg
        ctx.emit("condition", [_cond(self.cond())._v])
        ctx.pop()

        body = ctx.push(Block(types))
        rec2 = WriteRecorder()
        rec2.blocks.add(id(body))
        ctx.recorders.append(rec2)
        for (h, _), arg in zip(carried, body.args):
            h._v = arg
        yield None
        ctx.recorders.pop()
        _check_same(rec2, carried, "while")
        ctx.emit("yield", [h._v for h, _ in carried])
        ctx.pop()
        op = ctx.emit("while", [old for _, old in carried], regions=[before, body])
        for (h, old), r in zip(carried, op.results):
            h._v = old
            h._rebind(r)
