"""The operation set of FlyIR and each op's type rule.

Each op is declared once with ``@op(...)``; the decorated function is its
type rule (abstract evaluation): it takes the operand types and the attrs and
returns the result types, or raises ``TypeCheckError``. The tracer and the
verifier both call these rules, so a type error found while tracing and one
introduced by a pass read the same.

FlyIR is explicit: binary ops need operands of one dtype and one shape. The
tracer inserts the ``cast`` and ``broadcast`` ops that Python's operator
syntax implies; backends never guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import dtypes as dt
from ..exc import TypeCheckError
from .types import TensorType, TileType


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: Callable
    effects: bool = False  # writes memory or is a terminator: never removed by DCE
    terminator: bool = False
    num_regions: int = 0


OPS: dict[str, OpDef] = {}


def op(name: str, *, effects: bool = False, terminator: bool = False, regions: int = 0):
    def deco(fn):
        if name in OPS:
            raise RuntimeError(f"op {name!r} declared twice")
        OPS[name] = OpDef(name, fn, effects, terminator, regions)
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


@op("constant")
def _constant(types, attrs):
    return [TileType(attrs["dtype"], tuple(attrs.get("shape", ())))]


@op("arange")
def _arange(types, attrs):
    if attrs["end"] <= attrs["start"]:
        raise TypeCheckError(f"arange({attrs['start']}, {attrs['end']}) is empty")
    return [TileType(dt.int32, (attrs["end"] - attrs["start"],))]


@op("program_id")
def _program_id(types, attrs):
    if attrs["axis"] not in (0, 1, 2):
        raise TypeCheckError(f"program_id axis must be 0, 1 or 2, got {attrs['axis']}")
    return [TileType(dt.int32)]


@op("num_programs")
def _num_programs(types, attrs):
    return _program_id(types, attrs)


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
    "sigmoid",
    "sin",
    "cos",
    "floor",
    "ceil",
)


def _binary_rule(name):
    def rule(types, attrs):
        a, b = (_tile(t) for t in types)
        _same(a, b, name)
        _arith(a, name)
        if name == "truediv" or name == "pow":
            _float(a, name)
        if name == "intdiv" and not (a.dtype.is_int or a.dtype.is_bool):
            raise TypeCheckError(f"intdiv needs integer tiles, got {a}")
        return [a]

    return rule


def _bits_rule(name):
    def rule(types, attrs):
        a, b = (_tile(t) for t in types)
        _same(a, b, name)
        if not (a.dtype.is_int or a.dtype.is_bool):
            raise TypeCheckError(f"{name} needs integer or bool tiles, got {a}; bitcast first")
        return [a]

    return rule


def _compare_rule(name):
    def rule(types, attrs):
        a, b = (_tile(t) for t in types)
        _same(a, b, name)
        _arith(a, name)
        return [a.with_dtype(dt.bool_)]

    return rule


def _unary_rule(name, floating):
    def rule(types, attrs):
        (a,) = (_tile(t) for t in types)
        _arith(a, name)
        if floating:
            _float(a, name)
        return [a]

    return rule


for _n in BINARY_ARITH:
    op(_n)(_binary_rule(_n))
for _n in BINARY_BITS:
    op(_n)(_bits_rule(_n))
for _n in COMPARE:
    op(_n)(_compare_rule(_n))
for _n in UNARY_ANY:
    op(_n)(_unary_rule(_n, False))
for _n in UNARY_FLOAT:
    op(_n)(_unary_rule(_n, True))


@op("invert")
def _invert(types, attrs):
    (a,) = (_tile(t) for t in types)
    if not (a.dtype.is_int or a.dtype.is_bool):
        raise TypeCheckError(f"~ needs an integer or bool tile, got {a}")
    return [a]


@op("hint")
def _hint(types, attrs):
    """Facts about an integer tile's values, for backends that vectorize on them.

    ``contiguous[d] = c``: along axis ``d`` the values come in aligned runs of
    ``c`` consecutive integers; ``multiple_of[d] = m``: the first value of
    every run is divisible by ``m`` (Triton's AxisInfo contiguity and
    divisibility). One entry per axis (one for a scalar), powers of two. The
    result equals the operand; the reference backend checks the facts.
    """
    (a,) = (_tile(t) for t in types)
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


@op("cast")
def _cast(types, attrs):
    (a,) = (_tile(t) for t in types)
    return [a.with_dtype(attrs["dtype"])]


@op("bitcast")
def _bitcast(types, attrs):
    (a,) = (_tile(t) for t in types)
    to = attrs["dtype"]
    if to.bits != a.dtype.bits or to.is_bool or a.dtype.is_bool:
        raise TypeCheckError(f"bitcast from {a.dtype} to {to} needs equal bit widths")
    return [a.with_dtype(to)]


@op("where")
def _where(types, attrs):
    c, a, b = (_tile(t) for t in types)
    if c.dtype != dt.bool_:
        raise TypeCheckError(f"where's condition must be bool, got {c}")
    _same(a, b, "where")
    if c.shape != a.shape:
        raise TypeCheckError(f"where's condition has shape {c.shape}, values {a.shape}")
    return [a]


# --- shape -------------------------------------------------------------------


@op("broadcast")
def _broadcast(types, attrs):
    (a,) = (_tile(t) for t in types)
    shape = tuple(attrs["shape"])
    if len(shape) != a.rank and a.rank != 0:
        raise TypeCheckError(f"broadcast keeps the rank ({a.shape} -> {shape}); reshape first")
    for s, d in zip(a.shape, shape):
        if s not in (1, d):
            raise TypeCheckError(f"cannot broadcast shape {a.shape} to {shape}")
    return [a.with_shape(shape)]


@op("reshape")
def _reshape(types, attrs):
    (a,) = (_tile(t) for t in types)
    shape = tuple(attrs["shape"])
    new = TileType(a.dtype, shape)
    if new.numel != a.numel:
        raise TypeCheckError(f"cannot reshape {a.shape} ({a.numel} elements) to {shape}")
    return [new]


@op("permute")
def _permute(types, attrs):
    (a,) = (_tile(t) for t in types)
    order = tuple(attrs["order"])
    if sorted(order) != list(range(a.rank)):
        raise TypeCheckError(f"permute order {order} is not a permutation of {a.rank} axes")
    return [a.with_shape(tuple(a.shape[i] for i in order))]


@op("concat")
def _concat(types, attrs):
    a, b = (_tile(t) for t in types)
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


@op("reduce")
def _reduce(types, attrs):
    (a,) = (_tile(t) for t in types)
    if attrs["kind"] not in REDUCE_KINDS:
        raise TypeCheckError(f"unknown reduction {attrs['kind']!r}; known: {REDUCE_KINDS}")
    _arith(a, "reduce")
    if attrs["kind"] == "xor_sum" and not a.dtype.is_int:
        raise TypeCheckError(f"xor_sum needs an integer tile, got {a}")
    axis = _axis(a, attrs["axis"], "reduce")
    return [a.with_shape(_drop(a.shape, axis))]


@op("argreduce")
def _argreduce(types, attrs):
    (a,) = (_tile(t) for t in types)
    if attrs["kind"] not in ("argmax", "argmin"):
        raise TypeCheckError(f"unknown arg-reduction {attrs['kind']!r}")
    _arith(a, attrs["kind"])
    axis = _axis(a, attrs["axis"], attrs["kind"])
    shape = _drop(a.shape, axis)
    return [a.with_shape(shape), TileType(dt.int32, shape)]


@op("scan")
def _scan(types, attrs):
    (a,) = (_tile(t) for t in types)
    if attrs["kind"] not in ("cumsum", "cumprod", "cummax", "cummin"):
        raise TypeCheckError(f"unknown scan {attrs['kind']!r}")
    _arith(a, "scan")
    _axis(a, attrs["axis"], "scan")
    return [a]


@op("sort")
def _sort(types, attrs):
    (a,) = (_tile(t) for t in types)
    _arith(a, "sort")
    _axis(a, attrs["axis"], "sort")
    return [a, a.with_dtype(dt.int32)]


@op("topk")
def _topk(types, attrs):
    (a,) = (_tile(t) for t in types)
    _arith(a, "topk")
    axis = _axis(a, attrs["axis"], "topk")
    k = attrs["k"]
    if not 1 <= k <= a.shape[axis]:
        raise TypeCheckError(f"topk k={k} must be in [1, {a.shape[axis]}] for {a}")
    shape = list(a.shape)
    shape[axis] = k
    return [a.with_shape(tuple(shape)), TileType(dt.int32, tuple(shape))]


@op("histogram")
def _histogram(types, attrs):
    """Counts of each value in ``[0, num_bins)`` of a 1-D int32 tile, as an int32 ``[num_bins]``.

    Operands: the values, then (``masked``) a bool mask of the same shape;
    masked-off elements and values outside ``[0, num_bins)`` are not counted.
    Added for radix select (TopK): a digit histogram per block of keys.
    """
    a, *rest = (_tile(t) for t in types)
    if a.rank != 1 or a.dtype != dt.int32:
        raise TypeCheckError(f"histogram needs a 1-D int32 tile, got {a}")
    if attrs.get("masked"):
        if not rest:
            raise TypeCheckError("a masked histogram needs its mask operand")
        _mask(rest[0], a.shape)
    elif rest:
        raise TypeCheckError("histogram takes one operand unless masked")
    nb = attrs["num_bins"]
    if not isinstance(nb, int) or nb < 1:
        raise TypeCheckError(f"histogram num_bins must be a positive int, got {nb!r}")
    return [TileType(dt.int32, (nb,))]


# --- matrix multiply -----------------------------------------------------------

DOT_INPUTS = {dt.bf16, dt.fp16, dt.fp32, dt.fp8e4m3, dt.fp8e5m2, dt.int8}


@op("dot")
def _dot(types, attrs):
    a, b, acc = (_tile(t) for t in types)
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


@op("dot_scaled")
def _dot_scaled(types, attrs):
    a, sa, b, sb, acc = (_tile(t) for t in types)
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


@op("load")
def _load(types, attrs):
    ten, off, *rest = types
    ten, off = _tensor(ten), _offsets(off)
    if attrs.get("masked"):
        _mask(rest.pop(0), off.shape)
    if attrs.get("has_other"):
        other = _tile(rest.pop(0), "other")
        if other != TileType(ten.dtype, off.shape):
            raise TypeCheckError(
                f"load's other must be {TileType(ten.dtype, off.shape)}, got {other}"
            )
    return [TileType(ten.dtype, off.shape)]


@op("store", effects=True)
def _store(types, attrs):
    ten, off, val, *rest = types
    ten, off, val = _tensor(ten), _offsets(off), _tile(val, "value")
    if val != TileType(ten.dtype, off.shape):
        raise TypeCheckError(f"store value must be {TileType(ten.dtype, off.shape)}, got {val}")
    if attrs.get("masked"):
        _mask(rest.pop(0), off.shape)
    return []


ATOMIC_KINDS = ("add", "max", "min", "xchg", "and", "or", "xor")


@op("atomic_rmw", effects=True)
def _atomic(types, attrs):
    if attrs["kind"] not in ATOMIC_KINDS:
        raise TypeCheckError(f"unknown atomic {attrs['kind']!r}; known: {ATOMIC_KINDS}")
    ten, off, val, *rest = types
    ten, off, val = _tensor(ten), _offsets(off), _tile(val, "value")
    if val != TileType(ten.dtype, off.shape):
        raise TypeCheckError(f"atomic value must be {TileType(ten.dtype, off.shape)}, got {val}")
    if attrs.get("masked"):
        _mask(rest.pop(0), off.shape)
    return [val]


@op("atomic_cas", effects=True)
def _atomic_cas(types, attrs):
    ten, off, cmp, val = types
    ten, off = _tensor(ten), _offsets(off)
    want = TileType(ten.dtype, off.shape)
    if _tile(cmp) != want or _tile(val) != want:
        raise TypeCheckError(f"atomic_cas compare and value must be {want}")
    return [want]


@op("range_mask")
def _range_mask(types, attrs):
    """``start + i < extent`` for ``i`` along ``axis`` of a ``shape`` tile.

    The bounds mask of a view. It stays a structured op so the mask
    elimination pass can prove it away from divisibility facts.
    """
    start, extent = (_tile(t) for t in types)
    if not (start.is_scalar and extent.is_scalar and start.dtype.is_int and extent.dtype.is_int):
        raise TypeCheckError("range_mask needs scalar integer start and extent")
    shape = tuple(attrs["shape"])
    axis = attrs["axis"]
    if axis >= len(shape) or (axis >= 0 and shape[axis] != attrs["length"]):
        raise TypeCheckError("range_mask length does not match its shape")
    return [TileType(dt.bool_, shape)]


# --- structured control flow ---------------------------------------------------


@op("yield", terminator=True, effects=True)
def _yield(types, attrs):
    return []


@op("condition", terminator=True, effects=True)
def _condition(types, attrs):
    (c,) = types
    if _tile(c) != TileType(dt.bool_):
        raise TypeCheckError(f"a while condition must be a scalar bool, got {c}")
    return []


@op("for", regions=1)
def _for(types, attrs):
    lo, hi, step, *init = types
    for t, n in ((lo, "start"), (hi, "stop"), (step, "step")):
        t = _tile(t, n)
        if not (t.is_scalar and t.dtype.is_int):
            raise TypeCheckError(f"loop {n} must be a scalar integer, got {t}")
    return list(init)


@op("if", regions=2)
def _if(types, attrs):
    c, *init = types
    if _tile(c) != TileType(dt.bool_):
        raise TypeCheckError(f"an if condition must be a scalar bool, got {c}")
    return list(init)


@op("while", regions=2)
def _while(types, attrs):
    return list(types)


def infer(name: str, operand_types, attrs):
    return opdef(name).infer(list(operand_types), attrs)
