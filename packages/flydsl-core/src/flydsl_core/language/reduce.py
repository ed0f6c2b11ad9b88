"""Reductions, scans, sorting and top-k over one axis of a tile.

Sums of 16-bit floats accumulate in fp32 and sums of small ints in int32,
unless ``dtype`` says otherwise: the result is in the accumulation dtype, as
in Triton. Ties in argmax/argmin, sort and topk go to the lowest index.
NaN is ordered as torch orders it: above every number.
"""

from __future__ import annotations

from .. import dtypes as dt
from ..exc import TypeCheckError
from ..trace.context import current
from .tile import Tile, acc_dtype, as_tile, cast, keep_dims, reduce_axis, reduction

# sum, prod, max, min and xor_sum emit the ``reduce`` op; their rule lives in ``tile.py``
# beside ``Tile.sum`` / ``max`` / ``min``, which use it
sum = reduction("sum")
prod = reduction("prod")
max = reduction("max")
min = reduction("min")
xor_sum = reduction("xor_sum")


def _arg(kind: str):
    def fn(x, axis=None, *, keepdims: bool = False) -> Tile:
        x = as_tile(x)
        a = reduce_axis(x, axis)
        src = cast(x, acc_dtype(x, "max", None))
        _, idx = current().emit("argreduce", [src._v], {"kind": kind, "axis": a}).results
        return keep_dims(x, Tile(idx), a, keepdims)

    fn.__name__ = kind
    return fn


argmax = _arg("argmax")
argmin = _arg("argmin")


def _scan(kind: str):
    def fn(x, axis=None, *, reverse: bool = False, dtype=None) -> Tile:
        x = as_tile(x)
        a = reduce_axis(x, axis)
        src = cast(x, acc_dtype(x, kind, dtype))
        return Tile(
            current()
            .emit("scan", [src._v], {"kind": kind, "axis": a, "reverse": bool(reverse)})
            .result
        )

    fn.__name__ = kind
    return fn


cumsum = _scan("cumsum")
cumprod = _scan("cumprod")
cummax = _scan("cummax")
cummin = _scan("cummin")


def sort(x, axis: int = -1, *, descending: bool = False, return_indices: bool = False):
    """Stable sort along ``axis``; indices (int32) give each value's source position."""
    x = as_tile(x)
    a = reduce_axis(x, axis)
    vals, idx = current().emit("sort", [x._v], {"axis": a, "descending": bool(descending)}).results
    return (Tile(vals), Tile(idx)) if return_indices else Tile(vals)


def topk(x, k: int, axis: int = -1, *, largest: bool = True):
    """The ``k`` largest (or smallest) values along ``axis``, sorted, and their int32 indices.

    Ties are ordered by index ascending, so the result is deterministic.
    """
    x = as_tile(x)
    a = reduce_axis(x, axis)
    if not isinstance(k, int):
        raise TypeCheckError("topk's k must be a compile-time int")
    vals, idx = (
        current().emit("topk", [x._v], {"axis": a, "k": k, "largest": bool(largest)}).results
    )
    return Tile(vals), Tile(idx)


def histogram(x, num_bins: int, *, mask=None) -> Tile:
    """How often each value ``0 .. num_bins-1`` occurs in the 1-D int32 tile ``x``.

    Returns an int32 tile ``[num_bins]``. Elements where ``mask`` is False, and
    values outside ``[0, num_bins)``, are not counted. (Triton: ``tl.histogram``;
    the GPU counts in shared memory. Used by radix select for digit counts.)
    """
    from .tile import broadcast_to

    x = as_tile(x)
    if not isinstance(num_bins, int) or isinstance(num_bins, bool) or num_bins < 1:
        raise TypeCheckError(
            f"histogram's num_bins must be a positive compile-time int, got {num_bins!r}"
        )
    if x.ndim != 1 or x.dtype != dt.int32:
        raise TypeCheckError(f"histogram counts a 1-D int32 tile, got {x.type}; cast it first")
    operands = [x._v]
    if mask is not None:
        m = broadcast_to(as_tile(mask), x.shape)
        if not m.dtype.is_bool:
            raise TypeCheckError(f"a mask must be a bool tile, got {m.type}")
        operands.append(m._v)
    attrs = {"num_bins": num_bins}
    return Tile(current().emit("histogram", operands, attrs).result)
