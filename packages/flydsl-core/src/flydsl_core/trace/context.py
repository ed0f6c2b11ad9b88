"""The tracing context: where traced ops go while a kernel's Python runs.

A kernel is traced by calling its Python function with stand-in objects
(``Tile``, ``TensorRef``); every operation on them ``emit``s an op into the
current block. Nested constructs (loops, branches) push blocks.

Loop-carried values are found by *recording writes*: tiles are mutable
handles, and an in-place update (``acc += x``, ``acc.set(x)``) inside a
region is recorded by the innermost ``WriteRecorder``. A handle written in a
region whose old value was defined outside it is carried through the region.
"""

from __future__ import annotations

import threading

from ..exc import FlyDSLError, TraceError, user_location
from ..ir import ops as O
from ..ir.core import Block, Op, Value

_state = threading.local()


class WriteRecorder:
    """Records in-place writes to tile handles within one region."""

    def __init__(self):
        self.writes: dict[int, tuple[object, Value]] = {}  # handle id -> (handle, old value)
        self.blocks: set[int] = set()  # blocks opened while recording

    def note(self, handle, old: Value):
        self.writes.setdefault(id(handle), (handle, old))

    def carried(self) -> list[tuple[object, Value]]:
        """Handles whose value before the region was defined outside it."""
        return [(h, old) for h, old in self.writes.values() if id(old.block) not in self.blocks]


class TraceContext:
    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.blocks: list[Block] = []
        self.recorders: list[WriteRecorder] = []

    # -- blocks ---------------------------------------------------------------
    @property
    def block(self) -> Block:
        return self.blocks[-1]

    def push(self, block: Block) -> Block:
        for rec in self.recorders:
            rec.blocks.add(id(block))
        self.blocks.append(block)
        return block

    def pop(self) -> Block:
        return self.blocks.pop()

    # -- ops ------------------------------------------------------------------
    def emit(self, name: str, operands, attrs=None, regions=None, result_types=None) -> Op:
        operands = list(operands)
        attrs = dict(attrs or {})
        loc = user_location()
        if result_types is None:
            try:
                result_types = O.infer(name, [v.type for v in operands], attrs)
            except FlyDSLError as e:
                raise type(e)(e.msg, loc=loc) from None
        op = Op(name, operands, attrs, result_types, regions, loc)
        self.block.append(op)
        return op

    # -- writes ---------------------------------------------------------------
    def note_write(self, handle, old: Value):
        if self.recorders:
            self.recorders[-1].note(handle, old)


def current() -> TraceContext:
    ctx = getattr(_state, "ctx", None)
    if ctx is None:
        raise TraceError(
            "this FlyDSL operation was called outside a kernel; call it inside a function "
            "decorated with @flydsl_core.kernel"
        )
    return ctx


def maybe_current() -> TraceContext | None:
    return getattr(_state, "ctx", None)


class tracing:
    """``with tracing(ctx):`` makes ctx the current context (re-entrant per thread)."""

    def __init__(self, ctx: TraceContext):
        self.ctx = ctx

    def __enter__(self):
        self.prev = getattr(_state, "ctx", None)
        _state.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc):
        _state.ctx = self.prev
        return False
