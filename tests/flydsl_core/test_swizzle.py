"""Swizzle functors and ComposedLayout (CuTe's Swizzle<B,M,S> and A o O o B)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flydsl_core.exc import LayoutError
from flydsl_core.layout import (
    ComposedLayout,
    Layout,
    LayoutRight,
    Swizzle,
    composition,
    make_composed_layout,
    make_swizzled_layout,
    size,
)

pytestmark = pytest.mark.cpu

VALID = [
    (bits, base, shift)
    for bits in range(4)
    for base in range(4)
    for shift in range(-(bits + 2), bits + 3)
    if abs(shift) >= bits
]


def test_masks_follow_cute():
    sw = Swizzle(3, 4, 3)
    assert (sw.bit_mask, sw.yyy_mask, sw.zzz_mask) == (0b111, 0b111 << 7, 0b111 << 4)
    neg = Swizzle(2, 1, -3)  # YYY below ZZZ: shifted left
    assert (neg.yyy_mask, neg.zzz_mask) == (0b11 << 1, 0b11 << 4)
    assert Swizzle(2, 3) == Swizzle(2, 3, 2)  # shift defaults to bits


@pytest.mark.parametrize(
    ("sw", "offset", "expected"),
    [
        (Swizzle(3, 4, 3), 0x80, 0x90),  # bit 7 -> bit 4
        (Swizzle(3, 4, 3), 0x3F0, 0x380),  # YYY=111 cancels ZZZ=111
        (Swizzle(3, 4, 3), 0x0F, 0x0F),  # base bits untouched
        (Swizzle(1, 0, 1), 2, 3),
        (Swizzle(2, 0, 2), 0b1101, 0b1110),
        (Swizzle(2, 1, -3), 0b0000110, 0b0110110),
        (Swizzle(0, 4, 0), 12345, 12345),  # zero bits: identity
    ],
)
def test_known_values(sw, offset, expected):
    assert sw(offset) == expected


@pytest.mark.parametrize(("bits", "base", "shift"), VALID, ids=lambda v: str(v))
def test_swizzle_is_an_involution_and_bijection(bits, base, shift):
    sw = Swizzle(bits, base, shift)
    n = sw.size()
    assert n == 1 << (bits + base + abs(shift))
    images = [sw(o) for o in range(n)]
    assert sorted(images) == list(range(n))  # a bijection on the aligned block
    assert all(sw(y) == o for o, y in enumerate(images))  # its own inverse
    # Only the ZZZ field ever changes.
    assert all((o ^ y) & ~sw.zzz_mask == 0 for o, y in enumerate(images))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(VALID), st.integers(0, 1 << 20))
def test_swizzle_involution_on_any_offset(params, offset):
    sw = Swizzle(*params)
    assert sw(sw(offset)) == offset
    assert sw(offset) // sw.size() == offset // sw.size()  # stays in its block


@pytest.mark.parametrize(
    "args", [(3, 4, 2), (2, 0, -1), (-1, 0, 1), (1, -1, 1), (1.0, 0, 1), ("3", 4, 3)]
)
def test_invalid_swizzles(args):
    with pytest.raises(LayoutError):
        Swizzle(*args)


def test_swizzle_value_semantics():
    sw = Swizzle(3, 4, 3)
    assert repr(sw) == str(sw) == "Sw<3,4,3>"
    assert sw == Swizzle(3, 4, 3) and hash(sw) == hash(Swizzle(3, 4, 3))
    assert sw != Swizzle(3, 3, 3)
    assert pickle.loads(pickle.dumps(sw)) == sw
    with pytest.raises(AttributeError):
        sw.bits = 2


# ---------------------------------------------------------------------------
# ComposedLayout
# ---------------------------------------------------------------------------


def _smem() -> ComposedLayout:
    return make_swizzled_layout(Swizzle(3, 4, 3), Layout((8, 64), LayoutRight))


def test_composed_layout_basics():
    c = _smem()
    assert repr(c) == str(c) == "Sw<3,4,3> o 0 o (8,64):(64,1)"
    assert c.shape == (8, 64)
    assert (size(c), c.cosize(), c.rank(), c.depth(), len(c)) == (512, 512, 2, 1, 2)
    sw, inner = Swizzle(3, 4, 3), Layout((8, 64), (64, 1))
    for i in range(size(c)):
        assert c(i) == sw(inner(i))
    assert c(3, 5) == sw(3 * 64 + 5)
    assert sorted(c(i) for i in range(512)) == list(range(512))  # still a bijection
    assert c == _smem() and hash(c) == hash(_smem())
    assert pickle.loads(pickle.dumps(c)) == c
    assert make_swizzled_layout((3, 4, 3), (8, 64)) == ComposedLayout(sw, 0, Layout((8, 64)))
    assert Swizzle(3, 4, 3).compose(inner) == c


def test_composed_layout_offset_and_outer_layout():
    sw, inner = Swizzle(2, 0, 2), Layout((4, 4))
    c = ComposedLayout(sw, 16, inner)
    assert repr(c) == "Sw<2,0,2> o 16 o (4,4):(1,4)"
    assert [c(i) for i in range(16)] == [sw(16 + inner(i)) for i in range(16)]
    outer = Layout((2, 8), (8, 1))  # any Layout can be the outer function too
    c2 = make_composed_layout(outer, 1, inner)
    assert [c2(i) for i in range(15)] == [outer(1 + inner(i)) for i in range(15)]


def test_composed_layout_slicing_folds_offset():
    c = _smem()
    col = c(None, 3)
    assert isinstance(col, ComposedLayout) and col.offset == 3
    assert col.inner == Layout((8,), (64,))
    assert [col(i) for i in range(8)] == [c(i, 3) for i in range(8)]
    row = c(2, None)
    assert row.offset == 128
    assert [row(j) for j in range(64)] == [c(2, j) for j in range(64)]
    assert c[1] == ComposedLayout(Swizzle(3, 4, 3), 0, Layout(64, 1))
    assert list(c) == [c[0], c[1]]


def test_composed_layout_composition_on_the_right():
    c = _smem()
    # Reshape the 512 elements as 64x8, column-major.
    tile = Layout((64, 8))
    r = composition(c, tile)
    assert isinstance(r, ComposedLayout) and r == c.compose(tile)
    assert r.inner == composition(Layout((8, 64), (64, 1)), tile)
    assert [r(i) for i in range(512)] == [c(tile(i)) for i in range(512)]
    # A by-mode tiler picks a 4x16 sub-block.
    sub = composition(c, (4, 16))
    assert sub.shape == (4, 16)
    assert all(sub(i, j) == c(i, j) for i in range(4) for j in range(16))


def test_composed_layout_errors():
    with pytest.raises(LayoutError, match="inner must be a Layout"):
        ComposedLayout(Swizzle(1, 0, 1), 0, (4, 4))
    with pytest.raises(LayoutError, match="outer must be"):
        ComposedLayout(lambda x: x, 0, Layout(4))
