"""Tensors, views and tiles of memory.

A kernel's tensor argument arrives as a ``TensorRef``: a dtype, a rank, and
run-time sizes and strides (scalar tiles, specialized by the compiler where
the call allows). Indexing and tiling produce ``View``s; a view with a
static shape can be loaded and stored. Bounds masks come from the view
itself: every element outside the tensor is masked, and the mask elimination
pass removes what the divisibility facts prove in bounds.

Tiling follows CuTe's by-mode ``zipped_divide``: ``x.tile((BM, BN), (i, j))``
is the (i, j)-th block of a (BM, BN) tiling. A mode's tiler may also be a
static ``Layout`` that permutes the block (size == cosize), e.g. a swizzle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .. import dtypes as dt
from ..exc import TypeCheckError
from ..trace.context import current
from .creation import arange
from .hints import hint, static_facts
from .tile import Tile, as_tile, broadcast_to, cast, emit1, is_number, reshape, unify


@dataclass(frozen=True)
class ds:
    """A dynamic slice: ``size`` elements from ``start`` (a number or scalar tile)."""

    start: object
    size: int
    step: int = 1


@dataclass(frozen=True)
class _Mode:
    dim: int  # the tensor dimension this axis of the view walks
    size: int | None  # static extent of the view along it; None = the whole dimension
    start: object = 0  # coordinate of the view's first element in that dimension
    step: int = 1  # coordinate step between consecutive view elements
    pattern: object = None  # None (contiguous), a static Layout, or an index Tile (gather)


def _scalar(x) -> Tile | int:
    if isinstance(x, Tile):
        if x.shape != ():
            raise TypeCheckError(f"an index here must be a scalar, got {x.type}")
        if not (x.dtype.is_int or x.dtype.is_bool):
            raise TypeCheckError(f"an index must be an integer, got {x.type}")
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeCheckError(f"an index must be an int or a scalar tile, got {x!r}")
    return x


def _add(a, b):
    if is_number(a) and is_number(b):
        return a + b
    if is_number(a) and a == 0:
        return b
    if is_number(b) and b == 0:
        return a
    return a + b


def _mul(a, b):
    if is_number(a) and is_number(b):
        return a * b
    if is_number(b) and b == 1:
        return a
    if is_number(a) and a == 1:
        return b
    return a * b


class View:
    """A statically or partly shaped window of a tensor."""

    def __init__(
        self, tensor: TensorRef, modes: tuple[_Mode, ...], fixed: tuple[tuple[int, object], ...]
    ):
        self.tensor = tensor
        self.modes = modes
        self.fixed = fixed

    # -- shape --------------------------------------------------------------------
    @property
    def dtype(self) -> dt.DType:
        return self.tensor.dtype

    @property
    def ndim(self) -> int:
        return len(self.modes)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._static_shape()

    def _static_shape(self) -> tuple[int, ...]:
        open_ = [i for i, m in enumerate(self.modes) if m.size is None]
        if open_:
            raise TypeCheckError(
                f"view axes {open_} still span whole run-time dimensions; tile them first, "
                "e.g. row.tile((BLOCK,), j) or x.tile((BM, BN), (i, j))"
            )
        return tuple(m.size for m in self.modes)

    def __repr__(self) -> str:
        sizes = ",".join("?" if m.size is None else str(m.size) for m in self.modes)
        return f"View({self.tensor.name}[{sizes}], {self.dtype})"

    # -- slicing and tiling ---------------------------------------------------------
    def __getitem__(self, idx) -> View:
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) > len(self.modes):
            raise TypeCheckError(f"too many indices ({len(idx)}) for a {len(self.modes)}-d view")
        idx = idx + (slice(None),) * (len(self.modes) - len(idx))
        modes, fixed = [], list(self.fixed)
        for m, i in zip(self.modes, idx):
            if isinstance(i, slice):
                if i == slice(None):
                    modes.append(m)
                    continue
                start, stop, step = i.start or 0, i.stop, i.step or 1
                if (
                    stop is None
                    or not all(isinstance(v, int) for v in (start, stop, step))
                    or stop <= start
                ):
                    raise TypeCheckError(
                        "a slice of a view needs static int bounds (a:b); use fly.ds(start, size) "
                        "for a run-time start"
                    )
                i = ds(start, (stop - start + step - 1) // step, step)
            if isinstance(i, ds):
                if m.pattern is not None:
                    raise TypeCheckError("cannot slice a permuted or gathered axis")
                modes.append(
                    replace(
                        m,
                        size=i.size,
                        start=_add(m.start, _mul(_scalar(i.start), m.step)),
                        step=m.step * i.step,
                    )
                )
            elif isinstance(i, Tile) and i.ndim == 1:
                if m.pattern is not None or m.step != 1:
                    raise TypeCheckError("cannot gather from a permuted or strided axis")
                if not i.dtype.is_int:
                    raise TypeCheckError(f"gather indices must be integers, got {i.type}")
                modes.append(replace(m, size=i.shape[0], pattern=_add(i, m.start)))
            elif isinstance(i, Tile) and i.ndim > 1:
                raise TypeCheckError("gather with a 1-D index tile per axis")
            else:
                i = _scalar(i)
                if m.pattern is not None:
                    raise TypeCheckError("cannot index a permuted or gathered axis with a scalar")
                fixed.append((m.dim, _add(m.start, _mul(i, m.step))))
        return View(self.tensor, tuple(modes), tuple(fixed))

    def tile(self, tiler, coord) -> View:
        """The block at ``coord`` of the tiling of this view by ``tiler`` (one entry per axis).

        An entry is an int (a contiguous block), a static ``Layout`` whose
        image is the block ``[0, size)`` in some order, or ``None`` to keep
        the axis whole (its coordinate must then be 0).
        """
        from ..layout import Layout, cosize, size

        if not isinstance(tiler, tuple):
            tiler = (tiler,)
        if not isinstance(coord, tuple):
            coord = (coord,)
        if len(tiler) != len(self.modes) or len(coord) != len(self.modes):
            raise TypeCheckError(
                f"tile needs one tiler and one coordinate per view axis ({len(self.modes)}), "
                f"got {len(tiler)} and {len(coord)}"
            )
        modes = []
        for m, t, c in zip(self.modes, tiler, coord):
            if t is None:
                modes.append(m)
                continue
            if m.pattern is not None:
                raise TypeCheckError("cannot tile a permuted or gathered axis again")
            c = _scalar(c)
            if isinstance(t, int):
                if t < 1:
                    raise TypeCheckError(f"tile sizes must be positive, got {t}")
                block, pattern = t, None
            elif isinstance(t, Layout):
                block = size(t)
                if cosize(t) != block:
                    raise TypeCheckError(
                        f"a layout tiler must permute its block (size == cosize); {t} has size "
                        f"{block} and cosize {cosize(t)}"
                    )
                pattern = t
            else:
                raise TypeCheckError(f"a tiler entry is an int, a Layout or None, got {t!r}")
            start = _add(m.start, _mul(_mul(c, block), m.step))
            modes.append(replace(m, size=block, start=start, pattern=pattern))
        return View(self.tensor, tuple(modes), self.fixed)

    # -- addressing -------------------------------------------------------------------
    def offsets(self, *, bounds_check: bool = True) -> tuple[Tile, Tile | None]:
        """Element offsets of this view from the tensor's first element, and its bounds mask."""
        shape = self._static_shape()
        t = self.tensor
        idx = t.index_dtype
        masks: list[Tile] = []
        base: Tile | int = 0
        for dim, c in self.fixed:
            base = _add(base, _mul(_index(c, idx), t.stride[dim]))
            if bounds_check:
                masks.append(_range_mask(_index(c, idx), t.shape[dim], None, 1, shape, idx))
        total: Tile | int = base
        for axis, m in enumerate(self.modes):
            ext, stride = t.shape[m.dim], t.stride[m.dim]
            start = _index(m.start, idx)
            if m.pattern is None:
                local = cast(arange(0, m.size), idx)
                coordv = _add(_mul(local, m.step), start)
                if bounds_check:
                    if m.step == 1:
                        masks.append(_range_mask(start, ext, axis, m.size, shape, idx))
                    else:
                        masks.append(_axis_mask(coordv < ext, axis, shape))
            elif isinstance(m.pattern, Tile):
                coordv = cast(m.pattern, idx)
                if bounds_check:
                    masks.append(_axis_mask((coordv >= 0) & (coordv < ext), axis, shape))
            else:
                local = cast(m.pattern(arange(0, m.size)), idx)
                coordv = _add(_mul(local, m.step), start)
                if bounds_check:
                    masks.append(_axis_mask(coordv < ext, axis, shape))
            off = _mul(coordv, stride)
            total = _add(total, _along(off, axis, len(shape)))
        offs = broadcast_to(as_tile(total, idx) if not isinstance(total, Tile) else total, shape)
        mask = None
        for mk in masks:
            mask = mk if mask is None else mask & mk
        return offs, mask

    def _access(self, mask, bounds_check):
        offs, bmask = self.offsets(bounds_check=bounds_check)
        if mask is not None:
            user = broadcast_to(as_tile(mask), offs.shape)
            if not user.dtype.is_bool:
                raise TypeCheckError(f"a mask must be a bool tile, got {user.type}")
            bmask = user if bmask is None else bmask & user
        return offs, bmask

    def load(
        self,
        mask=None,
        other=None,
        *,
        bounds_check: bool = True,
        cache: str | None = None,
        eviction: str | None = None,
    ) -> Tile:
        """Load the view as a tile; masked-off elements read ``other`` (0 by default)."""
        offs, m = self._access(mask, bounds_check)
        attrs = {}
        if cache:
            attrs["cache"] = cache
        if eviction:
            attrs["eviction"] = eviction
        operands = [self.tensor._v, offs._v]
        if m is not None:
            o = broadcast_to(
                cast(as_tile(0 if other is None else other, self.dtype), self.dtype), offs.shape
            )
            operands += [m._v, o._v]
        return Tile(current().emit("load", operands, attrs).result)

    def store(self, value, mask=None, *, bounds_check: bool = True) -> None:
        """Store ``value`` (cast to the tensor's dtype and broadcast to the view)."""
        offs, m = self._access(mask, bounds_check)
        val = broadcast_to(cast(as_tile(value, self.dtype), self.dtype), offs.shape)
        operands = [self.tensor._v, offs._v, val._v] + ([m._v] if m is not None else [])
        current().emit("store", operands)

    def _atomic(self, kind, value, mask, sem):
        offs, m = self._access(mask, True)
        val = broadcast_to(cast(as_tile(value, self.dtype), self.dtype), offs.shape)
        operands = [self.tensor._v, offs._v, val._v] + ([m._v] if m is not None else [])
        attrs = {"kind": kind, "sem": sem}
        return Tile(current().emit("atomic_rmw", operands, attrs).result)

    def atomic_add(self, value, mask=None, *, sem: str = "acq_rel") -> Tile:
        """Atomically add; returns the old values. Masked-off lanes do nothing."""
        return self._atomic("add", value, mask, sem)

    def atomic_max(self, value, mask=None, *, sem: str = "acq_rel") -> Tile:
        return self._atomic("max", value, mask, sem)

    def atomic_min(self, value, mask=None, *, sem: str = "acq_rel") -> Tile:
        return self._atomic("min", value, mask, sem)

    def atomic_xchg(self, value, mask=None, *, sem: str = "acq_rel") -> Tile:
        return self._atomic("xchg", value, mask, sem)

    def atomic_and(self, value, mask=None, *, sem: str = "acq_rel") -> Tile:
        return self._atomic("and", value, mask, sem)

    def atomic_or(self, value, mask=None, *, sem: str = "acq_rel") -> Tile:
        return self._atomic("or", value, mask, sem)

    def atomic_xor(self, value, mask=None, *, sem: str = "acq_rel") -> Tile:
        return self._atomic("xor", value, mask, sem)

    def atomic_cas(self, compare, value) -> Tile:
        """Compare-and-swap every element (in bounds); returns the old values."""
        offs, _ = self._access(None, False)
        cmp = broadcast_to(cast(as_tile(compare, self.dtype), self.dtype), offs.shape)
        val = broadcast_to(cast(as_tile(value, self.dtype), self.dtype), offs.shape)
        return Tile(
            current().emit("atomic_cas", [self.tensor._v, offs._v, cmp._v, val._v], {}).result
        )


def _index(x, idx: dt.DType):
    if isinstance(x, Tile):
        return cast(x, idx) if x.dtype != idx else x
    return x


def _range_mask(start, extent, axis, length, shape, idx):
    start = as_tile(start, idx) if not isinstance(start, Tile) else start
    extent = as_tile(extent, idx) if not isinstance(extent, Tile) else extent
    start, extent = unify(start, extent)
    attrs = {"axis": axis, "length": length, "shape": tuple(shape)}
    if axis is None:
        attrs["axis"] = -1
    return emit1("range_mask", [start, extent], attrs)


def _along(x, axis: int, rank: int):
    """Reshape a 1-D tile to lie along ``axis`` of a rank-``rank`` tile."""
    if not isinstance(x, Tile) or x.ndim == 0:
        return x
    shape = [1] * rank
    shape[axis] = x.shape[0]
    return reshape(x, tuple(shape))


def _axis_mask(m: Tile, axis: int, shape) -> Tile:
    return broadcast_to(_along(m, axis, len(shape)), shape)


class TensorRef(View):
    """A kernel's tensor argument as seen while tracing."""

    def __init__(
        self,
        name: str,
        value,
        dtype: dt.DType,
        shape: tuple,
        stride: tuple,
        index_dtype: dt.DType,
        static_strides: tuple = (),
    ):
        self.name = name
        # strides the specialization fixed (a stride of 1), as ints; None where run-time
        self._static_strides = tuple(static_strides) or (None,) * len(stride)
        self._v = value
        self._dtype = dtype
        self._shape = tuple(shape)  # scalar tiles or ints
        self.stride = tuple(stride)
        self.index_dtype = index_dtype
        super().__init__(self, tuple(_Mode(d, None) for d in range(len(shape))), ())

    @property
    def dtype(self) -> dt.DType:
        return self._dtype

    @property
    def shape(self) -> tuple:  # run-time sizes, unlike View.shape
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def size(self, dim: int):
        return self._shape[dim]

    def static_stride(self, dim: int) -> int | None:
        """The stride of ``dim`` if the specialization made it a compile-time constant (the
        launcher specializes a stride of 1), else None: lets a kernel choose its access per
        layout at trace time."""
        s = self.stride[dim]
        return s if isinstance(s, int) else self._static_strides[dim]

    def numel(self):
        n = 1
        for s in self._shape:
            n = _mul(n, s)
        return n

    def __repr__(self) -> str:
        return f"TensorRef({self.name}: {self._dtype}, rank={self.ndim})"


class LayoutView(View):
    """A tile whose element ``c`` lives at index ``offset + layout(c)`` of a 1-D tensor.

    ``layout`` is a static CuTe ``Layout`` or ``ComposedLayout`` (e.g. a
    swizzle over a compact layout); the tile's shape is the sizes of its
    top-level modes. Element indices are masked to the tensor's extent.
    """

    def __init__(self, tensor: TensorRef, layout, offset=0):
        from ..layout import ComposedLayout, Layout

        if tensor.ndim != 1:
            raise TypeCheckError(
                f"a layout view indexes a 1-D tensor; {tensor.name} has rank {tensor.ndim}: view a "
                "flattened tensor (x.view(-1) on the host) or tile it per dimension"
            )
        if not isinstance(layout, (Layout, ComposedLayout)):
            raise TypeCheckError(f"expected a Layout or ComposedLayout, got {layout!r}")
        self.layout = layout
        self.base = offset
        super().__init__(tensor, (), ())

    def _static_shape(self) -> tuple[int, ...]:
        inner = getattr(self.layout, "inner", self.layout)
        return tuple(inner[i].size() for i in range(inner.rank())) if inner.rank() else (1,)

    def __getitem__(self, idx):
        raise TypeCheckError("a layout view cannot be sliced; compose the layout instead")

    def tile(self, tiler, coord):
        raise TypeCheckError(
            "a layout view cannot be tiled; divide the layout itself (zipped_divide) and index the tile"
        )

    def offsets(self, *, bounds_check: bool = True):
        from ..layout import ComposedLayout

        shape = self._static_shape()
        t = self.tensor
        idx = t.index_dtype
        lay, outer, off0 = self.layout, None, 0
        if isinstance(lay, ComposedLayout):
            lay, outer, off0 = lay.inner, lay.outer, lay.offset
        # A layout is additive over its top-level modes: L(c) = sum_i L_i(c_i).
        total = None
        for axis in range(len(shape)):
            mode = lay[axis] if lay.rank() else lay
            term = _along(cast(as_tile(mode(arange(0, shape[axis]))), idx), axis, len(shape))
            total = term if total is None else total + term
        total = broadcast_to(total, shape)
        if outer is not None:
            total = cast(as_tile(outer(total + off0)), idx)
            facts = _swizzle_facts(self.layout, shape)
            if facts is not None:
                total = hint(total, contiguous=facts[0], multiple_of=facts[1])
        elif off0:
            total = total + off0
        elem = _add(total, _index(self.base, idx))
        offs = broadcast_to(_mul(elem, t.stride[0]), shape)
        mask = None
        if bounds_check:
            mask = (elem >= 0) & (elem < t.shape[0])
        return offs, mask


#: the largest static tile whose swizzled indices are evaluated at trace time for hints
_MAX_FACT_ELEMS = 1 << 16


def _swizzle_facts(layout, shape):
    """Contiguity and divisibility of a swizzled layout's indices, from their static values
    (Triton cannot see through the xor); None when the inner layout is not all static."""
    import torch

    from ..layout import Swizzle

    inner = layout.inner
    if not isinstance(layout.outer, Swizzle) or math.prod(shape) > _MAX_FACT_ELEMS:
        return None
    terms = []
    for axis, n in enumerate(shape):
        mode = inner[axis] if inner.rank() else inner
        vals = [mode(j) for j in range(n)]
        if not all(isinstance(v, int) for v in vals):
            return None
        view = [1] * len(shape)
        view[axis] = n
        terms.append(torch.tensor(vals, dtype=torch.int64).reshape(view))
    flat = sum(terms).broadcast_to(shape).flatten().tolist()
    vals = torch.tensor([layout.outer(v + layout.offset) for v in flat]).reshape(shape)
    return static_facts(vals)


class IndexView(View):
    """Elementwise (NumPy "advanced") indexing: element ``e`` of the tile is
    ``tensor[idx_0[e], ..., idx_{n-1}[e]]``, one integer index tile (or scalar) per tensor
    dimension, all broadcast to one shape. Indices outside ``[0, size)`` are masked.

    Unlike ``x[i, j]`` with two index tiles (the outer product), this pairs the indices up:
    what a score mod needs to read ``bias[h, q_idx - kv_idx]`` at every score element.
    """

    def __init__(self, tensor: TensorRef, indices):
        if len(indices) != tensor.ndim:
            raise TypeCheckError(
                f"gather needs one index per dimension of {tensor.name} ({tensor.ndim}), got "
                f"{len(indices)}"
            )
        idx = []
        for i in indices:
            t = as_tile(i)
            if not (t.dtype.is_int or t.dtype.is_bool):
                raise TypeCheckError(f"gather indices must be integers, got {t.type}")
            idx.append(t)
        from .tile import broadcast_shapes

        self.indices = idx
        self._shape = broadcast_shapes(*(t.shape for t in idx))
        super().__init__(tensor, (), ())

    def _static_shape(self) -> tuple[int, ...]:
        return self._shape

    def __getitem__(self, idx):
        raise TypeCheckError("a gathered view cannot be sliced")

    def tile(self, tiler, coord):
        raise TypeCheckError("a gathered view cannot be tiled")

    def offsets(self, *, bounds_check: bool = True):
        t = self.tensor
        shape = self._shape
        total, mask = None, None
        for d, i in enumerate(self.indices):
            i = cast(i, t.index_dtype)
            term = _mul(i, t.stride[d])
            total = term if total is None else total + term
            if bounds_check:
                ok = (i >= 0) & (i < t.shape[d])
                mask = ok if mask is None else mask & ok
        offs = broadcast_to(as_tile(total, t.index_dtype), shape)
        if mask is not None:
            mask = broadcast_to(mask, shape)
        return offs, mask


def _gather(self: TensorRef, *indices) -> IndexView:
    """``x.gather(i, j, ...)``: see ``IndexView``."""
    return IndexView(self, indices)


TensorRef.gather = _gather


def _load_at(self: TensorRef, base, offsets, mask=None, other=None, *, fold_base=True) -> Tile:
    """``x.load_at(base, offsets, mask, other)``: the elements at element offsets ``base +
    offsets`` from the tensor's first element (``base`` a scalar, ``offsets`` an integer
    tile; cast to the tensor's index dtype), no bounds check: ``mask`` is the whole mask and
    masked-off elements read ``other`` (0 by default).

    What it adds over a view's load: the scalar ``base`` stays apart from the per-element
    offsets. AMD targets with buffer loads fold it into the buffer's base address (one
    scalar add per load site), so per-element offsets that do not change across a loop are
    computed once before it instead of one vector add per load instruction on every trip.
    Their range must then be provable to Triton (from the offsets' arithmetic: a bounded
    index times a stride clamped to a known bound); otherwise Triton uses 64-bit global
    loads from the based pointer.

    ``fold_base=False`` keeps the base in the offsets instead (the plain ``base + offsets``
    address, one vector add per load): where loads of several tensors share their
    per-element offsets and a base that moves by a constant step per trip, LLVM carries each
    shared offset register across the loop with one add per trip, where a folded base
    builds a new buffer descriptor per tensor and trip (gfx950 prefill forward: 13 scalar
    and vector instructions per KV tile for K and V's addresses with views, 10 with folded
    bases, 6 without)."""
    idx = self.index_dtype
    b = cast(as_tile(base, idx), idx)
    if b.shape != ():
        raise TypeCheckError(f"load_at's base must be a scalar, got {b.type}")
    offs = as_tile(offsets, idx)
    if not offs.dtype.is_int:
        raise TypeCheckError(f"load_at's offsets must be integers, got {offs.type}")
    offs = cast(offs, idx)
    operands = [self._v, b._v, offs._v]
    if mask is not None:
        m = broadcast_to(as_tile(mask), offs.shape)
        if not m.dtype.is_bool:
            raise TypeCheckError(f"a mask must be a bool tile, got {m.type}")
        o = broadcast_to(
            cast(as_tile(0 if other is None else other, self.dtype), self.dtype), offs.shape
        )
        operands += [m._v, o._v]
    attrs = {} if fold_base else {"fold_base": False}
    return Tile(current().emit("load_at", operands, attrs).result)


TensorRef.load_at = _load_at


def _layout_view(self: TensorRef, layout, offset=0) -> LayoutView:
    """``x.view(layout, offset)``: see ``LayoutView``."""
    return LayoutView(self, layout, offset)


TensorRef.view = _layout_view
