"""FlyIR's data structures: values, operations, blocks and kernel functions.

FlyIR is an SSA IR over tiles. Structured control flow (``for``, ``if``,
``while``) holds nested blocks, as in MLIR's scf dialect, so both the
reference interpreter and the Triton lowering map it one to one.

Ops are built by the tracer and rewritten by passes. Every op keeps the
source location of the kernel line that produced it, which errors quote.
An op's operands are read by the slot names its ``OpDef`` declares
(``op.operand("mask")``, ``op.operand_list("init")``, ``op.args``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ..exc import SourceLoc
from .ops import OpDef, opdef
from .types import TensorType, TileType, Type

_ids = itertools.count()


class Value:
    """An SSA value: the result of an op, or an argument of a block."""

    __slots__ = ("block", "id", "index", "name", "owner", "type")

    def __init__(self, type: Type, owner: Any = None, index: int = 0, name: str | None = None):
        self.id = next(_ids)
        self.type = type
        self.owner = owner  # the Op producing it, or the Block it is an argument of
        self.index = index
        self.name = name
        self.block: Block | None = None  # the block in which it is defined

    @property
    def is_block_arg(self) -> bool:
        return isinstance(self.owner, Block)

    def __repr__(self) -> str:
        return f"%{self.name or self.id}: {self.type}"


class Op:
    """One operation. ``attrs`` hold compile-time data (axis, dtype, shape...)."""

    __slots__ = ("attrs", "block", "loc", "name", "operands", "regions", "results")

    def __init__(
        self,
        name: str,
        operands: list[Value],
        attrs: dict[str, Any] | None = None,
        result_types: list[Type] | tuple[Type, ...] = (),
        regions: list[Block] | None = None,
        loc: SourceLoc | None = None,
    ):
        self.name = name
        self.operands = list(operands)
        self.attrs = dict(attrs or {})
        self.results = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.regions = list(regions or [])
        self.loc = loc
        self.block: Block | None = None
        for r in self.regions:
            r.parent = self

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"op {self.name} has {len(self.results)} results, not one")
        return self.results[0]

    # -- operands by slot (declared on the op's OpDef in ops.py) ---------------------------
    @property
    def opdef(self) -> OpDef:
        return opdef(self.name)

    @property
    def args(self) -> SimpleNamespace:
        """The operands by slot name (``op.args.mask``); None for an absent optional slot."""
        return self.opdef.bind(self.operands)

    def operand(self, slot: str) -> Value | None:
        """The operand in ``slot``, or None where that optional slot is absent."""
        d = self.opdef
        i = d.index(slot)
        if d.slots[i].kind == "variadic":
            raise KeyError(f"{self.name}'s slot {slot!r} is variadic: use operand_list")
        return self.operands[i] if i < len(self.operands) else None

    def operand_list(self, slot: str) -> list[Value]:
        """The operands of a variadic slot (a loop's ``init``, a yield's ``values``)."""
        d = self.opdef
        i = d.index(slot)
        if d.slots[i].kind != "variadic":
            raise KeyError(f"{self.name}'s slot {slot!r} is not variadic: use operand")
        return self.operands[i:]

    def drop_operand(self, slot: str) -> None:
        """Remove optional ``slot`` and the optional slots after it (they need it)."""
        d = self.opdef
        i = d.index(slot)
        if d.slots[i].kind != "optional":
            raise KeyError(f"{self.name}'s slot {slot!r} is not optional")
        del self.operands[i:]

    def __repr__(self) -> str:
        return f"<Op {self.name} at {self.loc}>"


class Block:
    """A list of ops with arguments; the body of a kernel or of a region."""

    __slots__ = ("args", "ops", "parent")

    def __init__(self, arg_types: list[Type] | tuple[Type, ...] = ()):
        self.args = [Value(t, self, i) for i, t in enumerate(arg_types)]
        for a in self.args:
            a.block = self
        self.ops: list[Op] = []
        self.parent: Op | None = None

    def append(self, op: Op) -> Op:
        op.block = self
        for r in op.results:
            r.block = self
        self.ops.append(op)
        return op

    def add_arg(self, type: Type) -> Value:
        v = Value(type, self, len(self.args))
        v.block = self
        self.args.append(v)
        return v

    @property
    def terminator(self) -> Op | None:
        return self.ops[-1] if self.ops else None

    def walk(self):
        """Every op in this block and its regions, parents before children."""
        for op in self.ops:
            yield op
            for r in op.regions:
                yield from r.walk()


@dataclass
class Param:
    """A kernel parameter after specialization.

    ``kind`` is ``tensor`` (a pointer), ``shape`` / ``stride`` (a scalar
    belonging to tensor ``of`` and dimension ``dim``), ``scalar`` (a run-time
    number) or ``constexpr`` (folded into the IR at trace time; no value).
    """

    name: str
    kind: str
    value: Value | None
    of: str | None = None
    dim: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Function:
    """A traced, specialized kernel."""

    name: str
    params: list[Param]
    body: Block
    constexprs: dict[str, Any] = field(default_factory=dict)
    loc: SourceLoc | None = None

    def walk(self):
        return self.body.walk()

    def runtime_params(self) -> list[Param]:
        return [p for p in self.params if p.kind != "constexpr" and p.value is not None]

    def __str__(self) -> str:
        from .printer import print_function

        return print_function(self)


def is_tile(v: Value) -> bool:
    return isinstance(v.type, TileType)


def is_tensor(v: Value) -> bool:
    return isinstance(v.type, TensorType)
