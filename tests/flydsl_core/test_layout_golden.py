"""Golden worked examples of the CuTe layout algebra.

Sources, per case:
  [doc]   NVIDIA CUTLASS, media/docs/cpp/cute/02_layout_algebra.md (the value is
          printed in the text; static integers, so CuTe prints it coalesced).
  [hand]  Derived by hand with CuTe's algorithm (include/cute/layout.hpp), step
          by step in the comment, because the docs only show a picture or a
          partial result.
"""

from __future__ import annotations

import pytest

from flydsl_core.exc import LayoutError
from flydsl_core.layout import (
    Layout,
    blocked_product,
    coalesce,
    complement,
    composition,
    filter_layout,
    flat_divide,
    left_inverse,
    logical_divide,
    logical_product,
    raked_product,
    right_inverse,
    size,
    tiled_divide,
    zipped_divide,
)

pytestmark = pytest.mark.cpu

P = Layout.parse


def _check(result, expected: str):
    assert result == P(expected), f"got {result}, expected {expected}"
    assert str(result) == expected


# ---------------------------------------------------------------------------
# Coalesce
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "profile", "expected"),
    [
        ("(2,(1,6)):(1,(6,2))", None, "12:1"),  # [doc]
        ("(2,(1,6)):(1,(6,2))", (1, 1), "(2,6):(1,2)"),  # [doc] by-mode coalesce
        ("(4,1):(1,0)", None, "4:1"),  # [doc of coalesce_x in layout.hpp]
        ("(2,4):(1,2)", None, "8:1"),  # [doc] "(_2,_4):(_1,_2) acts like _8:_1"
        # [hand] the four binary cases of the doc:
        ("(3,1):(2,7)", None, "3:2"),  # s0:d0 ++ 1:d1 => s0:d0
        ("(1,3):(7,2)", None, "3:2"),  # 1:d0 ++ s1:d1 => s1:d1
        ("(3,4):(2,6)", None, "12:2"),  # s0:d0 ++ s1:s0*d0 => s0*s1:d0
        ("(3,4):(2,5)", None, "(3,4):(2,5)"),  # otherwise kept apart
        ("(1,1):(3,5)", None, "1:0"),  # all size-1
        ("(4,2):(0,0)", None, "8:0"),  # 4*0 == 0: broadcast modes merge
        ("():()", None, "1:0"),  # rank 0
        ("((2,2),(4,1)):((1,2),(4,0))", (1,), "(4,(4,1)):(1,(4,0))"),  # [hand] short profile
    ],
)
def test_coalesce(layout, profile, expected):
    _check(coalesce(P(layout), profile), expected)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("(4,1,8):(0,5,1)", "8:1"),
        ("4:0", "1:0"),
        ("(2,(3,1)):(0,(4,0))", "3:4"),
        ("((2,3),4):((1,0),6)", "(2,4):(1,6)"),
    ],
)
def test_filter(layout, expected):
    # [hand] filter = coalesce after setting the shape of stride-0 modes to 1
    _check(filter_layout(P(layout)), expected)


# ---------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("(6,2):(8,2)", "(4,3):(3,1)", "((2,2),3):((24,2),8)"),  # [doc] worked example 1
        ("20:2", "(5,4):(4,1)", "(5,4):(8,2)"),  # [doc] example 2
        ("(10,2):(16,4)", "(5,4):(1,5)", "(5,(2,2)):(16,(80,4))"),  # [doc] example 3
        # [doc] "(3,6,2,8):(w,x,y,z) o 16:9 = (1,2,2,4):(9w,3x,y,z)", here with
        # (w,x,y,z) = (1000,100,10,1); the size-1 mode coalesces away.
        ("(3,6,2,8):(1000,100,10,1)", "16:9", "(2,2,4):(300,10,1)"),
        ("4:3", "8:0", "8:0"),  # [hand] stride-0 B: constant
        ("(4,8):(0,1)", "8:1", "(4,2):(0,1)"),  # [hand] broadcast A: 8/4 = 2 left for mode 1
        ("(4,1):(1,0)", "8:1", "(4,2):(1,0)"),  # [hand] the size-1 tail keeps its stride 0
        ("1:5", "4:1", "4:5"),  # [hand] A extended past its domain
        ("():()", "(4,2):(1,4)", "(4,2):(0,0)"),  # [hand] rank-0 A maps everything to 0
        ("(4,8):(8,1)", "():()", "():()"),  # [hand] rank-0 B
    ],
)
def test_composition(a, b, expected):
    _check(composition(P(a), P(b)), expected)


def test_by_mode_composition_docs():
    a = P("(12,(4,8)):(59,(13,1))")
    # [doc] <3:4, 8:2> -> (_3,(2,4)):(236,(26,1))
    _check(composition(a, (P("3:4"), P("8:2"))), "(3,(2,4)):(236,(26,1))")
    # [doc] a shape is a tiler of stride-1 layouts: (3,8) -> (_3,(4,2)):(59,(13,1))
    _check(composition(a, (3, 8)), "(3,(4,2)):(59,(13,1))")
    # None leaves a mode unchanged; modes not named are dropped (CuTe)
    _check(composition(a, (None, 8)), "(12,(4,2)):(59,(13,1))")
    _check(composition(a, (3,)), "(3):(59)")
    assert composition(a, None) == a


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("(4,3):(1,5)", "3:1"),  # shape divisibility: 4 and 3
        ("(4,3):(1,5)", "2:3"),  # stride divisibility: 4 and 3
        ("(4,1):(1,0)", "6:1"),  # CuTe keeps the size-1 tail: 6 vs 4
    ],
)
def test_composition_divisibility_errors(a, b):
    with pytest.raises(LayoutError, match="divisibility condition"):
        composition(P(a), P(b))


def test_composition_tiler_rank_error():
    with pytest.raises(LayoutError, match="at most rank"):
        composition(P("(4,8):(1,4)"), (2, 2, 2))


# ---------------------------------------------------------------------------
# Complement
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "cotarget", "expected"),
    [
        ("4:1", 24, "6:4"),  # [doc]
        ("6:4", 24, "4:1"),  # [doc]
        ("(4,6):(1,4)", 24, "1:0"),  # [doc] "nothing needs to be appended" (_1:_0)
        ("4:2", 24, "(2,3):(1,8)"),  # [doc]
        ("(2,4):(1,6)", 24, "3:2"),  # [doc]
        ("(2,2):(1,6)", 24, "(3,2):(2,12)"),  # [doc]
        ("(2,2):(4,1)", 24, "(2,3):(2,8)"),  # [doc] logical product example, A* = (2,3):(2,8)
        ("4:2", None, "2:1"),  # [hand] default cotarget cosize(4:2) = 7
        ("(4,8):(0,1)", 32, "4:8"),  # [hand] stride-0 mode is filtered first
        ("4:0", 12, "12:1"),  # [hand] a constant: the rest is everything
        ("():()", 4, "4:1"),  # [hand] rank 0
        # [hand] a shape cotarget is divided mode by mode, as CuTe does:
        # ceil_div((3,8), 2) = (2,8), so the rest has 16 (not 12) elements
        ("2:1", (3, 8), "16:2"),
        ("2:1", (4, 8), "16:2"),
    ],
)
def test_complement(a, cotarget, expected):
    _check(complement(P(a), cotarget), expected)


@pytest.mark.parametrize("a", ["(2,2):(1,1)", "(4,2):(1,2)", "(2,2):(3,4)"])
def test_complement_rejects_overlapping_modes(a):
    with pytest.raises(LayoutError, match="overlaps"):
        complement(P(a), 24)


# ---------------------------------------------------------------------------
# Inverses
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        # [hand] follow strides 1, 4, 32 through the coalesced layout
        ("(8,4):(4,1)", "(4,8):(8,1)"),
        ("(2,4,6):(4,1,8)", "(4,2,6):(2,1,8)"),
        ("(2,4,4,6):(4,1,0,8)", "(4,2,6):(2,1,32)"),
        ("(4,2):(1,5)", "4:1"),  # 5 != 4 breaks the chain
        ("(4,2):(1,16)", "4:1"),
        ("(2,4):(0,2)", "1:0"),  # no stride-1 mode
        ("4:-1", "4:-1"),  # [hand] negative stride: sign carried over
        ("(4,8):(1,4)", "32:1"),
        ("1:0", "1:0"),
    ],
)
def test_right_inverse(a, expected):
    layout = P(a)
    result = right_inverse(layout)
    _check(result, expected)
    for i in range(size(result)):
        assert layout(result(i)) == i


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        # [hand] complement((2,2):(1,4)) = 2:2, right_inverse(((2,2),2):((1,4),2))
        ("(2,2):(1,4)", "(2,2,2):(1,4,2)"),
        ("(4,8):(8,1)", "(8,4):(4,1)"),  # [hand] transpose
        ("4:2", "(2,4):(4,1)"),  # [hand] complement 2:1 fills the holes
    ],
)
def test_left_inverse(a, expected):
    layout = P(a)
    result = left_inverse(layout)
    _check(result, expected)
    for i in range(size(layout)):
        assert result(layout(i)) == i


# ---------------------------------------------------------------------------
# Divide
# ---------------------------------------------------------------------------


def test_logical_divide_1d_doc():
    # [doc] (4,2,3):(2,1,8) / 4:2: B* = (2,3):(1,8), result ((2,2),(2,3)):((4,1),(2,8))
    a, b = P("(4,2,3):(2,1,8)"), P("4:2")
    _check(complement(b, size(a)), "(2,3):(1,8)")
    _check(logical_divide(a, b), "((2,2),(2,3)):((4,1),(2,8))")


def test_divide_2d_doc():
    a = P("(9,(4,8)):(59,(13,1))")
    tiler = (P("3:3"), P("(2,4):(1,8)"))
    # [doc] the tile is (3,(2,4)):(177,(13,2)); shapes ((3,3),(8,4)) and ((3,8),(3,4)).
    # [hand] the rest of mode 1: complement((2,4):(1,8), (4,8)) = 4:2 and
    #        (4,8):(13,1) o 4:2 = (2,2):(26,1); mode 0: 9:59 o (3:3, 3:1).
    _check(logical_divide(a, tiler), "((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))")
    zd = zipped_divide(a, tiler)
    _check(zd, "((3,(2,4)),(3,(2,2))):((177,(13,2)),(59,(26,1)))")
    _check(zd[0], "(3,(2,4)):(177,(13,2))")
    assert zd[0] == composition(a, tiler)  # [doc] layout<0>(zipped_divide(a,b)) == a o b
    _check(tiled_divide(a, tiler), "((3,(2,4)),3,(2,2)):((177,(13,2)),59,(26,1))")
    _check(flat_divide(a, tiler), "(3,(2,4),3,(2,2)):(177,(13,2),59,(26,1))")


def test_divide_with_none_and_int_tilers():
    a = P("(8,6):(1,8)")
    # [hand] 8 / 4:1 = (4,2):(1,4); mode 1 untouched; None contributes a trivial tile
    _check(logical_divide(a, (4, None)), "((4,2),6):((1,4),8)")
    _check(zipped_divide(a, (4, None)), "((4,1),(2,6)):((1,0),(4,8))")


# ---------------------------------------------------------------------------
# Product
# ---------------------------------------------------------------------------


def test_logical_product_1d_doc():
    # [doc] (2,2):(4,1) * 6:1 = ((2,2),(2,3)):((4,1),(2,8))
    _check(logical_product(P("(2,2):(4,1)"), P("6:1")), "((2,2),(2,3)):((4,1),(2,8))")
    # [hand] the doc's picture with B = (4,2):(2,1): complement(A, 4*8) = (2,4):(2,8),
    #        composed with B gives (4,2):(8,2)
    _check(logical_product(P("(2,2):(4,1)"), P("(4,2):(2,1)")), "((2,2),(4,2)):((4,1),(8,2))")


def test_blocked_and_raked_product_doc_2d():
    # [hand] the doc's picture: 2x5 row-major block over a 3x4 column-major tiler.
    # logical_product = ((2,5),(3,4)):((5,1),(10,30)); blocked zips like modes and
    # coalesces each, so mode 0 (2,3):(5,10) becomes 6:5 ("blocked_product went
    # ahead and coalesced mode-0 for us").
    block, tiler = P("(2,5):(5,1)"), P("(3,4):(1,3)")
    _check(blocked_product(block, tiler), "(6,(5,4)):(5,(1,30))")
    _check(raked_product(block, tiler), "((3,2),(4,5)):((10,5),(30,1))")


def test_blocked_and_raked_product_small():
    # [hand] A* = complement((2,2):(1,2), 4*6) = 6:4; A* o (2,3):(3,1) = (2,3):(12,4);
    # zip -> ((2,2),(2,3)):((1,12),(2,4)); mode 1 coalesces (2*2 == 4) to 6:2.
    block, tiler = P("(2,2):(1,2)"), P("(2,3):(3,1)")
    _check(blocked_product(block, tiler), "((2,2),6):((1,12),2)")
    _check(raked_product(block, tiler), "((2,2),(3,2)):((12,1),(4,2))")


def test_rank_sensitive_products_pad_ranks():
    # [hand] rank 1 block over a rank-2 tiler: the block is padded with 1:0
    _check(blocked_product(P("4:1"), P("(2,3):(1,2)")), "(8,3):(1,8)")
    # rank 1 with rank 1: one mode holding (block, tiler), coalesced
    _check(blocked_product(P("4:1"), P("3:1")), "(12):(1)")
    _check(raked_product(P("4:1"), P("3:1")), "((3,4)):((4,1))")
