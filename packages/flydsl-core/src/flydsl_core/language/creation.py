"""Program ids and tile construction."""

from __future__ import annotations

from .. import dtypes as dt
from ..exc import TypeCheckError
from .tile import Tile, broadcast_to, cast, constant, emit1


def program_id(axis: int = 0) -> Tile:
    """This program's index along grid ``axis`` (an int32 scalar)."""
    return emit1("program_id", [], {"axis": int(axis)})


def num_programs(axis: int = 0) -> Tile:
    """The grid's size along ``axis`` (an int32 scalar)."""
    return emit1("num_programs", [], {"axis": int(axis)})


def arange(start: int, end: int | None = None) -> Tile:
    """``[start, end)`` as an int32 tile; the bounds are compile-time ints."""
    if end is None:
        start, end = 0, start
    if not (isinstance(start, int) and isinstance(end, int)):
        raise TypeCheckError(
            "arange bounds must be compile-time ints (tile shapes are static); add a run-time "
            "offset afterwards: start + fly.arange(0, BLOCK)"
        )
    return emit1("arange", [], {"start": start, "end": end})


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(shape)
    if not all(isinstance(s, int) and s >= 1 for s in shape):
        raise TypeCheckError(
            f"tile shapes are static positive ints, got {shape}; use fly.constexpr parameters "
            "for sizes that vary between compiles"
        )
    return shape


def full(shape, value, dtype=dt.fp32) -> Tile:
    """A tile of ``shape`` filled with ``value`` (a number or a scalar tile)."""
    shape = _shape(shape)
    dtype = dt.dtype(dtype)
    if isinstance(value, Tile):
        return broadcast_to(cast(value, dtype), shape)
    return constant(value, dtype, shape)


def zeros(shape, dtype=dt.fp32) -> Tile:
    return full(shape, 0, dtype)


def ones(shape, dtype=dt.fp32) -> Tile:
    return full(shape, 1, dtype)


def zeros_like(x: Tile, dtype=None) -> Tile:
    return full(x.shape, 0, dtype or x.dtype)


def full_like(x: Tile, value, dtype=None) -> Tile:
    return full(x.shape, value, dtype or x.dtype)
