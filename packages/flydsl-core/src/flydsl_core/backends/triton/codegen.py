"""FlyIR -> readable Triton Python source.

``generate(fn, target)`` turns one specialized, verified FlyIR function into
the text of a Python module holding a single ``@triton.jit`` kernel (plus the
small ``@triton.jit`` combine functions its reductions need). The kernel's
parameters are the run-time values the IR still uses, named after the user's
parameters (``x_ptr``, ``x_size0``, ``x_stride0``, ``eps``); values are named
``v<N>`` where ``%N`` is the value's number in the printed FlyIR, so the
generated source reads side by side with ``print(fn)``.

One lowering rule per op, registered with ``@lower("name")`` in ``LOWERINGS``.
A rule gets the ``Lowering`` (the emitter) and the op, and binds the op's
results, usually by emitting one statement. A missing rule, or a rule that
fails, raises ``LoweringError`` naming the op, the backend and the kernel line.

Broadcasts are lazy, as careful hand-written Triton is: a value keeps the
smallest shape it was computed at (a row mask stays ``[32, 1]``, a splat
constant stays a Python literal) and Triton's implicit broadcasting does the
rest; ops whose meaning depends on the full shape (reductions, dot, stores'
pointers, loop-carried values) get it explicitly with ``tl.broadcast_to``.
Masks appear only where the IR has them.

Targets differ in three places only: for ``cpu-interpret`` (Triton's
interpreter) ``dot`` upcasts 16-bit and fp8 operands to fp32 (the interpreter
computes bf16 ``tl.dot`` wrongly), fp8 conversions fix NaN explicitly (the
interpreter turns NaN into a finite fp8), and ``tanh``/``pow`` avoid
libdevice, which the interpreter does not have.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ... import dtypes as dt
from ...exc import FlyDSLError, LoweringError
from ...ir.core import Block, Function, Op, Value
from ...ir.types import TensorType, TileType
from ...passes.facts import Facts

BACKEND = "triton"

# -- dtypes -----------------------------------------------------------------------------

#: FlyIR dtype -> Triton signature type (ASTSource's ``signature`` values)
SIG_TYPES = {
    dt.bool_: "i1",
    dt.int8: "i8",
    dt.int16: "i16",
    dt.int32: "i32",
    dt.int64: "i64",
    dt.uint8: "u8",
    dt.fp8e4m3: "fp8e4nv",
    dt.fp8e5m2: "fp8e5",
    dt.fp16: "fp16",
    dt.bf16: "bf16",
    dt.fp32: "fp32",
    dt.fp64: "fp64",
}

#: largest finite value of each fp8 format: FlyDSL's fp8 conversions saturate to it
FP8_MAX = {dt.fp8e4m3: 448.0, dt.fp8e5m2: 57344.0}
#: a NaN bit pattern of each fp8 format (as uint8)
FP8_NAN = {dt.fp8e4m3: 0x7F, dt.fp8e5m2: 0x7F}


def tl_dtype(d: dt.DType) -> str:
    return d.triton_name


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _shape_str(shape) -> str:
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


# -- the generated kernel's parameters ------------------------------------------------------


@dataclass(frozen=True)
class KernelParam:
    """One parameter of the generated ``@triton.jit`` function."""

    name: str  # the Triton parameter name
    kind: str  # "tensor" | "shape" | "stride" | "scalar"
    sig: str  # Triton signature type: "*bf16", "i32", "fp32"
    arg: int  # index of the run-time argument (tensor or scalar) it is read from
    dim: int | None = None  # for shape / stride
    divisibility: int | None = None  # tt.divisibility
    pointer_range_32: bool = False  # AMD: every offset from this pointer fits in int32 (buffer ops)
    index_bits: int | None = None  # tensors: 32 or 64

    def attrs(self, *, pointer_range: bool = True) -> list[list[Any]]:
        out: list[list[Any]] = []
        if self.divisibility:
            out.append(["tt.divisibility", self.divisibility])
        if pointer_range and self.pointer_range_32:
            out.append(["tt.pointer_range", 32])
        return out


@dataclass
class GeneratedKernel:
    """The generated source and what the compiler and the launcher need to know about it."""

    name: str  # the @triton.jit function's name
    source: str
    params: list[KernelParam]
    target: str
    interpret: bool
    nargs: int = 0  # run-time arguments of a launch (the function's tensor and scalar params)
    line_locs: dict[int, Any] = field(default_factory=dict)  # source line -> SourceLoc

    @property
    def signature(self) -> dict[str, str]:
        return {p.name: p.sig for p in self.params}

    def attrs(self, *, pointer_range: bool = True) -> dict[tuple[int, ...], list]:
        out = {}
        for i, p in enumerate(self.params):
            a = p.attrs(pointer_range=pointer_range)
            if a:
                out[(i,)] = a
        return out

    @property
    def uses_pointer_range(self) -> bool:
        return any(p.pointer_range_32 for p in self.params)


# -- values as the generated code sees them -----------------------------------------------------


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


# -- lowering rules ----------------------------------------------------------------------------

LOWERINGS: dict[str, Callable[[Lowering, Op], None]] = {}


def lower(*names: str):
    """Register the lowering rule of one or more FlyIR ops."""

    def deco(fn):
        for n in names:
            if n in LOWERINGS:
                raise LoweringError(f"{BACKEND} lowering for {n!r} registered twice")
            LOWERINGS[n] = fn
        return fn

    return deco


_RESERVED = {
    "tl",
    "triton",
    "libdevice",
    "float",
    "int",
    "range",
    "True",
    "False",
    "None",
    "and",
    "or",
    "not",
    "if",
    "else",
    "for",
    "while",
    "in",
    "is",
    "def",
    "return",
    "pass",
    "lambda",
    "import",
    "from",
    "class",
    "len",
    "min",
    "max",
    "abs",
}


def _safe(name: str) -> str:
    name = re.sub(r"\W", "_", name)
    if not name or name[0].isdigit():
        name = "p_" + name
    if name in _RESERVED or name.startswith("_fly") or re.fullmatch(r"v\d+(_\d+)?", name):
        name += "_arg"
    return name


def value_numbers(fn: Function) -> dict[int, int]:
    """Value id -> its number in ``print_function``'s output (``%N``)."""
    nums: dict[int, int] = {}

    def name(v: Value):
        if v.id not in nums:
            nums[v.id] = len(nums)

    for p in fn.params:
        if p.value is not None:
            name(p.value)

    def block(b: Block):
        for a in b.args:
            name(a)
        for op in b.ops:
            for r in op.results:
                name(r)
            for v in op.operands:
                name(v)
            for r in op.regions:
                block(r)

    block(fn.body)
    return nums


def _uses(fn: Function) -> set[int]:
    used = set()
    for op in fn.walk():
        for v in op.operands:
            used.add(v.id)
    return used


class Lowering:
    """Emits the Triton source of one FlyIR function."""

    def __init__(
        self, fn: Function, target: str, *, interpret: bool, dot_precisions=("ieee",), amd=False
    ):
        self.fn = fn
        self.target = target
        self.interpret = interpret
        self.dot_precisions = tuple(dot_precisions)
        self.amd = amd
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
        self._fresh: dict[int, int] = {}
        self.pnames: dict[int, str] = {}  # parameter value id -> its Triton name
        self.used: set[int] = set()
        self.use_count: dict[int, int] = {}
        self.last_def: tuple[int, str, int] | None = (
            None  # (line, name, value id) of the last define
        )

    # -- names and values ---------------------------------------------------------------
    def name_of(self, v: Value) -> str:
        n = self.nums.get(v.id)
        if n is None:
            n = self.nums[v.id] = len(self.nums)
        k = self._fresh.get(v.id)
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

    def define(self, v: Value, expr: str, shape=None, loc=None) -> TV:
        """Emit ``vN = expr`` and bind ``v`` to it."""
        name = self.name_of(v)
        self.emit(f"{name} = {expr}", loc)
        self.last_def = (len(self.lines) - 1, name, v.id)
        shape = self.ir_shape(v) if shape is None else tuple(shape)
        return self.bind(v, TV(name, shape, v.type.dtype))

    # -- operand forms -----------------------------------------------------------------------
    def ref(self, v: Value, *, literal_ok: bool = True) -> str:
        """An operand for an elementwise op: a name, or a literal where Triton types it right."""
        tv = self.get(v)
        if tv.literal and not (literal_ok and self.literal_ok(tv)):
            return self.scalar_tensor(tv)
        return tv.expr

    def literal_ok(self, tv: TV) -> bool:
        # A Python scalar of a kind no higher than the tensor's does not take part in
        # Triton's promotion; unsigned tensors would promote an int literal to int32.
        # The interpreter builds bf16 constants from the number's bits: no bf16 literals.
        return tv.dtype.kind != "uint" and not self.emulated(tv.dtype)

    def emulated(self, d: dt.DType) -> bool:
        """The interpreter stores bf16 as raw uint16 and computes on the bits: compute in fp32."""
        return self.interpret and d == dt.bf16

    def scalar_tensor(self, tv: TV) -> str:
        if self.emulated(tv.dtype):
            return cast_expr(self, f"tl.full((), {tv.expr}, tl.float32)", dt.fp32, dt.bf16)
        return f"tl.full((), {tv.expr}, {tl_dtype(tv.dtype)})"

    def up(self, v: Value, expr: str | None = None) -> str:
        """An operand of a bf16 op computed in fp32 under the interpreter (else unchanged)."""
        tv = self.get(v)
        if not self.emulated(tv.dtype):
            return self.ref(v) if expr is None else expr
        if expr is None:
            return tv.expr if tv.literal else f"{tv.expr}.to(tl.float32)"  # fp32 literal: fine
        return f"{expr}.to(tl.float32)"

    def down(self, d: dt.DType, expr: str) -> str:
        """Round an fp32 result of an emulated bf16 op back to bf16."""
        return cast_expr(self, expr, dt.fp32, d) if self.emulated(d) else expr

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
            if self.emulated(tv.dtype):
                return cast_expr(
                    self, f"tl.full({_shape_str(shape)}, {tv.expr}, tl.float32)", dt.fp32, dt.bf16
                )
            if tv.value == 0 and not tv.dtype.is_bool:
                return f"tl.zeros({_shape_str(shape)}, {tl_dtype(tv.dtype)})"
            return f"tl.full({_shape_str(shape)}, {tv.expr}, {tl_dtype(tv.dtype)})"
        if tv.shape == shape:
            return tv.expr
        return f"tl.broadcast_to({tv.expr}, {_shape_str(shape)})"

    def helper(self, name: str, text: str) -> str:
        self.helpers.setdefault(name, text)
        return name

    # -- driving -------------------------------------------------------------------------------
    def block(self, block: Block):
        for op in block.ops:
            if op.name in ("yield", "condition"):
                continue
            self.op(op)

    def op(self, op: Op):
        for r in op.results:
            if isinstance(r.type, TileType) and not all(_pow2(s) for s in r.type.shape):
                raise LoweringError(
                    f"the {BACKEND} backend cannot lower op {op.name!r}: its result "
                    f"%{self.nums.get(r.id, '?')} has shape {r.type.shape}, and Triton tiles "
                    "need power-of-two sizes; pad the tile to a power of two and mask it",
                    loc=op.loc,
                )
        rule = LOWERINGS.get(op.name)
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


# -- leaves ---------------------------------------------------------------------------------------


@lower("constant")
def _constant(cx: Lowering, op: Op):
    r = op.results[0]
    d = r.type.dtype
    cx.bind(r, TV(literal(op.attrs["value"], d), (), d, literal=True, value=op.attrs["value"]))


@lower("arange")
def _arange(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.arange({op.attrs['start']}, {op.attrs['end']})", loc=op.loc)


@lower("program_id")
def _program_id(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.program_id({op.attrs['axis']})", loc=op.loc)


@lower("num_programs")
def _num_programs(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.num_programs({op.attrs['axis']})", loc=op.loc)


# -- elementwise --------------------------------------------------------------------------------

_BINOP = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "intdiv": "//",  # Triton's // on integers is sdiv/udiv: truncation, like FlyIR's
    "mod": "%",  # srem / frem: C fmod, like FlyIR's
    "truediv": "/",
    "and": "&",
    "or": "|",
    "xor": "^",
    "shl": "<<",
    "shr": ">>",  # arithmetic for signed, logical for unsigned: as torch
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
}


def _binary_operands(cx: Lowering, op: Op) -> tuple[str, str, tuple]:
    a, b = op.operands
    ta, tb = cx.get(a), cx.get(b)
    if ta.literal and tb.literal:
        ea, eb = cx.scalar_tensor(ta), cx.ref(b)
        if cx.emulated(ta.dtype):
            ea = f"{ea}.to(tl.float32)"
    else:
        ea, eb = cx.up(a), cx.up(b)
    return ea, eb, broadcast_shape(ta.shape, tb.shape)


@lower(*_BINOP)
def _binary(cx: Lowering, op: Op):
    a, b, shape = _binary_operands(cx, op)
    r = op.results[0]
    d = op.operands[0].type.dtype
    expr = f"{a} {_BINOP[op.name]} {b}"
    # Triton computes / and % of 16-bit floats in fp32: round back, as torch does.
    if op.name in ("truediv", "mod") and d.is_float and d.bits < 32:
        expr = cast_expr(cx, f"({expr})", dt.fp32, d)
    elif r.type.dtype == d:
        expr = cx.down(d, expr)
    cx.define(r, expr, shape, op.loc)


@lower("maximum", "minimum")
def _minmax(cx: Lowering, op: Op):
    a, b, shape = _binary_operands(cx, op)
    d = op.operands[0].type.dtype
    f = "tl.maximum" if op.name == "maximum" else "tl.minimum"
    nan = (
        ", propagate_nan=tl.PropagateNan.ALL" if d.is_float else ""
    )  # FlyIR's max/min propagate NaN
    cx.define(op.results[0], cx.down(d, f"{f}({a}, {b}{nan})"), shape, op.loc)


def _libm(cx: Lowering, fn: str) -> str:
    cx.uses_libdevice = True
    return f"libdevice.{fn}"


@lower("pow")
def _pow(cx: Lowering, op: Op):
    x, y = op.operands
    shape = broadcast_shape(cx.get(x).shape, cx.get(y).shape)
    d = x.type.dtype
    a, b = cx.tensor(x), cx.tensor(y)  # function arguments: tensors, not literals
    if d.bits < 32:
        a, b = cast_expr(cx, a, d, dt.fp32), cast_expr(cx, b, d, dt.fp32)
    if cx.interpret:
        # The interpreter has no libdevice: exp2(b * log2|a|) in fp64, with torch.pow's signs.
        expr = f"{cx.helper('_fly_pow', _POW_HELPER)}({a}, {b})"
    else:
        expr = f"{_libm(cx, 'pow')}({a}, {b})"
    if d.bits < 32:
        expr = cast_expr(cx, expr, dt.fp32, d)
    cx.define(op.results[0], expr, shape, op.loc)


_POW_HELPER = """
@triton.jit
def _fly_pow(a, b):
    # torch.pow for the interpreter, which has no libdevice (in fp64, then rounded).
    dtype = a.dtype
    a = a.to(tl.float64)
    b = b.to(tl.float64)
    m = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    m = tl.where((a < 0) & b_odd, -m, m)
    m = tl.where((a < 0) & ~b_int, float("nan"), m)
    return tl.where(b == 0, 1.0, m).to(dtype)
"""

_TANH_HELPER = """
@triton.jit
def _fly_tanh(x):
    # tanh for the interpreter, which has no libdevice (in fp64, then rounded).
    dtype = x.dtype
    x = x.to(tl.float64)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    t = tl.where(tl.abs(x) < 0.0625, tl.abs(small), t)
    return tl.where(x < 0, -t, t).to(dtype)
"""

_UNARY = {
    "exp": "tl.exp",
    "exp2": "tl.exp2",
    "log": "tl.log",
    "log2": "tl.log2",
    "sqrt": "tl.sqrt",
    "rsqrt": "tl.rsqrt",
    "erf": "tl.erf",
    "sigmoid": "tl.sigmoid",
    "sin": "tl.sin",
    "cos": "tl.cos",
    "floor": "tl.floor",
    "ceil": "tl.ceil",
}


@lower(*_UNARY, "tanh")
def _unary_float(cx: Lowering, op: Op):
    (a,) = op.operands
    tv = cx.get(a)
    x = cx.tensor(a)
    d = a.type.dtype
    if d.bits < 32:  # Triton's math functions take fp32/fp64: compute in fp32, round back
        x = f"{x}.to(tl.float32)"
    if op.name == "tanh":
        f = cx.helper("_fly_tanh", _TANH_HELPER) if cx.interpret else _libm(cx, "tanh")
    else:
        f = _UNARY[op.name]
    expr = f"{f}({x})"
    if d.bits < 32:
        expr = cast_expr(cx, expr, dt.fp32, d)
    cx.define(op.results[0], expr, tv.shape, op.loc)


@lower("neg")
def _neg(cx: Lowering, op: Op):
    (a,) = op.operands
    d = a.type.dtype
    cx.define(op.results[0], cx.down(d, f"-{cx.up(a, cx.tensor(a))}"), cx.get(a).shape, op.loc)


@lower("abs")
def _abs(cx: Lowering, op: Op):
    (a,) = op.operands
    cx.define(op.results[0], f"tl.abs({cx.tensor(a)})", cx.get(a).shape, op.loc)


@lower("invert")
def _invert(cx: Lowering, op: Op):
    (a,) = op.operands
    cx.define(op.results[0], f"~{cx.tensor(a)}", cx.get(a).shape, op.loc)


_TO_BF16_HELPER = """
@triton.jit
def _fly_to_bf16(x):
    # fp32 -> bf16, round to nearest even (NaN -> 0x7FC0, as torch): in integer arithmetic,
    # because the interpreter's own conversion truncates.
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.int16).to(tl.bfloat16, bitcast=True)
"""

_TO_FP8_HELPER = """
@triton.jit
def _fly_to_fp8(x, BIAS: tl.constexpr, M: tl.constexpr, MAX: tl.constexpr, NAN: tl.constexpr, DT: tl.constexpr):
    # fp32 -> fp8 as FlyDSL converts: saturate to +-MAX, round to nearest even, NaN stays
    # NaN. Built from integers, because the interpreter's own conversion neither
    # saturates nor rounds to even.
    nan = x != x
    a = tl.minimum(tl.where(nan, 0.0, tl.abs(x)), MAX)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, 1 - BIAS)
    ulp = ((e - M + 127) << 23).to(tl.float32, bitcast=True)
    n = ((a / ulp + 12582912.0) - 12582912.0).to(tl.int32)  # significand, rounded to even
    bits = ((e + BIAS - 1) << M) + n  # a carry out of the significand bumps the exponent
    bits = bits | ((x.to(tl.int32, bitcast=True) >> 24) & 0x80)
    bits = tl.where(nan, NAN, bits)
    return bits.to(tl.uint8).to(DT, bitcast=True)
"""

#: fp8 format -> (exponent bias, mantissa bits)
_FP8_FORMAT = {dt.fp8e4m3: (7, 3), dt.fp8e5m2: (15, 2)}


_FROM_FP8_HELPER = """
@triton.jit
def _fly_from_fp8(x, BIAS: tl.constexpr, M: tl.constexpr, IEEE: tl.constexpr):
    # fp8 -> fp32 from the bits: the interpreter decodes the NaN (and e5m2's inf)
    # encodings as ordinary numbers.
    b = x.to(tl.uint8, bitcast=True).to(tl.int32)
    e = (b >> M) & ((1 << (7 - M)) - 1)
    m = b & ((1 << M) - 1)
    v = (((e - BIAS + 127) << 23) | (m << (23 - M))).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * (2.0 ** (1 - BIAS - M)), v)
    top = e == (1 << (7 - M)) - 1
    if IEEE:
        v = tl.where(top, tl.where(m == 0, float("inf"), float("nan")), v)
    else:
        v = tl.where(top & (m == (1 << M) - 1), float("nan"), v)
    return tl.where(b >= 128, -v, v)
"""


def cast_expr(cx: Lowering, x: str, src: dt.DType, to: dt.DType) -> str:
    """``x`` (a tensor expression of dtype ``src``) converted as FlyIR's ``cast`` does."""
    if src == to:
        return x
    t = tl_dtype(to)
    if src.storage_only:
        if cx.interpret:
            bias, m = _FP8_FORMAT[src]
            name = cx.helper("_fly_from_fp8", _FROM_FP8_HELPER)
            f = f"{name}({x}, {bias}, {m}, {src == dt.fp8e5m2})"
        else:
            f = f"{x}.to(tl.float32)"
        return cast_expr(cx, f, dt.fp32, to)
    if to.storage_only:
        # FlyDSL's fp8 conversions saturate to the largest finite value, NaN stays NaN:
        # clamp in fp32 first (as the reference does), so no target's conversion overflows.
        f = cast_expr(cx, x, src, dt.fp32)
        hi = FP8_MAX[to]
        if cx.interpret:
            bias, m = _FP8_FORMAT[to]
            name = cx.helper("_fly_to_fp8", _TO_FP8_HELPER)
            return f"{name}({f}, {bias}, {m}, {hi}, {FP8_NAN[to]}, {t})"
        return f"tl.clamp({f}, {-hi}, {hi}, propagate_nan=tl.PropagateNan.ALL).to({t})"
    if cx.interpret and src == dt.bf16 and to != dt.fp32:
        # the interpreter converts bf16 correctly only to fp32
        return cast_expr(cx, f"{x}.to(tl.float32)", dt.fp32, to)
    if cx.interpret and to == dt.bf16:
        if src != dt.fp32:
            x = cast_expr(cx, x, src, dt.fp32)
        return f"{cx.helper('_fly_to_bf16', _TO_BF16_HELPER)}({x})"
    if cx.interpret and to.is_int and src.is_int:
        # index widening: the interpreter's loop variables are Python ints (no .to);
        # tl.cast takes both
        return f"tl.cast({x}, {t})"
    return f"{x}.to({t})"


@lower("hint")
def _hint_op(cx: Lowering, op: Op):
    # tl.multiple_of / tl.max_contiguous set AxisInfo divisibility and contiguity, which
    # decide vector widths where Triton's own analysis cannot see them (xor swizzles).
    (a,) = op.operands
    c, m = op.attrs["contiguous"], op.attrs["multiple_of"]
    if a.type.shape == ():
        expr = cx.full(a)
        if m[0] > 1:
            expr = f"tl.multiple_of({expr}, {m[0]})"
        cx.define(op.results[0], expr, (), op.loc)
        return
    expr = cx.full(a)
    if any(x > 1 for x in m):
        expr = f"tl.multiple_of({expr}, {list(m)})"
    if any(x > 1 for x in c):
        expr = f"tl.max_contiguous({expr}, {list(c)})"
    cx.define(op.results[0], expr, loc=op.loc)


@lower("cast")
def _cast(cx: Lowering, op: Op):
    (a,) = op.operands
    tv = cx.get(a)
    src, to = a.type.dtype, op.attrs["dtype"]
    cx.define(op.results[0], cast_expr(cx, cx.tensor(a), src, to), tv.shape, op.loc)


@lower("bitcast")
def _bitcast(cx: Lowering, op: Op):
    (a,) = op.operands
    tv = cx.get(a)
    to = op.attrs["dtype"]
    cx.define(op.results[0], f"{cx.tensor(a)}.to({tl_dtype(to)}, bitcast=True)", tv.shape, op.loc)


@lower("where")
def _where(cx: Lowering, op: Op):
    c, a, b = op.operands
    tc, ta, tb = (cx.get(v) for v in op.operands)
    ec = cx.ref(c)
    if ta.literal and tb.literal:
        ea, eb = cx.scalar_tensor(ta), cx.ref(b)
    else:
        ea, eb = cx.ref(a), cx.ref(b)
    shape = broadcast_shape(tc.shape, ta.shape, tb.shape)
    cx.define(op.results[0], f"tl.where({ec}, {ea}, {eb})", shape, op.loc)


# -- shape ----------------------------------------------------------------------------------------


@lower("broadcast")
def _broadcast(cx: Lowering, op: Op):
    # Lazy: Triton broadcasts implicitly; ops that need the full shape ask for it.
    cx.bind(op.results[0], cx.get(op.operands[0]))


def _unit_map(src, dst):
    """For a reshape that only adds or drops size-1 dims: src dim -> dst dim of each non-unit dim."""
    si = [i for i, s in enumerate(src) if s != 1]
    di = [i for i, s in enumerate(dst) if s != 1]
    if [src[i] for i in si] != [dst[i] for i in di]:
        return None
    return dict(zip(si, di))


def _insert_index(vin, vout) -> str | None:
    """``[None, :]``-style indexing turning shape ``vin`` into ``vout`` by inserting unit dims."""
    parts, j = [], 0
    for s in vout:
        if j < len(vin) and vin[j] == s:
            parts.append(":")
            j += 1
        elif s == 1:
            parts.append("None")
        else:
            return None
    if j != len(vin):
        return None
    return "[" + ", ".join(parts) + "]"


@lower("reshape")
def _reshape(cx: Lowering, op: Op):
    (a,) = op.operands
    r = op.results[0]
    tv = cx.get(a)
    src, dst = cx.ir_shape(a), cx.ir_shape(r)
    m = _unit_map(src, dst)
    if m is not None and (tv.shape == () or tv.literal):
        cx.bind(r, tv)  # a scalar stands for a splat of any shape
        return
    if m is not None:
        vout = [1] * len(dst)
        for i, j in m.items():
            vout[j] = tv.shape[i]
        vout = tuple(vout)
        if vout == tv.shape:
            cx.bind(r, TV(tv.expr, vout, tv.dtype))
            return
        idx = _insert_index(tv.shape, vout)
        expr = f"{tv.expr}{idx}" if idx else f"tl.reshape({tv.expr}, {_shape_str(vout)})"
        cx.define(r, expr, vout, op.loc)
        return
    cx.define(r, f"tl.reshape({cx.full(a)}, {_shape_str(dst)})", dst, op.loc)


@lower("permute")
def _permute(cx: Lowering, op: Op):
    (a,) = op.operands
    order = tuple(op.attrs["order"])
    tv = cx.get(a)
    if tv.shape == () or tv.literal:
        cx.bind(op.results[0], tv)
        return
    shape = tuple(tv.shape[i] for i in order)
    cx.define(op.results[0], f"tl.permute({tv.expr}, {_shape_str(order)})", shape, op.loc)


@lower("concat")
def _concat(cx: Lowering, op: Op):
    # Power-of-two tiles concatenate only in equal halves: join them along a new minor
    # axis, move it in front of `axis` and merge the two (a's block first).
    a, b = op.operands
    axis = op.attrs["axis"]
    shape = cx.ir_shape(a)
    if shape != cx.ir_shape(b):
        raise LoweringError(
            f"{BACKEND}: concat of unequal tiles {shape} and {cx.ir_shape(b)}", loc=op.loc
        )
    rank = len(shape)
    joined = f"tl.join({cx.full(a)}, {cx.full(b)})"
    order = list(range(rank))
    order.insert(axis, rank)
    out = cx.ir_shape(op.results[0])
    cx.define(
        op.results[0],
        f"tl.reshape(tl.permute({joined}, {_shape_str(order)}), {_shape_str(out)})",
        out,
        op.loc,
    )


# -- reductions, scans, sorting --------------------------------------------------------------------

_COMBINE = {
    "_fly_max_nan": "return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)",
    "_fly_min_nan": "return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)",
    "_fly_max": "return tl.maximum(a, b)",
    "_fly_min": "return tl.minimum(a, b)",
    "_fly_prod": "return a * b",
}


def _combine(cx: Lowering, name: str) -> str:
    return cx.helper(name, f"\n@triton.jit\ndef {name}(a, b):\n    {_COMBINE[name]}\n")


_ARG_HELPER = """
@triton.jit
def {name}(v1, i1, v2, i2):
    # {what}: the first extreme index wins; NaN ranks highest (torch's order).
    n1 = v1 != v1
    n2 = v2 != v2
    better = (v1 {cmp} v2) | ((v1 == v2) & (i1 < i2))
    pick = (n1 & (~n2 | (i1 < i2))) | (~n1 & ~n2 & better)
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)
"""

_ARG_INT_HELPER = """
@triton.jit
def {name}(v1, i1, v2, i2):
    # {what}: the first extreme index wins.
    pick = (v1 {cmp} v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)
"""


@lower("reduce")
def _reduce(cx: Lowering, op: Op):
    (a,) = op.operands
    kind, axis = op.attrs["kind"], op.attrs["axis"]
    d = a.type.dtype
    x = cx.up(a, cx.full(a))
    if kind == "sum":
        extra = f", dtype={tl_dtype(d)}" if (d.is_int and d.bits < 32) else ""
        expr = f"tl.sum({x}, axis={axis}{extra})"
    elif kind == "xor_sum":
        expr = f"tl.xor_sum({x}, axis={axis})"
    elif kind == "prod":
        expr = f"tl.reduce({x}, {axis}, {_combine(cx, '_fly_prod')})"
    elif kind in ("max", "min"):
        if d.is_float:
            name = "_fly_max_nan" if kind == "max" else "_fly_min_nan"
        else:
            name = "_fly_max" if kind == "max" else "_fly_min"
        expr = f"tl.reduce({x}, {axis}, {_combine(cx, name)})"
    else:
        raise LoweringError(f"{BACKEND}: unknown reduction {kind!r}", loc=op.loc)
    cx.define(op.results[0], cx.down(d, expr), loc=op.loc)


def _index_along(shape, axis) -> str:
    """An int32 tile of ``shape`` holding each element's index along ``axis``."""
    n = shape[axis]
    idx = f"tl.arange(0, {n})"
    if len(shape) > 1:
        idx += "[" + ", ".join(":" if i == axis else "None" for i in range(len(shape))) + "]"
        idx = f"tl.broadcast_to({idx}, {_shape_str(shape)})"
    return idx


@lower("argreduce")
def _argreduce(cx: Lowering, op: Op):
    (a,) = op.operands
    kind, axis = op.attrs["kind"], op.attrs["axis"]
    d = a.type.dtype
    shape = cx.ir_shape(a)
    cmp = ">" if kind == "argmax" else "<"
    if d.is_float:
        name = cx.helper(
            f"_fly_{kind}", _ARG_HELPER.format(name=f"_fly_{kind}", what=kind, cmp=cmp)
        )
    else:
        name = cx.helper(
            f"_fly_{kind}_int", _ARG_INT_HELPER.format(name=f"_fly_{kind}_int", what=kind, cmp=cmp)
        )
    rv, ri = op.results
    nv, ni = cx.name_of(rv), cx.name_of(ri)
    x = cx.up(a, cx.full(a))
    cx.emit(f"{nv}, {ni} = tl.reduce(({x}, {_index_along(shape, axis)}), {axis}, {name})", op.loc)
    if cx.emulated(d):
        cx.emit(f"{nv} = {cx.down(d, nv)}", op.loc)
    cx.bind(rv, TV(nv, cx.ir_shape(rv), rv.type.dtype))
    cx.bind(ri, TV(ni, cx.ir_shape(ri), ri.type.dtype))


@lower("scan")
def _scan(cx: Lowering, op: Op):
    (a,) = op.operands
    kind, axis, rev = op.attrs["kind"], op.attrs["axis"], bool(op.attrs.get("reverse", False))
    d = a.type.dtype
    x = cx.up(a, cx.full(a))
    r = ", reverse=True" if rev else ""
    if kind in ("cumsum", "cumprod"):
        extra = f", dtype={tl_dtype(d)}" if (d.is_int and d.bits < 32) else ""
        expr = f"tl.{kind}({x}, axis={axis}{r}{extra})"
    else:
        base = "_fly_max" if kind == "cummax" else "_fly_min"
        name = _combine(cx, base + ("_nan" if d.is_float else ""))
        expr = f"tl.associative_scan({x}, {axis}, {name}{r})"
    cx.define(op.results[0], cx.down(d, expr), loc=op.loc)


def _sort_key(cx: Lowering, x: str, d: dt.DType, loc) -> str:
    """Emit an int32 key whose signed order is FlyDSL's order of ``x`` (NaN highest, -0 == +0)."""
    if d.is_float:
        if d.bits > 32:
            raise LoweringError(
                f"the {BACKEND} backend sorts 8- to 32-bit values; {d} keys do not fit beside the index"
            )
        w = d.bits
        ity = {8: "tl.int8", 16: "tl.int16", 32: "tl.int32"}[w]
        bits = cx.tmp("bits")
        src = x if not d.storage_only else cast_expr(cx, x, d, dt.fp32)
        if d.storage_only:
            ity, w = "tl.int32", 32
        cx.emit(f"{bits} = {src}.to({ity}, bitcast=True).to(tl.int32)", loc)
        mask = (1 << (w - 1)) - 1
        key = cx.tmp("key")
        cx.emit(f"{key} = {bits} ^ (({bits} >> 31) & {mask})", loc)
        xf = f"{src}.to(tl.float32)" if cx.emulated(d) else src  # NaN and zero tests by value
        cx.emit(f"{key} = tl.where({xf} == 0, 0, tl.where({xf} != {xf}, {mask}, {key}))", loc)
        return key
    if d.bits > 32:
        raise LoweringError(
            f"the {BACKEND} backend sorts 8- to 32-bit values; {d} keys do not fit beside the index"
        )
    key = cx.tmp("key")
    cx.emit(f"{key} = {x}.to(tl.int32)", loc)
    return key


def _sort_common(cx: Lowering, op: Op, k: int | None, descending: bool):
    """Stable sort / top-k by packing (key << 32) | index into int64 and sorting that."""
    (a,) = op.operands
    axis = op.attrs["axis"]
    shape = cx.ir_shape(a)
    rank = len(shape)
    d = a.type.dtype
    loc = op.loc
    x = cx.full(a)
    last = rank - 1
    if axis != last:  # Triton sorts along the last axis: move `axis` there and back
        order = [i for i in range(rank) if i != axis] + [axis]
        inv = [order.index(i) for i in range(rank)]
        xs = cx.tmp("x")
        cx.emit(f"{xs} = tl.permute({x}, {_shape_str(order)})", loc)
        x = xs
        pshape = tuple(shape[i] for i in order)
    else:
        pshape = shape
        if not x.isidentifier():
            xs = cx.tmp("x")
            cx.emit(f"{xs} = {x}", loc)
            x = xs
    key = _sort_key(cx, x, d, loc)
    if descending:
        cx.emit(f"{key} = ~{key}", loc)  # reverses the order; ties keep ascending indices
    packed = cx.tmp("packed")
    cx.emit(
        f"{packed} = ({key}.to(tl.int64) << 32) | {_index_along(pshape, last)}.to(tl.int64)", loc
    )
    if k is None:
        cx.emit(f"{packed} = tl.sort({packed}, dim={last})", loc)
    else:
        cx.emit(f"{packed} = tl.topk({packed}, {k}, dim={last}, descending=False)", loc)
    idx = cx.tmp("idx")
    cx.emit(f"{idx} = ({packed} & 0xFFFFFFFF).to(tl.int32)", loc)
    vals = f"tl.gather({x}, {idx}, {last})"
    rv, ri = op.results
    if axis != last:
        vals = f"tl.permute({vals}, {_shape_str(inv)})"
        idx = f"tl.permute({idx}, {_shape_str(inv)})"
    cx.define(rv, vals, loc=loc)
    cx.define(ri, idx, loc=loc)


@lower("sort")
def _sort(cx: Lowering, op: Op):
    _sort_common(cx, op, None, bool(op.attrs["descending"]))


@lower("topk")
def _topk(cx: Lowering, op: Op):
    _sort_common(cx, op, op.attrs["k"], bool(op.attrs["largest"]))


# -- matrix multiply ----------------------------------------------------------------------------------


@lower("histogram")
def _histogram(cx: Lowering, op: Op):
    # tl.histogram drops masked-off and out-of-range values, as the FlyIR op defines.
    args = [cx.full(op.operands[0]), str(op.attrs["num_bins"])]
    if op.attrs.get("masked"):
        args.append(f"mask={cx.full(op.operands[1])}")
    cx.define(op.results[0], f"tl.histogram({', '.join(args)})", loc=op.loc)


@lower("dot")
def _dot(cx: Lowering, op: Op):
    a, b, acc = op.operands
    d = a.type.dtype
    ea, eb = cx.full(a), cx.full(b)
    if cx.interpret and d in (dt.bf16, dt.fp16, dt.fp8e4m3, dt.fp8e5m2):
        # Triton 3.9's interpreter computes 16-bit (notably bf16) tl.dot wrongly; the
        # products are exact in fp32, so upcasting gives the reference's result.
        ea, eb = cast_expr(cx, ea, d, dt.fp32), cast_expr(cx, eb, b.type.dtype, dt.fp32)
        d = dt.fp32
    args = [ea, eb]
    tacc = cx.get(acc)
    if tacc.literal and tacc.value == 0:
        if d.is_int:
            args.append("out_dtype=tl.int32")  # a zero accumulator is Triton's default
    else:
        args.append(cx.full(acc))
    if d == dt.fp32:
        prec = op.attrs.get("input_precision", "ieee")
        if prec not in cx.dot_precisions:
            prec = "ieee"  # tf32 permits a faster product; ieee is always a valid choice
        args.append(f'input_precision="{prec}"')
    cx.define(op.results[0], f"tl.dot({', '.join(args)})", loc=op.loc)


@lower("dot_scaled")
def _dot_scaled(cx: Lowering, op: Op):
    a, sa, b, sb, acc = op.operands
    fa, fb = op.attrs["a_format"], op.attrs["b_format"]
    tacc = cx.get(acc)
    args = [cx.full(a), cx.full(sa), f'"{fa}"', cx.full(b), cx.full(sb), f'"{fb}"']
    if not (tacc.literal and tacc.value == 0):
        args.append(cx.full(acc))
    cx.define(op.results[0], f"tl.dot_scaled({', '.join(args)})", loc=op.loc)


# -- memory ------------------------------------------------------------------------------------------

_CACHE = {"ca": ".ca", "cg": ".cg", "cv": ".cv", "cs": ".cs", "wb": ".wb", "wt": ".wt"}
_EVICT = {"first": "evict_first", "last": "evict_last", "normal": ""}


def _pointer(cx: Lowering, tensor: Value, offs: Value, shape) -> str:
    ptr = cx.pnames[tensor.id]
    to = cx.get(offs)
    if to.literal and to.value == 0:
        p = ptr
        pshape = ()
    else:
        p = f"{ptr} + {cx.ref(offs)}"
        pshape = to.shape
    if tuple(pshape) != tuple(shape):
        p = f"tl.broadcast_to({p}, {_shape_str(shape)})"
    return p


@lower("load")
def _load(cx: Lowering, op: Op):
    ten, offs, *rest = op.operands
    masked, has_other = op.attrs.get("masked"), op.attrs.get("has_other")
    mask = rest.pop(0) if masked else None
    other = rest.pop(0) if has_other else None
    shapes = [cx.get(offs).shape]
    if mask is not None:
        shapes.append(cx.get(mask).shape)
    if other is not None:
        shapes.append(cx.get(other).shape)
    shape = broadcast_shape(*shapes)
    args = [_pointer(cx, ten, offs, shape)]
    if mask is not None:
        args.append(f"mask={cx.ref(mask)}")
        if other is not None:
            args.append(f"other={cx.ref(other)}")
        else:
            args.append("other=0")
    cache = op.attrs.get("cache")
    if cache:
        args.append(f'cache_modifier="{_CACHE.get(cache.lstrip("."), cache)}"')
    ev = op.attrs.get("eviction")
    if ev and cache and cx.target == "sm90":
        ev = None  # ptxas takes no eviction priority next to a cache operator; both are hints
    if ev:
        args.append(f'eviction_policy="{_EVICT.get(ev.removeprefix("evict_"), ev)}"')
    cx.define(op.results[0], f"tl.load({', '.join(args)})", shape, op.loc)


@lower("store")
def _store(cx: Lowering, op: Op):
    ten, offs, val, *rest = op.operands
    mask = rest[0] if op.attrs.get("masked") else None
    shapes = [cx.get(offs).shape, cx.get(val).shape]
    if mask is not None:
        shapes.append(cx.get(mask).shape)
    shape = broadcast_shape(*shapes)
    args = [_pointer(cx, ten, offs, shape), cx.ref(val)]
    if mask is not None:
        args.append(f"mask={cx.ref(mask)}")
    cx.emit(f"tl.store({', '.join(args)})", op.loc)


_ATOMIC_FN = {
    "add": "tl.atomic_add",
    "max": "tl.atomic_max",
    "min": "tl.atomic_min",
    "xchg": "tl.atomic_xchg",
    "and": "tl.atomic_and",
    "or": "tl.atomic_or",
    "xor": "tl.atomic_xor",
}


@lower("atomic_rmw")
def _atomic_rmw(cx: Lowering, op: Op):
    ten, offs, val, *rest = op.operands
    mask = rest[0] if op.attrs.get("masked") else None
    shape = cx.ir_shape(op.results[0])
    args = [_pointer(cx, ten, offs, shape), cx.full(val)]
    if mask is not None:
        args.append(f"mask={cx.full(mask)}")
    args.append(f'sem="{op.attrs.get("sem", "acq_rel")}"')
    d = val.type.dtype
    if cx.interpret and op.attrs["kind"] == "xchg" and d.is_float and d.bits == 32:
        # The interpreter exchanges only integers; an exchange is a move of bits.
        args[0] = f"({args[0]}).to(tl.pointer_type(tl.int32), bitcast=True)"
        args[1] = f"{args[1]}.to(tl.int32, bitcast=True)"
        expr = f"tl.atomic_xchg({', '.join(args)}).to(tl.float32, bitcast=True)"
    else:
        expr = f"{_ATOMIC_FN[op.attrs['kind']]}({', '.join(args)})"
    r = op.results[0]
    if mask is not None and r.id in cx.used:
        # Masked-off lanes return 0 in FlyIR; Triton leaves them undefined.
        expr = f"tl.where({cx.full(mask)}, {expr}, 0)"
    cx.define(r, expr, shape, op.loc)


@lower("atomic_cas")
def _atomic_cas(cx: Lowering, op: Op):
    ten, offs, cmp, val = op.operands
    shape = cx.ir_shape(op.results[0])
    expr = f'tl.atomic_cas({_pointer(cx, ten, offs, shape)}, {cx.full(cmp)}, {cx.full(val)}, sem="acq_rel")'
    cx.define(op.results[0], expr, shape, op.loc)


@lower("range_mask")
def _range_mask(cx: Lowering, op: Op):
    start, extent = op.operands
    axis, length, shape = op.attrs["axis"], op.attrs["length"], tuple(op.attrs["shape"])
    ts = cx.get(start)
    s, e = cx.ref(start), cx.ref(extent)
    if axis < 0 or length == 1:
        if ts.literal and cx.get(extent).literal:
            s = cx.scalar_tensor(ts)
        cx.define(op.results[0], f"{s} < {e}", (), op.loc)  # one test for the whole tile
        return
    ar = f"tl.arange(0, {length})"
    vshape = [1] * len(shape)
    vshape[axis] = length
    if len(shape) > 1:
        ar += "[" + ", ".join(":" if i == axis else "None" for i in range(len(shape))) + "]"
    lhs = ar if (ts.literal and ts.value == 0) else f"{s} + {ar}"
    cx.define(op.results[0], f"{lhs} < {e}", tuple(vshape), op.loc)


# -- structured control flow -----------------------------------------------------------------------


def _assign_carried(cx: Lowering, names: list[str], vals: list[Value], loc):
    """``names = vals`` for loop-carried / branch values, at their full IR shapes."""
    pairs = [(n, cx.full(v)) for n, v in zip(names, vals)]
    pairs = [(n, e) for n, e in pairs if n != e]
    if not pairs:
        return
    rhs_names = {e for _, e in pairs}
    if len(pairs) > 1 and any(n in rhs_names for n, _ in pairs):
        cx.emit(f"{', '.join(n for n, _ in pairs)} = {', '.join(e for _, e in pairs)}", loc)
        return
    last = cx.last_def
    if last is not None and last[0] == len(cx.lines) - 1:
        line, name, vid = last
        for k, (n, e) in enumerate(pairs):
            prefix = "    " * cx.indent + f"{name} = "
            if e == name and cx.use_count.get(vid, 0) == 1 and cx.lines[line].startswith(prefix):
                # the value exists only to be carried: compute it into the carried name
                cx.lines[line] = "    " * cx.indent + f"{n} = " + cx.lines[line][len(prefix) :]
                del pairs[k]
                cx.last_def = None
                break
    for n, e in pairs:
        cx.emit(f"{n} = {e}", loc)


def _hint(cx: Lowering, v: Value, name: str, d: int, loc):
    if d >= 2 and isinstance(v.type, TileType) and v.type.shape == () and v.type.dtype.is_int:
        cx.emit(f"{name} = tl.multiple_of({name}, {d})", loc)


@lower("for")
def _for(cx: Lowering, op: Op):
    lo, hi, st, *init = op.operands
    (body,) = op.regions
    iv, *args = body.args
    loc = op.loc
    names = [cx.name_of(a) for a in args]
    _assign_carried(cx, names, init, loc)
    for a, n in zip(args, names):
        cx.bind(a, TV(n, cx.ir_shape(a), a.type.dtype))
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
        _hint(cx, a, n, _carried_divisor(cx, op, a), loc)
    cx.block(body)
    _assign_carried(cx, names, list(body.terminator.operands), loc)
    if len(cx.lines) == start:
        cx.emit("pass")
    cx.indent -= 1
    cx._last_loc = None
    for r, n in zip(op.results, names):
        cx.bind(r, TV(n, cx.ir_shape(r), r.type.dtype))


@lower("if")
def _if(cx: Lowering, op: Op):
    c = op.operands[0]
    then, other = op.regions
    loc = op.loc
    names = [cx.name_of(r) for r in op.results]
    cx.emit(f"if {cx.ref(c)}:", loc)
    for i, region in enumerate((then, other)):
        if i == 1:
            if not region.ops[:-1] and not names:
                break
            cx.emit("else:")
        cx.indent += 1
        start = len(cx.lines)
        cx.block(region)
        _assign_carried(cx, names, list(region.terminator.operands), loc)
        if len(cx.lines) == start:
            cx.emit("pass")
        cx.indent -= 1
        cx._last_loc = None
    for r, n in zip(op.results, names):
        cx.bind(r, TV(n, cx.ir_shape(r), r.type.dtype))


@lower("while")
def _while(cx: Lowering, op: Op):
    # The condition is computed before the loop and again at the end of the body;
    # the second copy's temporaries get fresh names so Triton does not carry them.
    before, body = op.regions
    loc = op.loc
    names = [cx.name_of(a) for a in before.args]
    _assign_carried(cx, names, list(op.operands), loc)
    for region in (before, body):
        for a, n in zip(region.args, names):
            cx.bind(a, TV(n, cx.ir_shape(a), a.type.dtype))
    cond_var = cx.tmp("cond")
    cx.block(before)
    cx.emit(f"{cond_var} = {cx.full(before.terminator.operands[0])}", loc)
    cx.emit(f"while {cond_var}:", loc)
    cx.indent += 1
    cx.block(body)
    _assign_carried(cx, names, list(body.terminator.operands), loc)
    for o in before.walk():
        for r in o.results:
            cx._fresh[r.id] = cx._fresh.get(r.id, 0) + 1
        for rg in o.regions:
            for a in rg.args:
                cx._fresh[a.id] = cx._fresh.get(a.id, 0) + 1
    cx.block(before)
    cx.emit(f"{cond_var} = {cx.full(before.terminator.operands[0])}", loc)
    cx.indent -= 1
    cx._last_loc = None
    for r, n in zip(op.results, names):
        cx.bind(r, TV(n, cx.ir_shape(r), r.type.dtype))


# -- divisibility of loop-carried scalars ----------------------------------------------------------


def _divisor(cx: Lowering, v: Value, assume: dict[int, int]) -> int:
    if v.id in assume:
        return assume[v.id]
    op = v.owner
    if isinstance(op, Op) and op.name in ("add", "sub", "mul") and v.type.shape == ():
        a, b = (_divisor(cx, x, assume) for x in op.operands)
        return math.gcd(a, b) if op.name != "mul" else min(1 << 30, a * b)
    return cx.facts.divisor(v)


def _carried_divisor(cx: Lowering, loop: Op, arg: Value) -> int:
    """The largest power of two that divides a loop-carried scalar on every iteration."""
    if not (isinstance(arg.type, TileType) and arg.type.shape == () and arg.type.dtype.is_int):
        return 1
    (body,) = loop.regions
    i = body.args.index(arg) - 1
    init = loop.operands[3 + i]
    y = body.terminator.operands[i]
    d = cx.facts.divisor(init)
    while d > 1:
        nd = math.gcd(d, _divisor(cx, y, {arg.id: d}))
        if nd == d:
            break
        d = nd
    return d if d < (1 << 30) else 1


# -- the function -------------------------------------------------------------------------------------


def _kernel_params(
    fn: Function, used: set[int], amd: bool
) -> tuple[list[KernelParam], dict[int, str]]:
    """The used run-time parameters, in ``fn.params`` order, and value id -> parameter name."""
    params: list[KernelParam] = []
    names: dict[int, str] = {}
    runtime = [p for p in fn.params if p.kind in ("tensor", "scalar")]
    arg_of = {p.name: i for i, p in enumerate(runtime)}
    taken: set[str] = set()

    def unique(n):
        while n in taken:
            n += "_"
        taken.add(n)
        return n

    for p in fn.params:
        if p.value is None or p.kind == "constexpr":
            continue
        if p.kind == "tensor":
            name = unique(_safe(p.name + "_ptr"))
        elif p.kind in ("shape", "stride"):
            name = unique(_safe(f"{p.of}_{'size' if p.kind == 'shape' else 'stride'}{p.dim}"))
        else:
            name = unique(_safe(p.name))
        names[p.value.id] = name
        if p.value.id not in used:
            continue  # specialized away (a stride of 1, a static size) or never read
        if p.kind == "tensor":
            t: TensorType = p.value.type
            bits = p.facts.get("index_bits", 64)
            params.append(
                KernelParam(
                    name,
                    "tensor",
                    "*" + SIG_TYPES[t.dtype],
                    arg_of[p.name],
                    divisibility=16 if p.facts.get("aligned") else None,
                    pointer_range_32=amd and bits == 32,
                    index_bits=bits,
                )
            )
            continue
        d = p.value.type.dtype
        arg = arg_of[p.of] if p.kind in ("shape", "stride") else arg_of[p.name]
        div = 16 if p.facts.get("div") == 16 and d.is_int else None
        params.append(KernelParam(name, p.kind, SIG_TYPES[d], arg, dim=p.dim, divisibility=div))
    return params, names


_TL_FLOAT = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16"}


def _header(fn: Function, target: str, interpret: bool) -> str:
    where = ""
    if fn.loc is not None:
        where = f" ({os.path.basename(fn.loc.file)}:{fn.loc.line})"
    consts = ", ".join(f"{k}={v!r}" for k, v in sorted(fn.constexprs.items()))
    lines = [
        f'"""Triton source of FlyDSL kernel `{fn.name}`{where} for target {target}.',
        "",
        "Generated by flydsl_core.backends.triton from its FlyIR; v<N> is %N of the printed IR.",
    ]
    if consts:
        lines.append(f"Compile-time constants: {consts}.")
    if interpret:
        lines.append("For Triton's interpreter: dot upcasts 16-bit and fp8 operands to fp32.")
    lines.append('"""')
    return "\n".join(lines)


def generate(
    fn: Function,
    target: str,
    *,
    interpret: bool = False,
    dot_precisions=("ieee",),
    amd: bool = False,
) -> GeneratedKernel:
    """The Triton source of ``fn`` for ``target``."""
    used = _uses(fn)
    params, pnames = _kernel_params(fn, used, amd)
    cx = Lowering(fn, target, interpret=interpret, dot_precisions=dot_precisions, amd=amd)
    cx.used = used
    for op in fn.walk():
        for v in op.operands:
            cx.use_count[v.id] = cx.use_count.get(v.id, 0) + 1
    for p in fn.params:
        if p.value is not None and p.kind != "constexpr":
            cx.pnames[p.value.id] = pnames[p.value.id]
            if p.kind != "tensor":
                cx.bind(p.value, TV(pnames[p.value.id], (), p.value.type.dtype))
    # Parameters Triton types from the signature; the interpreter types ints by value,
    # so 64-bit ones are widened explicitly (a no-op when compiled). tl.cast, not .to: a
    # launcher that specializes an argument equal to 1 into a constexpr (Triton's JIT,
    # its interpreter; torch's wrap_triton hands our kernels to them) passes a plain int.
    for kp in params:
        if kp.sig == "i64":
            cx.emit(f"{kp.name} = tl.cast({kp.name}, tl.int64)")
        elif interpret and kp.kind == "scalar" and kp.sig.startswith("fp"):
            cx.emit(
                f"{kp.name} = tl.full((), {kp.name}, tl.{_TL_FLOAT[kp.sig]})"
            )  # a Python float there
    fn_name = _safe(fn.name)
    cx.block(fn.body)
    if not cx.lines:
        cx.emit("pass")
    out = [_header(fn, target, interpret), "", "import triton", "import triton.language as tl"]
    if cx.uses_libdevice:
        out.append("from triton.language.extra import libdevice")
    out.append("")
    for text in cx.helpers.values():
        out.append(text.rstrip("\n"))
        out.append("")
    out.append("")
    out.append("@triton.jit")
    out.append(f"def {fn_name}({', '.join(p.name for p in params)}):")
    first = len(out)
    out += cx.lines
    line_locs = {first + i + 1: loc for i, loc in cx.line_locs.items()}
    source = "\n".join(out) + "\n"
    nargs = sum(1 for p in fn.params if p.kind in ("tensor", "scalar"))
    return GeneratedKernel(fn_name, source, params, target, interpret, nargs, line_locs)


__all__ = [
    "LOWERINGS",
    "SIG_TYPES",
    "GeneratedKernel",
    "KernelParam",
    "Lowering",
    "generate",
    "lower",
    "value_numbers",
]
