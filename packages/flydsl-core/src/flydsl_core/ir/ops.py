"""The operation set of FlyIR: each op's operand slots, effects and type rule.

Each op is declared once with ``@op(...)``:

* ``operands`` names its operand slots in order. ``name?`` is optional and
  ``name*`` variadic (the last slot). Optional slots follow the required ones
  and fill in order, like Python's defaulted parameters: a load's ``other?``
  is present only with its ``mask?``. So an op's operand count alone says
  which slots it has, and ``Op.operand(name)`` / ``Op.operand_list(name)``
  read them; no reader decodes flags of its own.
* ``effects`` says what it does besides computing its results: nothing
  (pure, the default), ``"read"`` memory or ``"write"`` memory. ``fold``,
  ``cse`` and ``dce`` ask the ``OpDef`` (``pure``, ``reads_memory``,
  ``writes_memory``); terminators are marked ``terminator``.
* The decorated function is its type rule (abstract evaluation): it gets the
  operand types by slot (``t.tensor``, ``t.mask``; ``None`` for an absent
  optional slot, a list for a variadic one) and the attrs, and returns the
  result types or raises ``TypeCheckError``. The tracer and the verifier both
  call it, so a type error found while tracing and one introduced by a pass
  read the same.

FlyIR is explicit: binary ops need operands of one dtype and one shape. The
tracer inserts the ``cast`` and ``broadcast`` ops that Python's operator
syntax implies; backends never guess.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

from .. import dtypes as dt
from ..exc import TypeCheckError
from .types import TensorType, TileType

EFFECTS = ("read", "write")


@dataclass(frozen=True)
class Slot:
    """One operand slot of an op: ``kind`` is ``one``, ``optional`` or ``variadic``."""

    name: str
    kind: str = "one"

    @classmethod
    def parse(cls, spec: str) -> Slot:
        if spec.endswith("?"):
            return cls(spec[:-1], "optional")
        if spec.endswith("*"):
            return cls(spec[:-1], "variadic")
        return cls(spec)

    def __str__(self) -> str:
        return self.name + {"one": "", "optional": "?", "variadic": "*"}[self.kind]


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: Callable
    slots: tuple[Slot, ...] = ()
    effects: frozenset[str] = frozenset()
    terminator: bool = False
    num_regions: int = 0

    # -- effects ------------------------------------------------------------------------
    @property
    def pure(self) -> bool:
        """No memory effects and no control: equal operands and attrs give equal results."""
        return not self.effects and not self.terminator

    @property
    def reads_memory(self) -> bool:
        return "read" in self.effects

    @property
    def writes_memory(self) -> bool:
        return "write" in self.effects

    # -- operand slots --------------------------------------------------------------------
    @property
    def signature(self) -> str:
        return ", ".join(map(str, self.slots))

    def arity(self) -> tuple[int, int | None]:
        """The fewest and most operands (``None``: no most)."""
        lo = sum(s.kind == "one" for s in self.slots)
        if any(s.kind == "variadic" for s in self.slots):
            return lo, None
        return lo, len(self.slots)

    def index(self, slot: str) -> int:
        """The operand position of ``slot`` (the first one of a variadic slot)."""
        for i, s in enumerate(self.slots):
            if s.name == slot:
                return i
        raise KeyError(f"op {self.name!r} has no operand slot {slot!r} ({self.signature})")

    def check_count(self, n: int) -> None:
        lo, hi = self.arity()
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"{lo} or more"
            raise TypeCheckError(f"{self.name} takes {want} operands ({self.signature}), got {n}")

    def bind(self, items: Sequence) -> SimpleNamespace:
        """``items`` (operands or their types) by slot name: absent optional slots are None."""
        self.check_count(len(items))
        out = {}
        for i, s in enumerate(self.slots):
            if s.kind == "variadic":
                out[s.name] = list(items[i:])
            else:
                out[s.name] = items[i] if i < len(items) else None
        return SimpleNamespace(**out)


OPS: dict[str, OpDef] = {}


def op(
    name: str,
    operands: Sequence[str],
    *,
    effects: Sequence[str] = (),
    terminator: bool = False,
    regions: int = 0,
):
    """Declare op ``name`` with its operand slots, effects and (the decorated) type rule."""
    slots = tuple(Slot.parse(s) for s in operands)
    kinds = [s.kind for s in slots]
    if "variadic" in kinds[:-1] or ("variadic" in kinds and "optional" in kinds):
        raise RuntimeError(f"op {name!r}: a variadic slot must be the last and only one")
    first_optional = kinds.index("optional") if "optional" in kinds else len(kinds)
    if "one" in kinds[first_optional:]:
        raise RuntimeError(f"op {name!r}: optional slots must follow the required ones")
    if len({s.name for s in slots}) != len(slots):
        raise RuntimeError(f"op {name!r}: operand slot names must differ")
    bad = set(effects) - set(EFFECTS)
    if bad:
        raise RuntimeError(f"op {name!r}: unknown effects {sorted(bad)}; known: {EFFECTS}")

    def deco(fn):
        if name in OPS:
            raise RuntimeError(f"op {name!r} declared twice")
        OPS[name] = OpDef(name, fn, slots, frozenset(effects), terminator, regions)
        return fn

    return deco


def opdef(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise TypeCheckError(f"unknown FlyIR op {name!r}") from None


def _tile(t, what="operand") -> TileType:
    if not isinstance(t, TileType):
        raise TypeCheckError(f"{what} must be a tile, got {t}")
    return t


def _same(a: TileType, b: TileType, name: str):
    if a != b:
        raise TypeCheckError(f"{name} needs operands of one type, got {a} and {b}")


def _float(t: TileType, name: str):
    if not t.dtype.is_float:
        raise TypeCheckError(f"{name} needs a floating-point tile, got {t}")
    if t.dtype.storage_only:
        raise TypeCheckError(f"{name} cannot compute in {t.dtype}; cast to fp32 first")


def _arith(t: TileType, name: str):
    if t.dtype.storage_only:
        raise TypeCheckError(
            f"{name} cannot compute in {t.dtype}: fp8 tiles only load, store, convert "
            "and feed dot; cast to fp32 first"
        )


# --- leaves ------------------------------------------------------------------


@op("constant", ())
def _constant(t, attrs):
    return [TileType(attrs["dtype"], tuple(attrs.get("shape", ())))]


@op("arange", ())
def _arange(t, attrs):
    if attrs["end"] <= attrs["start"]:
        raise TypeCheckError(f"arange({attrs['start']}, {attrs['end']}) is empty")
    return [TileType(dt.int32, (attrs["end"] - attrs["start"],))]


@op("program_id", ())
def _program_id(t, attrs):
    if attrs["axis"] not in (0, 1, 2):
        raise TypeCheckError(f"program_id axis must be 0, 1 or 2, got {attrs['axis']}")
    return [TileType(dt.int32)]


@op("num_programs", ())
def _num_programs(t, attrs):
    return _program_id(t, attrs)


# --- elementwise -------------------------------------------------------------

BINARY_ARITH = ("add", "sub", "mul", "truediv", "intdiv", "mod", "maximum", "minimum", "pow")
BINARY_BITS = ("and", "or", "xor", "shl", "shr")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
UNARY_ANY = ("neg", "abs")
UNARY_FLOAT = (
    "exp",
    "exp2",
    "log",
    "log2",
    "sqrt",
    "rsqrt",
    "erf",
    "tanh",
    "reciprocal",
    "sigmoid",
    "sin",
    "cos",
    "floor",
    "ceil",
)


def _binary_rule(name):
    def rule(t, attrs):
        a, b = _tile(t.lhs), _tile(t.rhs)
        _same(a, b, name)
        _arith(a, name)
        if name == "truediv" or name == "pow":
            _float(a, name)
        if name == "intdiv" and not (a.dtype.is_int or a.dtype.is_bool):
            raise TypeCheckError(f"intdiv needs integer tiles, got {a}")
        return [a]

    return rule


def _bits_rule(name):
    def rule(t, attrs):
        a, b = _tile(t.lhs), _tile(t.rhs)
        _same(a, b, name)
        if not (a.dtype.is_int or a.dtype.is_bool):
            raise TypeCheckError(f"{name} needs integer or bool tiles, got {a}; bitcast first")
        return [a]

    return rule


def _compare_rule(name):
    def rule(t, attrs):
        a, b = _tile(t.lhs), _tile(t.rhs)
        _same(a, b, name)
        _arith(a, name)
        return [a.with_dtype(dt.bool_)]

    return rule


def _unary_rule(name, floating):
    def rule(t, attrs):
        a = _tile(t.x)
        _arith(a, name)
        if floating:
            _float(a, name)
        return [a]

    return rule


for _n in BINARY_ARITH:
    op(_n, ("lhs", "rhs"))(_binary_rule(_n))
for _n in BINARY_BITS:
    op(_n, ("lhs", "rhs"))(_bits_rule(_n))
for _n in COMPARE:
    op(_n, ("lhs", "rhs"))(_compare_rule(_n))
for _n in UNARY_ANY:
    op(_n, ("x",))(_unary_rule(_n, False))
for _n in UNARY_FLOAT:
    op(_n, ("x",))(_unary_rule(_n, True))


@op("invert", ("x",))
def _invert(t, attrs):
    a = _tile(t.x)
    if not (a.dtype.is_int or a.dtype.is_bool):
        raise TypeCheckError(f"~ needs an integer or bool tile, got {a}")
    return [a]


@op("hint", ("x",))
def _hint(t, attrs):
    """Facts about an integer tile's values, for backends that vectorize on them.

    ``contiguous[d] = c``: along axis ``d`` the values come in aligned runs of
    ``c`` consecutive integers; ``multiple_of[d] = m``: the first value of
    every run is divisible by ``m`` (Triton's AxisInfo contiguity and
    divisibility). One entry per axis (one for a scalar), powers of two. The
    result equals the operand; the reference backend checks the facts.
    """
    a = _tile(t.x)
    if not a.dtype.is_int:
        raise TypeCheckError(f"hint facts describe integer tiles, got {a}")
    n = max(a.rank, 1)
    for key in ("contiguous", "multiple_of"):
        v = attrs[key]
        if len(v) != n or any(not isinstance(x, int) or x < 1 or x & (x - 1) for x in v):
            raise TypeCheckError(f"hint {key} must be {n} power(s) of two for {a}, got {v}")
    c = attrs["contiguous"]
    if a.rank == 0 and c != (1,):
        raise TypeCheckError(f"a scalar cannot be contiguous, got contiguous={c}")
    if any(s % x for s, x in zip(a.shape, c)):
        raise TypeCheckError(f"hint contiguous runs {c} must divide the shape of {a}")
    return [a]


@op("cast", ("x",))
def _cast(t, attrs):
    a = _tile(t.x)
    return [a.with_dtype(attrs["dtype"])]


@op("bitcast", ("x",))
def _bitcast(t, attrs):
    a = _tile(t.x)
    to = attrs["dtype"]
    if to.bits != a.dtype.bits or to.is_bool or a.dtype.is_bool:
        raise TypeCheckError(f"bitcast from {a.dtype} to {to} needs equal bit widths")
    return [a.with_dtype(to)]


@op("rescale", ("x", "factor"))
def _rescale(t, attrs):
    """``x * factor`` (one float type and shape): the same values as a ``mul``; a backend may
    skip the multiply where every factor it would apply is exactly 1 (a skipped ``x * 1.0`` is
    ``x``), e.g. an online softmax's accumulator rescale, whose factors are mostly 1."""
    a, b = _tile(t.x), _tile(t.factor)
    _same(a, b, "rescale")
    _float(a, "rescale")
    return [a]


@op("where", ("cond", "x", "y"))
def _where(t, attrs):
    c, a, b = _tile(t.cond), _tile(t.x), _tile(t.y)
    if c.dtype != dt.bool_:
        raise TypeCheckError(f"where's condition must be bool, got {c}")
    _same(a, b, "where")
    if c.shape != a.shape:
        raise TypeCheckError(f"where's condition has shape {c.shape}, values {a.shape}")
    return [a]


# --- shape -------------------------------------------------------------------


@op("broadcast", ("x",))
def _broadcast(t, attrs):
    a = _tile(t.x)
    shape = tuple(attrs["shape"])
    if len(shape) != a.rank and a.rank != 0:
        raise TypeCheckError(f"broadcast keeps the rank ({a.shape} -> {shape}); reshape first")
    for s, d in zip(a.shape, shape):
        if s not in (1, d):
            raise TypeCheckError(f"cannot broadcast shape {a.shape} to {shape}")
    return [a.with_shape(shape)]


@op("reshape", ("x",))
def _reshape(t, attrs):
    a = _tile(t.x)
    shape = tuple(attrs["shape"])
    new = TileType(a.dtype, shape)
    if new.numel != a.numel:
        raise TypeCheckError(f"cannot reshape {a.shape} ({a.numel} elements) to {shape}")
    return [new]


@op("permute", ("x",))
def _permute(t, attrs):
    a = _tile(t.x)
    order = tuple(attrs["order"])
    if sorted(order) != list(range(a.rank)):
        raise TypeCheckError(f"permute order {order} is not a permutation of {a.rank} axes")
    return [a.with_shape(tuple(a.shape[i] for i in order))]


@op("concat", ("a", "b"))
def _concat(t, attrs):
    a, b = _tile(t.a), _tile(t.b)
    _same(a.with_shape(()), b.with_shape(()), "concat")
    axis = attrs["axis"]
    if a.rank != b.rank or any(
        x != y for i, (x, y) in enumerate(zip(a.shape, b.shape)) if i != axis
    ):
        raise TypeCheckError(f"concat along {axis} needs matching shapes, got {a} and {b}")
    shape = list(a.shape)
    shape[axis] += b.shape[axis]
    return [a.with_shape(tuple(shape))]


# --- reductions, scans, sorting ------------------------------------------------

REDUCE_KINDS = ("sum", "max", "min", "xor_sum", "prod")


def _axis(a: TileType, axis: int, name: str) -> int:
    if not 0 <= axis < a.rank:
        raise TypeCheckError(f"{name} axis {axis} is out of range for {a}")
    return axis


def _drop(shape, axis):
    return tuple(s for i, s in enumerate(shape) if i != axis)


@op("reduce", ("x",))
def _reduce(t, attrs):
    a = _tile(t.x)
    if attrs["kind"] not in REDUCE_KINDS:
        raise TypeCheckError(f"unknown reduction {attrs['kind']!r}; known: {REDUCE_KINDS}")
    _arith(a, "reduce")
    if attrs["kind"] == "xor_sum" and not a.dtype.is_int:
        raise TypeCheckError(f"xor_sum needs an integer tile, got {a}")
    axis = _axis(a, attrs["axis"], "reduce")
    return [a.with_shape(_drop(a.shape, axis))]


@op("argreduce", ("x",))
def _argreduce(t, attrs):
    a = _tile(t.x)
    if attrs["kind"] not in ("argmax", "argmin"):
        raise TypeCheckError(f"unknown arg-reduction {attrs['kind']!r}")
    _arith(a, attrs["kind"])
    axis = _axis(a, attrs["axis"], attrs["kind"])
    shape = _drop(a.shape, axis)
    return [a.with_shape(shape), TileType(dt.int32, shape)]


@op("scan", ("x",))
def _scan(t, attrs):
    a = _tile(t.x)
    if attrs["kind"] not in ("cumsum", "cumprod", "cummax", "cummin"):
        raise TypeCheckError(f"unknown scan {attrs['kind']!r}")
    _arith(a, "scan")
    _axis(a, attrs["axis"], "scan")
    return [a]


@op("sort", ("x",))
def _sort(t, attrs):
    a = _tile(t.x)
    _arith(a, "sort")
    _axis(a, attrs["axis"], "sort")
    return [a, a.with_dtype(dt.int32)]


@op("topk", ("x",))
def _topk(t, attrs):
    a = _tile(t.x)
    _arith(a, "topk")
    axis = _axis(a, attrs["axis"], "topk")
    k = attrs["k"]
    if not 1 <= k <= a.shape[axis]:
        raise TypeCheckError(f"topk k={k} must be in [1, {a.shape[axis]}] for {a}")
    shape = list(a.shape)
    shape[axis] = k
    return [a.with_shape(tuple(shape)), TileType(dt.int32, tuple(shape))]


@op("histogram", ("values", "mask?"))
def _histogram(t, attrs):
    """Counts of each value in ``[0, num_bins)`` of a 1-D int32 tile, as an int32 ``[num_bins]``.

    With a ``mask`` (a bool tile of the same shape), masked-off elements are not
    counted; neither are values outside ``[0, num_bins)``.
    Added for radix select (TopK): a digit histogram per block of keys.
    """
    a = _tile(t.values)
    if a.rank != 1 or a.dtype != dt.int32:
        raise TypeCheckError(f"histogram needs a 1-D int32 tile, got {a}")
    if t.mask is not None:
        _mask(t.mask, a.shape)
    nb = attrs["num_bins"]
    if not isinstance(nb, int) or nb < 1:
        raise TypeCheckError(f"histogram num_bins must be a positive int, got {nb!r}")
    return [TileType(dt.int32, (nb,))]


# --- matrix multiply -----------------------------------------------------------

DOT_INPUTS = {dt.bf16, dt.fp16, dt.fp32, dt.fp8e4m3, dt.fp8e5m2, dt.int8}


@op("dot", ("a", "b", "acc"))
def _dot(t, attrs):
    a, b, acc = _tile(t.a), _tile(t.b), _tile(t.acc)
    if a.rank not in (2, 3) or b.rank != a.rank:
        raise TypeCheckError(f"dot needs two 2-D (or 3-D batched) tiles, got {a} and {b}")
    if a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise TypeCheckError(f"dot shapes do not chain: {a.shape} x {b.shape}")
    if a.dtype not in DOT_INPUTS or b.dtype not in DOT_INPUTS:
        raise TypeCheckError(f"dot inputs must be one of {sorted(map(str, DOT_INPUTS))}")
    if a.dtype.is_int != b.dtype.is_int:
        raise TypeCheckError(f"dot cannot mix integer and float inputs ({a.dtype}, {b.dtype})")
    out = (*a.shape[:-1], b.shape[-1])
    if acc.shape != out:
        raise TypeCheckError(f"dot accumulator has shape {acc.shape}, expected {out}")
    want = dt.int32 if a.dtype.is_int else dt.fp32
    if acc.dtype != want:
        raise TypeCheckError(f"dot accumulates in {want}, got an accumulator of {acc.dtype}")
    return [acc]


MX_FORMATS = {"e4m3": 1, "e5m2": 1, "e2m1": 2}  # elements per byte in memory


@op("dot_scaled", ("a", "a_scale", "b", "b_scale", "acc"))
def _dot_scaled(t, attrs):
    a, sa, b, sb = _tile(t.a), _tile(t.a_scale), _tile(t.b), _tile(t.b_scale)
    acc = _tile(t.acc)
    fa, fb = attrs["a_format"], attrs["b_format"]
    for f in (fa, fb):
        if f not in MX_FORMATS:
            raise TypeCheckError(f"unknown MX element format {f!r}; known: {sorted(MX_FORMATS)}")
    if a.rank != 2 or b.rank != 2:
        raise TypeCheckError("dot_scaled needs 2-D tiles")
    m, ka = a.shape
    kb, n = b.shape
    k = ka * MX_FORMATS[fa]
    if kb * MX_FORMATS[fb] != k:
        raise TypeCheckError(f"dot_scaled K does not match: a holds {k}, b {kb * MX_FORMATS[fb]}")
    if k % 32:
        raise TypeCheckError(f"dot_scaled K={k} must be a multiple of the MX block (32)")
    if sa.shape != (m, k // 32) or sb.shape != (n, k // 32):
        raise TypeCheckError(
            f"dot_scaled scales must be [M, K/32]={(m, k // 32)} and [N, K/32]={(n, k // 32)}, "
            f"got {sa.shape} and {sb.shape}"
        )
    if sa.dtype != dt.uint8 or sb.dtype != dt.uint8:
        raise TypeCheckError("dot_scaled scales are E8M0 bytes (uint8 tiles)")
    if acc.shape != (m, n) or acc.dtype != dt.fp32:
        raise TypeCheckError(f"dot_scaled accumulates into fp32 [{m}, {n}], got {acc}")
    return [acc]


# --- memory --------------------------------------------------------------------


def _tensor(t) -> TensorType:
    if not isinstance(t, TensorType):
        raise TypeCheckError(f"memory op needs a tensor argument, got {t}")
    return t


def _offsets(t, what="offsets") -> TileType:
    t = _tile(t, what)
    if not t.dtype.is_int:
        raise TypeCheckError(f"{what} must be an integer tile, got {t}")
    return t


def _mask(t, shape):
    t = _tile(t, "mask")
    if t.dtype != dt.bool_ or t.shape != shape:
        raise TypeCheckError(f"mask must be a bool tile of shape {shape}, got {t}")


@op("load", ("tensor", "offsets", "mask?", "other?"), effects=("read",))
def _load(t, attrs):
    """Masked-off elements read ``other``, or 0 without it (``other`` needs the mask)."""
    ten, off = _tensor(t.tensor), _offsets(t.offsets)
    if t.mask is not None:
        _mask(t.mask, off.shape)
    if t.other is not None:
        other = _tile(t.other, "other")
        if other != TileType(ten.dtype, off.shape):
            raise TypeCheckError(
                f"load's other must be {TileType(ten.dtype, off.shape)}, got {other}"
            )
    return [TileType(ten.dtype, off.shape)]


@op("load_at", ("tensor", "base", "offsets", "mask?", "other?"), effects=("read",))
def _load_at(t, attrs):
    """``load`` of the elements at ``base + offsets``: ``base`` an integer scalar (of the
    offsets' dtype) added to every offset. Backends may fold it into the address the
    offsets are taken from (AMD buffer loads: the buffer's base, so that offsets which do
    not change across a loop stay in registers) unless the attribute ``fold_base`` is False."""
    base = _tile(t.base, "base")
    if base.shape != () or not base.dtype.is_int:
        raise TypeCheckError(f"load_at's base must be an integer scalar, got {base}")
    off = _offsets(t.offsets)
    if base.dtype != off.dtype:
        raise TypeCheckError(f"load_at's base {base} and offsets {off} need one integer dtype")
    return _load(
        SimpleNamespace(tensor=t.tensor, offsets=t.offsets, mask=t.mask, other=t.other), attrs
    )


@op("store", ("tensor", "offsets", "value", "mask?"), effects=("write",))
def _store(t, attrs):
    ten, off, val = _tensor(t.tensor), _offsets(t.offsets), _tile(t.value, "value")
    if val != TileType(ten.dtype, off.shape):
        raise TypeCheckError(f"store value must be {TileType(ten.dtype, off.shape)}, got {val}")
    if t.mask is not None:
        _mask(t.mask, off.shape)
    return []


ATOMIC_KINDS = ("add", "max", "min", "xchg", "and", "or", "xor")


@op("atomic_rmw", ("tensor", "offsets", "value", "mask?"), effects=("read", "write"))
def _atomic(t, attrs):
    """Returns the old values; masked-off lanes do nothing and return 0."""
    if attrs["kind"] not in ATOMIC_KINDS:
        raise TypeCheckError(f"unknown atomic {attrs['kind']!r}; known: {ATOMIC_KINDS}")
    ten, off, val = _tensor(t.tensor), _offsets(t.offsets), _tile(t.value, "value")
    if val != TileType(ten.dtype, off.shape):
        raise TypeCheckError(f"atomic value must be {TileType(ten.dtype, off.shape)}, got {val}")
    if t.mask is not None:
        _mask(t.mask, off.shape)
    return [val]


@op("atomic_cas", ("tensor", "offsets", "cmp", "value"), effects=("read", "write"))
def _atomic_cas(t, attrs):
    ten, off = _tensor(t.tensor), _offsets(t.offsets)
    want = TileType(ten.dtype, off.shape)
    if _tile(t.cmp) != want or _tile(t.value) != want:
        raise TypeCheckError(f"atomic_cas compare and value must be {want}")
    return [want]


@op("range_mask", ("start", "extent"))
def _range_mask(t, attrs):
    """``start + i < extent`` for ``i`` along ``axis`` of a ``shape`` tile.

    The bounds mask of a view. It stays a structured op so the mask
    elimination pass can prove it away from divisibility facts.
    """
    start, extent = _tile(t.start), _tile(t.extent)
    if not (start.is_scalar and extent.is_scalar and start.dtype.is_int and extent.dtype.is_int):
        raise TypeCheckError("range_mask needs scalar integer start and extent")
    shape = tuple(attrs["shape"])
    axis = attrs["axis"]
    if axis >= len(shape) or (axis >= 0 and shape[axis] != attrs["length"]):
        raise TypeCheckError("range_mask length does not match its shape")
    return [TileType(dt.bool_, shape)]


# --- structured control flow ---------------------------------------------------


@op("yield", ("values*",), terminator=True)
def _yield(t, attrs):
    return []


@op("condition", ("cond",), terminator=True)
def _condition(t, attrs):
    if _tile(t.cond) != TileType(dt.bool_):
        raise TypeCheckError(f"a while condition must be a scalar bool, got {t.cond}")
    return []


@op("for", ("lo", "hi", "step", "init*"), regions=1)
def _for(t, attrs):
    for b, n in ((t.lo, "start"), (t.hi, "stop"), (t.step, "step")):
        b = _tile(b, n)
        if not (b.is_scalar and b.dtype.is_int):
            raise TypeCheckError(f"loop {n} must be a scalar integer, got {b}")
    return list(t.init)


@op("if", ("cond", "init*"), regions=2)
def _if(t, attrs):
    if _tile(t.cond) != TileType(dt.bool_):
        raise TypeCheckError(f"an if condition must be a scalar bool, got {t.cond}")
    return list(t.init)


@op("while", ("init*",), regions=2)
def _while(t, attrs):
    return list(t.init)


def infer(name: str, operand_types, attrs):
    """The result types of op ``name`` on operands of ``operand_types`` (in slot order)."""
    d = opdef(name)
    return d.infer(d.bind(list(operand_types)), attrs)
