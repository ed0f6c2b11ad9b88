"""Elementwise math, selection and casts."""

from __future__ import annotations

from .. import dtypes as dt
from ..exc import TypeCheckError
from .tile import Tile, as_tile, bitcast, broadcast_shapes, broadcast_to, cast, emit1, unify


def _float_unary(name: str):
    def fn(x) -> Tile:
        x = as_tile(x)
        if not x.dtype.is_float or x.dtype.storage_only:
            x = cast(x, dt.fp32)
        # 16-bit floats compute in fp32 and round back, as GPU code does.
        if x.dtype.bits < 32:
            return cast(emit1(name, [cast(x, dt.fp32)]), x.dtype)
        return emit1(name, [x])

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name}; integer inputs are computed in fp32."
    return fn


exp = _float_unary("exp")
exp2 = _float_unary("exp2")
log = _float_unary("log")
log2 = _float_unary("log2")
sqrt = _float_unary("sqrt")
rsqrt = _float_unary("rsqrt")
erf = _float_unary("erf")
tanh = _float_unary("tanh")
reciprocal = _float_unary("reciprocal")
reciprocal.__doc__ = (
    "Elementwise 1 / x within 1 ulp: the hardware reciprocal where there is one (v_rcp_f32 on "
    "AMD, rcp.approx.ftz on NVIDIA; a correctly rounded division is about ten instructions), "
    "where a result outside fp32's normal range may flush to 0 or overflow; exact on the CPU "
    "backends and in fp64."
)
sigmoid = _float_unary("sigmoid")
sin = _float_unary("sin")
cos = _float_unary("cos")
floor = _float_unary("floor")
ceil = _float_unary("ceil")


def abs(x) -> Tile:
    return emit1("abs", [as_tile(x)])


def maximum(a, b) -> Tile:
    """Elementwise max; a NaN in either operand gives NaN (as torch.maximum)."""
    a, b = unify(a, b)
    return emit1("maximum", [a, b])


def minimum(a, b) -> Tile:
    a, b = unify(a, b)
    return emit1("minimum", [a, b])


def clamp(x, lo, hi) -> Tile:
    return minimum(maximum(x, lo), hi)


def where(cond, a, b) -> Tile:
    """Select ``a`` where ``cond`` holds, else ``b``; all three broadcast."""
    cond = as_tile(cond)
    if not cond.dtype.is_bool:
        cond = cond != 0
    a, b = unify(a, b)
    shape = broadcast_shapes(cond.shape, a.shape)
    return emit1(
        "where", [broadcast_to(cond, shape), broadcast_to(a, shape), broadcast_to(b, shape)]
    )


def rescale(x, factor) -> Tile:
    """``x * factor`` (``factor`` broadcast to ``x``'s shape), for factors that are mostly
    exactly 1: the values are the product's, and a backend may skip the multiply where all the
    factors it would apply are 1 (on AMD CDNA a wave tests its factors and branches around the
    multiplies as one: an online softmax's accumulator rescale costs a compare and a branch on
    the tiles where no row's max grew). Float tiles; ``factor`` is cast to ``x``'s dtype."""
    x = as_tile(x)
    if not x.dtype.is_float or x.dtype.storage_only:
        raise TypeCheckError(f"rescale scales a float tile, got {x.type}")
    f = broadcast_to(cast(as_tile(factor), x.dtype), x.shape)
    if x.dtype.bits < 32:  # 16-bit floats multiply in fp32 and round once, as torch's mul
        return cast(emit1("rescale", [cast(x, dt.fp32), cast(f, dt.fp32)]), x.dtype)
    return emit1("rescale", [x, f])


def isnan(x) -> Tile:
    x = as_tile(x)
    return x != x


def fma(a, b, c) -> Tile:
    return a * b + c


__all__ = [
    "abs",
    "bitcast",
    "cast",
    "ceil",
    "clamp",
    "cos",
    "erf",
    "exp",
    "exp2",
    "floor",
    "fma",
    "isnan",
    "log",
    "log2",
    "maximum",
    "minimum",
    "reciprocal",
    "rescale",
    "rsqrt",
    "sigmoid",
    "sin",
    "sqrt",
    "tanh",
    "where",
]
