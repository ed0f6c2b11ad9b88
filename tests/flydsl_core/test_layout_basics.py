"""Layout construction, value semantics, notation, IntTuple helpers, errors,
and coordinate maps over symbolic (traced) integers."""

from __future__ import annotations

import pickle

import pytest

from flydsl_core.exc import LayoutError
from flydsl_core.layout import (
    Layout,
    LayoutLeft,
    LayoutRight,
    ceil_div,
    compact_row_major,
    compatible,
    congruent,
    cosize,
    crd2crd,
    crd2idx,
    depth,
    elem_scale,
    flatten,
    idx2crd,
    inner_product,
    is_int,
    make_layout,
    make_layout_right,
    prefix_product,
    product,
    rank,
    shape_div,
    size,
    slice_and_offset,
    weakly_congruent,
)

pytestmark = pytest.mark.cpu


# ---------------------------------------------------------------------------
# Construction and defaults
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (8, "8:1"),
        ((4, 8), "(4,8):(1,4)"),
        (((2, 2), 8), "((2,2),8):((1,2),4)"),
        ((4, 1, 8), "(4,1,8):(1,0,4)"),  # size-1 modes get stride 0, as CuTe's static shapes
        (1, "1:0"),
        ((8,), "(8):(1)"),
        ((), "():()"),
    ],
)
def test_default_stride_is_compact_column_major(shape, expected):
    assert str(Layout(shape)) == expected
    assert Layout(shape, LayoutLeft) == Layout(shape)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((4, 8), "(4,8):(8,1)"),
        (((2, 3), 4), "((2,3),4):((12,4),1)"),
        ((4, 1, 8), "(4,1,8):(8,0,1)"),
        (8, "8:1"),
    ],
)
def test_layout_right(shape, expected):
    assert str(Layout(shape, LayoutRight)) == expected
    assert make_layout_right(shape) == Layout(shape, LayoutRight)
    assert compact_row_major(shape) == Layout(shape, LayoutRight).stride


def test_lists_are_accepted_as_tuples():
    assert Layout([4, [2, 2]], [1, [4, 8]]) == Layout((4, (2, 2)), (1, (4, 8)))


def test_queries():
    layout = Layout(((2, 2), 8), ((1, 16), 2))
    assert size(layout) == layout.size() == 32
    assert cosize(layout) == layout.cosize() == 1 + 16 + 14 + 1
    assert rank(layout) == layout.rank() == len(layout) == 2
    assert depth(layout) == layout.depth() == 2
    assert layout[0] == Layout((2, 2), (1, 16))
    assert layout[1] == Layout(8, 2)
    assert layout[-1] == layout[1]
    assert list(layout) == [layout[0], layout[1]]
    assert layout[0:1] == make_layout(layout[0])
    assert Layout(8)[0] == Layout(8)  # an int layout is its own only mode
    assert Layout(4, -2).cosize() == 7  # measured with |stride|, as CuTe's coshape


def test_rank0_layout():
    empty = make_layout()
    assert empty == Layout((), ())
    assert (size(empty), cosize(empty), rank(empty), depth(empty)) == (1, 1, 0, 1)
    assert empty(0) == 0
    assert list(empty) == []


def test_make_layout_concatenates():
    a, b = Layout(4, 1), Layout((2, 3), (4, 8))
    assert make_layout(a, b) == Layout((4, (2, 3)), (1, (4, 8)))
    assert make_layout([a, b]) == make_layout(a, b)
    assert make_layout(x for x in (a, b)) == make_layout(a, b)
    assert make_layout(a) == Layout((4,), (1,))
    with pytest.raises(LayoutError, match="concatenates Layouts"):
        make_layout((4, 8))


def test_value_semantics():
    a, b = Layout((4, 8), (8, 1)), Layout.parse("(4,8):(8,1)")
    assert a == b and hash(a) == hash(b) and a is not b
    assert Layout(8) != Layout((8,))  # int vs 1-tuple shape, as in CuTe
    assert a != "(4,8):(8,1)"
    assert {a: 1}[b] == 1
    with pytest.raises(AttributeError):
        a.shape = (1,)
    assert pickle.loads(pickle.dumps(a)) == a
    assert pickle.loads(pickle.dumps(LayoutRight)) is LayoutRight


# ---------------------------------------------------------------------------
# Calling and slicing
# ---------------------------------------------------------------------------


def test_call_with_coordinates_and_indices():
    layout = Layout((4, 8), (8, 1))
    assert layout(1, 2) == layout((1, 2)) == 10
    assert layout(5) == layout(1, 1) == 9  # 1-D index, colexicographic
    assert layout(33) == layout(1, 8)  # past the end: the last mode extends
    nested = Layout((2, (2, 2)), (1, (4, 2)))
    assert nested(1, (1, 0)) == 5
    assert nested(1, 2) == nested(1, (0, 1)) == 3  # an int at a nested mode is split too


def test_slicing_with_none():
    layout = Layout((4, 8), (8, 1))
    assert layout(None, 3) == Layout((4,), (8,))
    assert layout(2, None) == Layout((8,), (1,))
    assert layout(None, None) == Layout((4, 8), (8, 1))
    assert layout(None) == layout  # a top-level None keeps the whole layout
    nested = Layout((4, (3, 5)), (1, (4, 12)))
    assert nested(None, (None, 2)) == Layout((4, 3), (1, 4))  # kept parts are concatenated
    sub, offset = slice_and_offset((None, (1, 2)), nested)
    assert sub == Layout((4,), (1,)) and offset == 4 + 24


# ---------------------------------------------------------------------------
# Notation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "layout"),
    [
        ("(4,8):(8,1)", Layout((4, 8), (8, 1))),
        ("((2,2),8):((1,16),2)", Layout(((2, 2), 8), ((1, 16), 2))),
        ("8:1", Layout(8, 1)),
        ("(8):(1)", Layout((8,), (1,))),
        ("():()", Layout((), ())),
        ("( 4 , 8 ) : ( -8 , 1 )", Layout((4, 8), (-8, 1))),
        ("(_4,_8):(_8,_1)", Layout((4, 8), (8, 1))),  # CuTe's static integers
    ],
)
def test_parse(text, layout):
    assert Layout.parse(text) == layout


@pytest.mark.parametrize(
    "text",
    [
        "",
        "(4,8)",
        "(4,8):(8,1",
        "(4,8):(8,1))",
        "(4,,8):(1,4)",
        "4:x",
        "(4,8):(1)",
        "0:1",
        "\u00b2:1",
    ],
)
def test_parse_errors(text):
    with pytest.raises(LayoutError):
        Layout.parse(text)


def test_json():
    layout = Layout(((2, 2), 8), ((1, 16), 2))
    assert layout.to_json() == {"shape": [[2, 2], 8], "stride": [[1, 16], 2]}
    assert Layout.from_json(layout.to_json()) == layout
    assert Layout(8).to_json() == {"shape": 8, "stride": 1}
    with pytest.raises(LayoutError, match="'shape' and 'stride'"):
        Layout.from_json({"shape": 8})


# ---------------------------------------------------------------------------
# User errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "stride", "match"),
    [
        ((4, 8), (1,), "not congruent"),
        ((4, 8), 1, "not congruent"),
        (4, (1, 4), "not congruent"),
        ((4, (2, 2)), (1, 4, 8), "not congruent"),
        ((4, 0), None, ">= 1"),
        ((4, -2), None, ">= 1"),
        ((4, 2.0), None, "nested tuple of ints"),
        ((True, 2), None, "nested tuple of ints"),
        ("4", None, "nested tuple of ints"),
    ],
)
def test_construction_errors(shape, stride, match):
    with pytest.raises(LayoutError, match=match):
        Layout(shape, stride)


def test_coordinate_errors():
    layout = Layout((4, 8), (8, 1))
    with pytest.raises(LayoutError, match="rank 3"):
        layout(1, 2, 3)
    with pytest.raises(LayoutError, match="is a tuple but the shape"):
        Layout(8)((1, 2))
    with pytest.raises(LayoutError, match="out of range"):
        layout[2]
    with pytest.raises(LayoutError, match="without a coordinate"):
        layout()
    with pytest.raises(LayoutError, match="not a coordinate"):
        layout([1, 2])
    with pytest.raises(LayoutError, match="not a coordinate"):
        idx2crd(1.5, (4, 8))


def test_layout_error_is_a_value_error():
    with pytest.raises(ValueError):
        Layout((4, 8), (1,))


# ---------------------------------------------------------------------------
# IntTuple helpers
# ---------------------------------------------------------------------------


def test_int_tuple_helpers():
    assert is_int(3) and not is_int(True) and not is_int((3,))
    assert flatten(((2, (3,)), 4)) == (2, 3, 4) and flatten(5) == (5,)
    assert product(((2, 3), 4)) == 24 and product(()) == 1
    assert inner_product((2, (3, 4)), (1, (5, 6))) == 2 + 15 + 24
    assert prefix_product((2, (3, 4), 5)) == (1, (2, 6), 24)
    assert prefix_product((2, 3), 5) == (5, 10)
    assert prefix_product(((2, 3), (4, 5)), (1, 100)) == ((1, 2), (100, 400))
    assert elem_scale((2, (3, 4)), (5, (1, (2, 3)))) == (10, (3, 24))
    assert congruent((1, (2, 3)), (4, (5, 6))) and not congruent((1, 2), (1, (2, 3)))
    assert weakly_congruent((1, 2), (1, (2, 3))) and not weakly_congruent((1, (2, 3)), (1, 2))
    assert compatible(24, (4, 6)) and compatible((4, 6), (4, (2, 3)))
    assert not compatible((4, 6), 24)
    assert rank(5) == 1 and rank((1, 2, 3)) == 3 and depth(5) == 0 and depth(((1,),)) == 2


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((4, 5, 6), 40, (1, 1, 3)),  # CuTe's own example in int_tuple.hpp
        ((6, 2), 2, (3, 2)),  # [doc] "(6,2) / 2 => (3,2)"
        ((6, 2), 6, (1, 2)),  # [doc]
        ((6, 2), 12, (1, 1)),  # [doc]
        ((3, 6, 2, 8), 9, (1, 2, 2, 8)),  # [doc]
        ((3, 6, 2, 8), 72, (1, 1, 1, 4)),  # [doc]
        (2, 8, 1),  # rounds away from zero
        (-8, 2, -4),
        ((4, (2, 6)), (2, (1, 3)), (2, (2, 2))),
        (12, (2, 3), 2),
    ],
)
def test_shape_div(a, b, expected):
    assert shape_div(a, b) == expected


@pytest.mark.parametrize(("a", "b"), [(6, 4), ((4, 6), 3), ((2, 3), (1,)), (4, 0)])
def test_shape_div_divisibility_errors(a, b):
    with pytest.raises(LayoutError):
        shape_div(a, b)


def test_ceil_div():
    assert ceil_div(7, 2) == 4
    assert ceil_div((3, 8), 2) == (2, 8)  # 2 is absorbed by the first mode
    assert ceil_div((4, 8), 32) == (1, 1)
    assert ceil_div((4, 8), (3,)) == (2, 8)


def test_idx2crd_and_crd2crd():
    assert idx2crd(13, (4, 8)) == (1, 3)
    assert idx2crd(13, ((2, 2), 8)) == ((1, 0), 3)
    assert idx2crd(13, 16) == 13  # an int shape: the index is the coordinate
    assert idx2crd((5, 3), (4, (2, 2))) == (5, (1, 1))
    assert idx2crd(5, (4, 1, 8)) == (1, 0, 1)
    assert crd2idx((1, 3), (4, 8)) == 13
    assert crd2idx((1, 3), (4, 8), (8, 1)) == 11
    assert crd2crd((1, 3), (4, 8), 32) == 13
    assert crd2crd(13, 32, (4, 8)) == (1, 3)
    assert crd2crd((1, (1, 0)), (4, (2, 2)), (4, 4)) == (1, 1)


# ---------------------------------------------------------------------------
# Symbolic coordinates (traced integers of the DSL)
# ---------------------------------------------------------------------------


class Sym:
    """A traced integer that only supports + * // % and records the expression.

    Anything that would need a concrete value (comparisons, bool, int) raises,
    proving the layout code never inspects a coordinate's value.
    """

    __slots__ = ("expr",)

    def __init__(self, expr: str):
        self.expr = expr

    @staticmethod
    def _text(x) -> str:
        if isinstance(x, Sym):
            return x.expr
        assert type(x) is int, f"unexpected operand {x!r}"
        return str(x)

    def _op(self, op, other, reflected=False):
        a, b = self._text(self), self._text(other)
        return Sym(f"({b}{op}{a})" if reflected else f"({a}{op}{b})")

    def __add__(self, other):
        return self._op("+", other)

    def __radd__(self, other):
        return self._op("+", other, reflected=True)

    def __mul__(self, other):
        return self._op("*", other)

    def __rmul__(self, other):
        return self._op("*", other, reflected=True)

    def __floordiv__(self, other):
        return self._op("//", other)

    def __mod__(self, other):
        return self._op("%", other)

    def _concrete(self, *args):
        raise TypeError(f"symbolic value {self.expr} has no concrete value")

    __bool__ = __int__ = __index__ = __float__ = _concrete
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _concrete  # type: ignore[assignment]


def _eval(value, env: dict) -> int:
    return eval(value.expr, {}, env) if isinstance(value, Sym) else value


def _eval_tree(value, env):
    if isinstance(value, tuple):
        return tuple(_eval_tree(v, env) for v in value)
    return _eval(value, env)


SYM_LAYOUTS = [
    Layout((4, 8), (8, 1)),
    Layout(((2, 2), 8), ((1, 16), 2)),
    Layout((4, 1, 8), (1, 0, 4)),
    Layout((3, (2, 4)), (0, (1, 6))),
    Layout(16, 2),
    Layout((1, 1), (0, 0)),
]


@pytest.mark.parametrize("layout", SYM_LAYOUTS, ids=str)
def test_layout_call_on_symbolic_index(layout):
    out = layout(Sym("i"))
    for i in range(size(layout) + 3):  # also past the end
        assert _eval(out, {"i": i}) == layout(i)


@pytest.mark.parametrize("layout", SYM_LAYOUTS, ids=str)
def test_crd2idx_idx2crd_on_symbolic_values(layout):
    shape = layout.shape
    # A natural coordinate made of symbols, one per leaf.
    names = [f"c{k}" for k in range(len(flatten(shape)))]
    it = iter(names)

    def symbolic_like(s):
        return tuple(symbolic_like(x) for x in s) if isinstance(s, tuple) else Sym(next(it))

    crd = symbolic_like(shape)
    index = crd2idx(crd, shape, layout.stride)
    crd_sym = idx2crd(Sym("i"), shape)
    for i in range(size(layout)):
        concrete = idx2crd(i, shape)
        env = dict(zip(names, flatten(concrete)))
        assert _eval(index, env) == layout(concrete)
        assert _eval_tree(crd_sym, {"i": i}) == concrete
    assert crd2idx(Sym("x"), 8, 1).expr == "x"  # stride 1 adds no multiply


def test_symbolic_mixed_with_ints_and_slices():
    layout = Layout((4, 8), (8, 1))
    out = layout(Sym("i"), 3)
    assert _eval(out, {"i": 2}) == layout(2, 3)
    sub, offset = slice_and_offset((None, Sym("j")), layout)
    assert sub == Layout((4,), (8,))
    assert _eval(offset, {"j": 5}) == 5
    assert crd2idx((Sym("i"), 0), (4, 8), (8, 1)).expr == "(i*8)"
