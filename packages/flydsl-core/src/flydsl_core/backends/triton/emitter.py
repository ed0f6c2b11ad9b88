"""The emitter: walks a FlyIR function and writes Triton source, one rule per op.

``Lowering`` holds what every rule needs: the environment (each IR value as
a ``TV``, the expression the generated code knows it by), the emitted lines,
helper functions, and the operand forms Triton wants (a literal, a tensor,
a value at its full shape). Rules are registered with ``@lower("name")`` in
``LOWERINGS`` (by op family in ``rules/``); ``Lowering.op`` finds the rule,
and a missing rule, or a rule that fails, raises ``LoweringError`` naming the
op, the backend and the kernel line.

Values are named ``v<N>`` after the printer's numbering (``value_numbers``:
``%N`` of ``print(fn)``), so the generated source reads side by side with
the printed IR. A value whose only use is to be carried into a loop or out
of a region is defined straight into the carried name (``acc = tl.dot(...,
acc)``); which names an op carries into comes from ``CARRIED`` (the control
flow rules), and the choice is made when the value is defined.

Broadcasts are lazy, as careful hand-written Triton is: a value keeps the
smallest shape it was computed at (a row mask stays ``[32, 1]``, a splat
constant stays a Python literal) and Triton's implicit broadcasting does the
rest; ops whose meaning depends on the full shape (reductions, dot, stores'
pointers, loop-carried values) get it explicitly with ``tl.broadcast_to``.

This emitter serves the GPU targets. The ``cpu-interpret`` target runs the
same rules after an IR legalization, with a few overrides (``interpret.py``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ... import dtypes as dt
from ...exc import FlyDSLError, LoweringError
from ...ir.core import Block, Function, Op, Value
from ...ir.printer import value_numbers
from ...ir.types import TileType
from ...passes.facts import Facts
from ...targets import Target

BACKEND = "triton"

#: largest finite value of each fp8 format: FlyDSL's fp8 conversions saturate to it
FP8_MAX = {dt.fp8e4m3: 448.0, dt.fp8e5m2: 57344.0}


def tl_dtype(d: dt.DType) -> str:
    return d.triton_name


def pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def shape_str(shape) -> str:
    shape = tuple(shape)
    if len(shape) == 1:
        return f"({shape[0]},)"
    return "(" + ", ".join(map(str, shape)) + ")"


def broadcast_shape(*shapes) -> tuple[int, ...]:
    """NumPy broadcasting of Triton-side shapes (scalars are ``()``)."""
    shapes = [tuple(s) for s in shapes if s != ()]
    if not shapes:
        return ()
    rank = len(shapes[0])
    out = []
    for i in range(rank):
        dims = {s[i] for s in shapes} - {1}
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def literal(value, d: dt.DType) -> str:
    """A Python literal for a constant of dtype ``d``."""
    if d.is_bool:
        return "True" if value else "False"
    if d.is_float:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return repr(int(value))


@dataclass
class TV:
    """A FlyIR value in the generated code: an expression and the shape it has there.

    ``shape`` broadcasts to the IR shape (a lazy broadcast): ``()`` is a scalar
    that stands for a splat. ``literal`` marks a weakly typed Python literal.
    """

    expr: str
    shape: tuple[int, ...]
    dtype: dt.DType
    literal: bool = False
    value: Any = None


Rule = Callable[["Lowering", Op], None]

#: op name -> its lowering rule (filled by the modules of ``rules/``)
LOWERINGS: dict[str, Rule] = {}

#: op name -> ``f(cx, op)``: the (operand, name) pairs the op assigns (a loop's initial
#: values, a region's yielded ones), or None; filled by the control-flow rules
CARRIED: dict[str, Callable[[Lowering, Op], list[tuple[Value, str]] | None]] = {}


def lower(*names: str):
    """Register the lowering rule of one or more FlyIR ops."""

    def deco(fn):
        for n in names:
            if n in LOWERINGS:
                raise LoweringError(f"{BACKEND} lowering for {n!r} registered twice")
            LOWERINGS[n] = fn
        return fn

    return deco


class Lowering:
    """Emits the Triton source of one FlyIR function for one target."""

    #: the ``Target`` flags and Triton facts the rules read
    target: Target
    #: a line for the generated module's docstring
    note: str = ""

    def __init__(
        self,
        fn: Function,
        target: Target,
        *,
        dot_precisions=("ieee",),
        rules: Mapping[str, Rule] | None = None,
        num_warps: int | None = None,
        skip_asm: bool = True,
    ):
        self.fn = fn
        self.target = target
        #: the launch's warps where the compile knows them (None: source made for any launch);
        #: a rule may size per-thread work by them (``rescale``'s elements per asm block)
        self.num_warps = num_warps
        #: ``rescale`` may lower to its skipping asm (``rules/elementwise.rescale_asm``); off
        #: for the compile again after the asm's register guard failed
        self.skip_asm = skip_asm
        self.dot_precisions = tuple(dot_precisions)
        self.rules = LOWERINGS if rules is None else rules
        self.nums = value_numbers(fn)
        self.env: dict[int, TV] = {}
        self.lines: list[str] = []
        self.line_locs: dict[int, Any] = {}
        self.indent = 1
        self.helpers: dict[str, str] = {}
        self.uses_libdevice = False
        self.facts = Facts(fn)
        self._last_loc = None
        self._tmp = 0
        self.fresh: dict[int, int] = {}  # value id -> how many times it was renamed
        self.pnames: dict[int, str] = {}  # parameter value id -> its Triton name
        self.use_count: dict[int, int] = {}
        for op in fn.walk():
            for v in op.operands:
                self.use_count[v.id] = self.use_count.get(v.id, 0) + 1
        self._into: tuple[Value, str, list[Value]] | None = None

    # -- names and values ---------------------------------------------------------------
    def name_of(self, v: Value) -> str:
        n = self.nums[v.id]
        k = self.fresh.get(v.id)
        return f"v{n}" if not k else f"v{n}_{k}"

    def tmp(self, base: str = "t") -> str:
        self._tmp += 1
        return f"_{base}{self._tmp}"

    def bind(self, v: Value, tv: TV) -> TV:
        self.env[v.id] = tv
        return tv

    def get(self, v: Value) -> TV:
        tv = self.env.get(v.id)
        if tv is None:
            raise LoweringError(f"value %{self.nums.get(v.id, '?')} is used before it is defined")
        return tv

    def used(self, v: Value) -> bool:
        return self.use_count.get(v.id, 0) > 0

    def ir_shape(self, v: Value) -> tuple[int, ...]:
        return tuple(v.type.shape)

    def emit(self, line: str, loc=None):
        text = "    " * self.indent + line
        if loc is not None and (loc.file, loc.line) != self._last_loc:
            text += f"  # {os.path.basename(loc.file)}:{loc.line}"
            self._last_loc = (loc.file, loc.line)
        if loc is not None:
            self.line_locs[len(self.lines)] = loc
        self.lines.append(text)

    def forget_loc(self):
        """The next line names its kernel line again (after leaving an indented block)."""
        self._last_loc = None

    def define(self, v: Value, expr: str, shape=None, loc=None) -> TV:
        """Emit ``name = expr`` and bind ``v`` to it (``name`` is ``v``'s own, or the
        name it is carried into when that is its only use)."""
        shape = self.ir_shape(v) if shape is None else tuple(shape)
        name = self.name_of(v)
        if self._into is not None and self._into[0] is v and shape == self.ir_shape(v):
            _, into, others = self._into
            # the carried name may still be read by the other carried values
            if all(self.get(w).expr != into for w in others if w is not v):
                name = into
        self.emit(f"{name} = {expr}", loc)
        return self.bind(v, TV(name, shape, v.type.dtype))

    # -- operand forms -----------------------------------------------------------------------
    def ref(self, v: Value) -> str:
        """An operand for an elementwise op: a name, or a literal where Triton types it right."""
        tv = self.get(v)
        if tv.literal and not self.literal_ok(tv):
            return self.scalar_tensor(tv)
        return tv.expr

    def literal_ok(self, tv: TV) -> bool:
        # A Python scalar of a kind no higher than the tensor's does not take part in
        # Triton's promotion; unsigned tensors would promote an int literal to int32.
        return tv.dtype.kind != "uint"

    def scalar_tensor(self, tv: TV) -> str:
        return f"tl.full((), {tv.expr}, {tl_dtype(tv.dtype)})"

    def tensor(self, v: Value) -> str:
        """A Triton tensor (never a literal), at its lazy shape."""
        tv = self.get(v)
        return self.scalar_tensor(tv) if tv.literal else tv.expr

    def full(self, v: Value, shape=None) -> str:
        """``v`` at exactly its IR shape (or ``shape``)."""
        tv = self.get(v)
        shape = self.ir_shape(v) if shape is None else tuple(shape)
        if tv.literal:
            if shape == ():
                return self.scalar_tensor(tv)
            if tv.value == 0 and not tv.dtype.is_bool:
                return f"tl.zeros({shape_str(shape)}, {tl_dtype(tv.dtype)})"
            return f"tl.full({shape_str(shape)}, {tv.expr}, {tl_dtype(tv.dtype)})"
        if tv.shape == shape:
            return tv.expr
        return f"tl.broadcast_to({tv.expr}, {shape_str(shape)})"

    def helper(self, name: str, text: str) -> str:
        """A ``@triton.jit`` helper emitted once above the kernel; returns its name."""
        self.helpers.setdefault(name, text)
        return name

    def libdevice(self, fn: str) -> str:
        self.uses_libdevice = True
        return f"libdevice.{fn}"

    def convert(self, x: str, src: dt.DType, to: dt.DType) -> str:
        """``x`` (a tensor expression of dtype ``src``) converted as FlyIR's ``cast`` does."""
        if src == to:
            return x
        if src.storage_only:
            return self.convert(f"{x}.to(tl.float32)", dt.fp32, to)
        if to.storage_only:
            # FlyDSL's fp8 conversions saturate to the largest finite value, NaN stays NaN:
            # clamp in fp32 first (as the reference does), so no target's conversion overflows.
            f = self.convert(x, src, dt.fp32)
            hi = FP8_MAX[to]
            return (
                f"tl.clamp({f}, {-hi}, {hi}, propagate_nan=tl.PropagateNan.ALL).to({tl_dtype(to)})"
            )
        return f"{x}.to({tl_dtype(to)})"

    # -- the kernel's parameters ------------------------------------------------------------
    def prologue(self, params) -> None:
        """Statements before the body that adapt the parameters (none when compiled:
        Triton types every parameter from the signature)."""

    # -- driving -------------------------------------------------------------------------------
    def block(self, block: Block):
        ops = block.ops
        for k, op in enumerate(ops):
            if op.opdef.terminator:
                continue
            self._into = self._carried_into(op, ops[k + 1] if k + 1 < len(ops) else None)
            try:
                self.op(op)
            finally:
                self._into = None

    def _carried_into(self, op: Op, nxt: Op | None):
        """``(value, name, others)`` when ``op``'s one result is used once, by the next op,
        which carries it into ``name``: then ``define`` computes it into that name."""
        if nxt is None or len(op.results) != 1 or self.use_count.get(op.result.id) != 1:
            return None
        carried = CARRIED.get(nxt.name)
        pairs = carried(self, nxt) if carried is not None else None
        for v, name in pairs or ():
            if v is op.result:
                return v, name, [w for w, _ in pairs]
        return None

    def op(self, op: Op):
        for r in op.results:
            if isinstance(r.type, TileType) and not all(pow2(s) for s in r.type.shape):
                raise LoweringError(
                    f"the {BACKEND} backend cannot lower op {op.name!r}: its result "
                    f"%{self.nums.get(r.id, '?')} has shape {r.type.shape}, and Triton tiles "
                    "need power-of-two sizes; pad the tile to a power of two and mask it",
                    loc=op.loc,
                )
        rule = self.rules.get(op.name)
        if rule is None:
            raise LoweringError(
                f"the {BACKEND} backend has no lowering rule for op {op.name!r}", loc=op.loc
            )
        try:
            rule(self, op)
        except FlyDSLError:
            raise
        except Exception as e:  # a rule's own failure: name the op and the kernel line
            raise LoweringError(
                f"the {BACKEND} backend failed to lower op {op.name!r}: {type(e).__name__}: {e}",
                loc=op.loc,
            ) from e
