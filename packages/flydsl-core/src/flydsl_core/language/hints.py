"""Facts about integer values that code generators vectorize on.

``hint(x, contiguous=..., multiple_of=...)`` states, per axis, that ``x``
comes in aligned runs of consecutive integers whose first values are
divisible by a power of two: Triton's AxisInfo contiguity and divisibility,
which decide whether an access with offsets ``x`` becomes one 128-bit load
or several narrow ones. Triton derives them itself through ``+``, ``*``,
``//`` and ``%`` by constants, but not through ``^`` or a gather, so a
swizzled layout view (``views.LayoutView``) states them from the static
layout (``static_facts``). The reference backend checks every hint.
"""

from __future__ import annotations

from ..exc import TypeCheckError
from .tile import Tile, as_tile, emit1

#: the largest divisibility a hint states (Triton's own facts cap far above 16-byte alignment)
MAX_DIVISOR = 1 << 16


def _per_axis(v, rank: int, name: str) -> tuple[int, ...]:
    n = max(rank, 1)
    if isinstance(v, int):
        v = (1,) * (n - 1) + (v,)  # an int speaks of the last axis
    v = tuple(v)
    if len(v) != n or any(not isinstance(x, int) or x < 1 or x & (x - 1) for x in v):
        raise TypeCheckError(f"hint {name} is a power of two or one per axis ({n}), got {v!r}")
    return v


def hint(x, *, contiguous=1, multiple_of=1) -> Tile:
    """``x`` unchanged, with facts about its values (see the module docstring).

    ``contiguous`` and ``multiple_of`` are a power of two (for the last axis)
    or one per axis. A false hint is an error on the reference backend and
    undefined behaviour on a GPU, as in Triton.
    """
    x = as_tile(x)
    if not x.dtype.is_int:
        raise TypeCheckError(f"hint describes integer tiles, got {x.type}")
    c = _per_axis(contiguous, x.ndim, "contiguous")
    m = _per_axis(multiple_of, x.ndim, "multiple_of")
    if all(v == 1 for v in c + m):
        return x
    return emit1("hint", [x], {"contiguous": c, "multiple_of": m})


def _pow2_divisor(values) -> int:
    g = 0
    for v in values:
        g |= int(v)
    return MAX_DIVISOR if g == 0 else min(MAX_DIVISOR, g & -g)


def static_facts(values) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(contiguous, multiple_of)`` per axis of an integer torch tensor of known values: the
    longest aligned power-of-two runs of consecutive values, and the divisibility of their
    starts."""
    import torch

    v = values.reshape(1) if values.dim() == 0 else values
    cont, mult = [], []
    for d in range(v.dim()):
        w = v.movedim(d, -1)
        n = w.shape[-1]
        c = n & -n if n else 1
        while c > 1 and not bool((w.unflatten(-1, (-1, c)).diff(dim=-1) == 1).all()):
            c //= 2
        starts = w.unflatten(-1, (-1, c))[..., 0] if n else torch.zeros(0, dtype=v.dtype)
        cont.append(c)
        mult.append(_pow2_divisor(starts.flatten().tolist()))
    return tuple(cont), tuple(mult)


__all__ = ["hint", "static_facts"]
