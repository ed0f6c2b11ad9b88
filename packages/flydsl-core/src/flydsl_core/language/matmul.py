"""Matrix multiply of tiles, plain and MX block-scaled."""

from __future__ import annotations

from .. import dtypes as dt
from ..exc import TypeCheckError
from ..ir.ops import MX_FORMATS
from ..trace.context import current
from .creation import zeros
from .tile import Tile, as_tile, cast


def dot(
    a: Tile, b: Tile, acc: Tile | None = None, *, out_dtype=None, input_precision: str = "ieee"
) -> Tile:
    """``acc + a @ b`` with an fp32 (int32 for int8) accumulator.

    ``a`` is [M, K] and ``b`` is [K, N] (or batched [B, M, K] x [B, K, N]).
    Inputs of different float dtypes are promoted to the wider one.
    ``out_dtype`` casts the result (after accumulation).
    """
    a, b = as_tile(a), as_tile(b)
    if a.dtype != b.dtype:
        common = dt.promote(a.dtype, b.dtype)
        a, b = cast(a, common), cast(b, common)
    acc_dtype = dt.int32 if a.dtype.is_int else dt.fp32
    out_shape = (*a.shape[:-1], b.shape[-1]) if a.ndim >= 2 and b.ndim >= 2 else None
    if out_shape is None:
        raise TypeCheckError(f"dot needs 2-D tiles, got {a.type} and {b.type}")
    if acc is None:
        acc = zeros(out_shape, acc_dtype)
    else:
        acc = cast(as_tile(acc), acc_dtype)
    if input_precision not in ("ieee", "tf32"):
        raise TypeCheckError("input_precision is 'ieee' or 'tf32'")
    r = Tile(
        current().emit("dot", [a._v, b._v, acc._v], {"input_precision": input_precision}).result
    )
    return cast(r, out_dtype) if out_dtype is not None else r


def dot_scaled(
    a: Tile,
    a_scale: Tile,
    a_format: str,
    b: Tile,
    b_scale: Tile,
    b_format: str,
    acc: Tile | None = None,
    *,
    out_dtype=None,
) -> Tile:
    """MX block-scaled ``acc + (a * 2^(a_scale-127)) @ (b * 2^(b_scale-127))``.

    Formats are ``e4m3``, ``e5m2`` (fp8 tiles, one element per byte) and
    ``e2m1`` (uint8 tiles holding two fp4 elements per byte along K, the low
    nibble first). ``a`` is [M, K/epb], ``b`` is [K/epb, N]; the E8M0 scales
    (uint8) are [M, K/32] and [N, K/32]: one per 32 elements along K.
    """
    a, b, a_scale, b_scale = (as_tile(t) for t in (a, b, a_scale, b_scale))
    for f in (a_format, b_format):
        if f not in MX_FORMATS:
            raise TypeCheckError(f"unknown MX format {f!r}; use one of {sorted(MX_FORMATS)}")
    _check_elem(a, a_format, "a")
    _check_elem(b, b_format, "b")
    m, n = a.shape[0], b.shape[1]
    acc = zeros((m, n), dt.fp32) if acc is None else cast(as_tile(acc), dt.fp32)
    r = Tile(
        current()
        .emit(
            "dot_scaled",
            [a._v, a_scale._v, b._v, b_scale._v, acc._v],
            {"a_format": a_format, "b_format": b_format},
        )
        .result
    )
    return cast(r, out_dtype) if out_dtype is not None else r


_ELEM = {"e4m3": dt.fp8e4m3, "e5m2": dt.fp8e5m2, "e2m1": dt.uint8}


def _check_elem(t: Tile, fmt: str, name: str):
    want = _ELEM[fmt]
    if t.dtype != want:
        raise TypeCheckError(
            f"dot_scaled operand {name} in format {fmt} must be a {want} tile, got {t.type}"
        )
