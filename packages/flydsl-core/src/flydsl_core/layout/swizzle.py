"""Swizzle functors and composed (swizzled) layouts, as in NVIDIA CuTe.

``Swizzle(bits, base, shift)`` XORs a field of ``bits`` bits ("YYY") into
another field ("ZZZ") of an offset::

    0bxxxxxxxxxxxxxxxYYYxxxxxxxZZZxxxx
                                  ^--^ base: low bits kept constant
                     ^-^       ^-^     bits: width of each field
                       ^---------^     shift: distance from YYY down to ZZZ

    yyy_mask = ((1 << bits) - 1) << (base + max(0, shift))
    zzz_mask = ((1 << bits) - 1) << (base - min(0, shift))
    sw(o)    = o ^ ((o & yyy_mask) >> shift)      (shift >= 0; << -shift if negative)

Because ``|shift| >= bits`` the two fields never overlap, so a swizzle is an
involution (its own inverse) and a bijection on every aligned block of
``2 ** (bits + base + |shift|)`` offsets.

``ComposedLayout(outer, offset, inner)`` is the function
``c -> outer(offset + inner(c))``; its domain (shape, size, coordinates) is
the inner Layout's. The usual swizzled shared-memory layout is
``Sw<3,4,3> o 0 o (8,64):(64,1)``.
"""

from __future__ import annotations

from ..exc import LayoutError
from .int_tuple import _add, has_none, is_int
from .layout import Layout, composition, slice_and_offset

__all__ = ["ComposedLayout", "Swizzle", "make_composed_layout", "make_swizzled_layout"]


class Swizzle:
    """CuTe's ``Swizzle<BBits, MBase, SShift>``; ``shift`` defaults to ``bits``."""

    __slots__ = ("base", "bits", "shift")

    def __init__(self, bits: int, base: int, shift: int | None = None):
        if shift is None:
            shift = bits
        for name, v in (("bits", bits), ("base", base), ("shift", shift)):
            if not is_int(v):
                raise LayoutError(f"Swizzle {name} must be an int; got {v!r}")
        if bits < 0 or base < 0:
            raise LayoutError(f"Swizzle<{bits},{base},{shift}>: bits and base must be >= 0")
        if abs(shift) < bits:
            raise LayoutError(
                f"Swizzle<{bits},{base},{shift}>: |shift| must be >= bits so the YYY and ZZZ "
                "bit fields do not overlap"
            )
        object.__setattr__(self, "bits", bits)
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "shift", shift)

    def __setattr__(self, name, value):
        raise AttributeError(f"Swizzle is immutable; cannot set {name!r}")

    @property
    def bit_mask(self) -> int:
        return (1 << self.bits) - 1

    @property
    def yyy_mask(self) -> int:
        """The source field, read and shifted onto the ZZZ field."""
        return self.bit_mask << (self.base + max(0, self.shift))

    @property
    def zzz_mask(self) -> int:
        """The destination field, XORed with YYY."""
        return self.bit_mask << (self.base - min(0, self.shift))

    def size(self) -> int:
        """``2 ** (bits + base + |shift|)``: every aligned block of this many
        offsets is mapped onto itself."""
        return 1 << (self.bits + self.base + abs(self.shift))

    def __call__(self, offset):
        if self.bits == 0:
            return offset  # identity; keeps symbolic offsets untouched
        picked = offset & self.yyy_mask
        moved = picked >> self.shift if self.shift >= 0 else picked << -self.shift
        return offset ^ moved

    def compose(self, layout) -> ComposedLayout:
        """``Sw o layout`` (offset 0)."""
        return make_swizzled_layout(self, layout)

    def __eq__(self, other):
        if not isinstance(other, Swizzle):
            return NotImplemented
        return (self.bits, self.base, self.shift) == (other.bits, other.base, other.shift)

    def __hash__(self) -> int:
        return hash((Swizzle, self.bits, self.base, self.shift))

    def __reduce__(self):
        return (Swizzle, (self.bits, self.base, self.shift))

    def __repr__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"

    __str__ = __repr__


class ComposedLayout:
    """``outer o offset o inner``: ``c -> outer(offset + inner(c))``.

    ``outer`` is a :class:`Swizzle` or a :class:`Layout`, ``inner`` a
    :class:`Layout` (it defines the domain), ``offset`` an int.
    """

    __slots__ = ("inner", "offset", "outer")

    def __init__(self, outer, offset, inner):
        if not isinstance(outer, (Swizzle, Layout)):
            raise LayoutError(f"ComposedLayout outer must be a Swizzle or a Layout; got {outer!r}")
        if not isinstance(inner, Layout):
            raise LayoutError(f"ComposedLayout inner must be a Layout; got {inner!r}")
        object.__setattr__(self, "outer", outer)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "inner", inner)

    def __setattr__(self, name, value):
        raise AttributeError(f"ComposedLayout is immutable; cannot set {name!r}")

    # The domain is the inner layout's.
    @property
    def shape(self):
        return self.inner.shape

    def size(self) -> int:
        return self.inner.size()

    def cosize(self) -> int:
        return self.inner.cosize()

    def rank(self) -> int:
        return self.inner.rank()

    def depth(self) -> int:
        return self.inner.depth()

    def __len__(self) -> int:
        return self.rank()

    def __getitem__(self, i) -> ComposedLayout:
        return ComposedLayout(self.outer, self.offset, self.inner[i])

    def __iter__(self):
        for i in range(self.rank()):
            yield self[i]

    def __call__(self, *crd):
        if not crd:
            raise LayoutError(f"{self} was called without a coordinate")
        coord = crd[0] if len(crd) == 1 else crd
        if has_none(coord):
            # A slice keeps the outer function and folds the slice's offset in.
            sub, off = slice_and_offset(coord, self.inner)
            return ComposedLayout(self.outer, _add(self.offset, off), sub)
        return self.outer(_add(self.offset, self.inner(coord)))

    def compose(self, tiler) -> ComposedLayout:
        """``(outer o offset o inner) o tiler = outer o offset o (inner o tiler)``."""
        return ComposedLayout(self.outer, self.offset, composition(self.inner, tiler))

    def __eq__(self, other):
        if not isinstance(other, ComposedLayout):
            return NotImplemented
        return (self.outer, self.offset, self.inner) == (other.outer, other.offset, other.inner)

    def __hash__(self) -> int:
        return hash((ComposedLayout, self.outer, self.offset, self.inner))

    def __reduce__(self):
        return (ComposedLayout, (self.outer, self.offset, self.inner))

    def __repr__(self) -> str:
        return f"{self.outer} o {self.offset} o {self.inner}"

    __str__ = __repr__


def make_composed_layout(outer, offset, inner) -> ComposedLayout:
    return ComposedLayout(outer, offset, inner)


def make_swizzled_layout(swizzle, layout, offset: int = 0) -> ComposedLayout:
    """``swizzle o offset o layout``. ``swizzle`` may be a Swizzle or a
    ``(bits, base, shift)`` tuple; ``layout`` a Layout or a shape."""
    if isinstance(swizzle, tuple):
        swizzle = Swizzle(*swizzle)
    if not isinstance(layout, Layout):
        layout = Layout(layout)
    return ComposedLayout(swizzle, offset, layout)
