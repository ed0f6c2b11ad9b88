"""Property-based tests of the CuTe layout algebra (hypothesis).

Layouts are drawn with small nested shapes (size-1 modes included) and with
compact column-major, compact row-major or random strides (stride 0 included).
Operations that CuTe rejects for a draw (a divisibility condition, a
non-complementable layout) raise LayoutError; those draws are discarded with
``assume`` and only the accepted ones are checked against the laws.
"""

from __future__ import annotations

import itertools
import json
import pickle

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flydsl_core.exc import LayoutError
from flydsl_core.layout import (
    Layout,
    LayoutRight,
    blocked_product,
    coalesce,
    compatible,
    complement,
    composition,
    congruent,
    crd2idx,
    filter_layout,
    flat_divide,
    flat_product,
    flatten,
    idx2crd,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    product,
    raked_product,
    right_inverse,
    size,
    tiled_divide,
    tiled_product,
    zipped_divide,
    zipped_product,
)

pytestmark = pytest.mark.cpu

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

SIZES = [1, 1, 2, 2, 3, 4, 4, 6, 8]
MODE_SIZES = st.sampled_from(SIZES)
STRIDES = st.sampled_from([0, 0, 1, 1, 2, 3, 4, 6, 8, 12, 16, 24])


@st.composite
def _shapes(draw, budget: int, depth: int = 0, force_tuple: bool = False):
    """A nested shape of depth <= 2 whose size stays within ``budget``."""
    if not force_tuple and (depth == 2 or draw(st.integers(0, 2)) < depth + 1):
        return draw(st.sampled_from([s for s in SIZES if s <= budget]))
    modes = []
    for _ in range(draw(st.integers(1, 3))):
        mode = draw(_shapes(budget, depth + 1))
        modes.append(mode)
        budget //= product(mode)
    return tuple(modes)


shapes = _shapes(96)
tuple_shapes = _shapes(96, force_tuple=True)
small_shapes = _shapes(24)  # for products, which have size(A) * size(B) elements


def _draw_strides(draw, shape):
    if isinstance(shape, tuple):
        return tuple(_draw_strides(draw, s) for s in shape)
    return draw(STRIDES)


@st.composite
def layouts(draw, shape_strategy=shapes):
    shape = draw(shape_strategy)
    kind = draw(st.sampled_from(["left", "right", "random", "random"]))
    if kind == "left":
        return Layout(shape)
    if kind == "right":
        return Layout(shape, LayoutRight)
    return Layout(shape, _draw_strides(draw, shape))


def _primes(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def tilers_for(draw, layout: Layout):
    """An injective tiler that divides ``layout`` evenly in CuTe's sense.

    The prime factors of layout's flat shape, in order, form a compact
    column-major grid; the tiler picks some of its modes in any order, so its
    strides and shapes always line up with layout's mode sizes.
    """
    primes = [p for s in flatten(layout.shape) for p in _primes(s)]
    if not primes:
        return Layout(1, 0)
    strides = [product(tuple(primes[:i])) for i in range(len(primes))]
    chosen = draw(st.lists(st.sampled_from(range(len(primes))), unique=True, max_size=3))
    if not chosen:
        return Layout(1, 0)
    chosen = draw(st.permutations(chosen))
    if len(chosen) == 1:
        return Layout(primes[chosen[0]], strides[chosen[0]])
    return Layout(tuple(primes[i] for i in chosen), tuple(strides[i] for i in chosen))


def _values(layout) -> list:
    return [layout(i) for i in range(size(layout))]


def _injective(layout) -> bool:
    vals = _values(layout)
    return len(set(vals)) == len(vals)


def _complementable(layout: Layout) -> bool:
    """Sorted by stride, each non-zero mode starts where the previous ends, up
    to a multiple: then ``(layout, complement)`` tiles its cotarget exactly."""
    flat = filter_layout(layout)
    span = 1
    for d, s in sorted(zip(flatten(flat.stride), flatten(flat.shape))):
        if d == 0:
            continue
        if d % span != 0:
            return False
        span = d * s
    return True


def _span(layout: Layout) -> int:
    flat = filter_layout(layout)
    spans = [d * s for d, s in zip(flatten(flat.stride), flatten(flat.shape)) if d != 0]
    return max(spans, default=1)


# ---------------------------------------------------------------------------
# Coordinates
# ---------------------------------------------------------------------------


@SETTINGS
@given(shapes)
def test_idx2crd_crd2idx_round_trip(shape):
    for i in range(product(shape)):
        crd = idx2crd(i, shape)
        if isinstance(shape, tuple):
            assert congruent(crd, shape)
        assert crd2idx(crd, shape) == i


@SETTINGS
@given(layouts())
def test_int_index_is_colexicographic_coordinate(layout):
    for i in range(size(layout)):
        assert layout(i) == layout(idx2crd(i, layout.shape))


@SETTINGS
@given(shapes)
def test_compact_layouts_are_bijections(shape):
    n = product(shape)
    assert sorted(_values(Layout(shape))) == list(range(n))
    assert sorted(_values(Layout(shape, LayoutRight))) == list(range(n))
    assert Layout(shape).cosize() == n


# ---------------------------------------------------------------------------
# Coalesce and filter
# ---------------------------------------------------------------------------


@SETTINGS
@given(layouts())
def test_coalesce_preserves_function_and_size(layout):
    result = coalesce(layout)
    assert size(result) == size(layout)
    assert result.depth() <= 1
    assert _values(result) == _values(layout)
    assert coalesce(result) == result  # idempotent


@SETTINGS
@given(layouts(tuple_shapes))
def test_by_mode_coalesce_keeps_modes(layout):
    result = coalesce(layout, (1,) * layout.rank())
    assert result.rank() == layout.rank()
    for mode_r, mode_l in zip(result, layout):
        assert size(mode_r) == size(mode_l)
        assert _values(mode_r) == _values(mode_l)
    assert _values(result) == _values(layout)


@SETTINGS
@given(layouts())
def test_filter_keeps_image_and_drops_trivial_modes(layout):
    result = filter_layout(layout)
    assert set(_values(result)) == set(_values(layout))
    if result != Layout(1, 0):
        assert all(s != 1 for s in flatten(result.shape))
        assert all(d != 0 for d in flatten(result.stride))


# ---------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------


@SETTINGS
@given(layouts(), layouts())
def test_composition_is_function_composition(a, b):
    try:
        r = composition(a, b)
    except LayoutError:
        assume(False)
    assert size(r) == size(b)
    assert compatible(b.shape, r.shape)
    # CuTe's guarantee needs B injective apart from broadcast (stride-0) modes:
    # A is not additive, so overlapping modes of B cannot distribute.
    if _injective(filter_layout(b)):
        for i in range(size(b)):
            assert r(i) == a(b(i)), (a, b, r, i)


@SETTINGS
@given(layouts(tuple_shapes), st.data())
def test_by_mode_composition(a, data):
    k = data.draw(st.integers(1, a.rank()))
    tiler = tuple(data.draw(st.one_of(st.none(), MODE_SIZES, layouts())) for _ in range(k))
    try:
        r = composition(a, tiler)
    except LayoutError:
        assume(False)
    assert r.rank() == k  # modes of A the tiler does not name are dropped, as in CuTe
    for i, t in enumerate(tiler):
        assert r[i] == composition(a[i], t)


@SETTINGS
@given(layouts(), MODE_SIZES)
def test_composition_with_int_takes_leading_elements(a, n):
    try:
        r = composition(a, n)
    except LayoutError:
        assume(False)
    assert size(r) == n
    assert [r(i) for i in range(n)] == [a(i) for i in range(n)]


# ---------------------------------------------------------------------------
# Complement and inverses
# ---------------------------------------------------------------------------

COTARGETS = st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128])


@SETTINGS
@given(layouts(), COTARGETS)
def test_complement_is_disjoint_ordered_and_covers(a, m):
    try:
        c = complement(a, m)
    except LayoutError:
        assume(False)
    image_a = set(_values(a))
    values_c = _values(c)
    assert image_a & set(values_c) <= {0}  # disjoint codomains
    assert all(x < y for x, y in itertools.pairwise(values_c))  # ordered
    if _complementable(a):
        # CuTe's postcondition holds where each stride divides the next span; otherwise
        # C++ CuTe truncates the uneven quotient too, e.g. (2,2):(2,6) w.r.t. 12 gives 2:1.
        assert make_layout(a, c).cosize() >= m
    if _injective(a) and _complementable(a) and m % _span(a) == 0:
        together = make_layout(a, c)
        assert sorted(_values(together)) == list(range(m))  # a bijection onto [0, M)


@SETTINGS
@given(layouts())
def test_right_inverse(a):
    r = right_inverse(a)
    for i in range(size(r)):
        assert a(r(i)) == i
    if sorted(_values(a)) == list(range(size(a))):  # a bijection: R is a full inverse
        assert size(r) == size(a)
        for i in range(size(a)):
            assert r(a(i)) == i


@SETTINGS
@given(layouts())
def test_left_inverse(a):
    assume(_injective(a) and _complementable(a))
    inv = left_inverse(a)
    for i in range(size(a)):
        assert inv(a(i)) == i


# ---------------------------------------------------------------------------
# Divide
# ---------------------------------------------------------------------------


@SETTINGS
@given(layouts(), st.data())
def test_logical_divide_laws(a, data):
    b = data.draw(tilers_for(a))
    d = logical_divide(a, b)
    assert size(d) == size(a)
    assert d.rank() == 2
    assert d[0] == composition(a, b)  # mode 0 is the tile
    assert size(d[0]) == size(b)
    assert sorted(_values(d)) == sorted(_values(a))  # a permutation of A's elements

    z = zipped_divide(a, b)
    assert (z[0], z[1]) == (d[0], d[1])
    t = tiled_divide(a, b)
    assert t[0] == d[0] and size(t) == size(a)
    assert t.rank() == 1 + d[1].rank()
    f = flat_divide(a, b)
    assert size(f) == size(a)
    assert product(tuple(size(m) for m in list(f)[: d[0].rank()])) == size(b)


@SETTINGS
@given(layouts(tuple_shapes), st.data())
def test_by_mode_divide_laws(a, data):
    k = data.draw(st.integers(1, a.rank()))
    tiler = tuple(data.draw(tilers_for(a[i])) for i in range(k))
    tile_size = product(tuple(size(t) for t in tiler))

    d = logical_divide(a, tiler)
    assert d.rank() == a.rank()
    for i in range(a.rank()):
        assert size(d[i]) == size(a[i])
        if i < k:
            assert d[i] == logical_divide(a[i], tiler[i])
        else:
            assert d[i] == a[i]

    z = zipped_divide(a, tiler)
    assert z.rank() == 2
    assert size(z[0]) == tile_size
    assert size(z[1]) == size(a) // tile_size
    assert z[0] == composition(a, tiler)

    t = tiled_divide(a, tiler)
    assert t.rank() == 1 + a.rank()
    assert t[0] == z[0] and size(t) == size(a)

    f = flat_divide(a, tiler)
    assert f.rank() == k + a.rank()
    assert size(f) == size(a)
    assert product(tuple(size(f[i]) for i in range(k))) == tile_size


# ---------------------------------------------------------------------------
# Product
# ---------------------------------------------------------------------------


@SETTINGS
@given(layouts(small_shapes), layouts(small_shapes))
def test_logical_product_laws(a, b):
    try:
        p = logical_product(a, b)
    except LayoutError:
        assume(False)
    assert size(p) == size(a) * size(b)
    assert p[0] == a
    assert size(p[1]) == size(b)

    z = zipped_product(a, b)
    assert (size(z[0]), size(z[1])) == (size(a), size(b))
    t = tiled_product(a, b)
    assert t[0] == a and size(t) == size(a) * size(b)
    f = flat_product(a, b)
    assert size(f) == size(a) * size(b)


@SETTINGS
@given(layouts(small_shapes), layouts(small_shapes))
def test_blocked_and_raked_product_laws(a, b):
    try:
        blocked = blocked_product(a, b)
        raked = raked_product(a, b)
    except LayoutError:
        assume(False)
    r = max(a.rank(), b.rank())
    assert blocked.rank() == raked.rank() == r
    for i in range(r):
        size_a = size(a[i]) if i < a.rank() else 1
        size_b = size(b[i]) if i < b.rank() else 1
        assert size(blocked[i]) == size(raked[i]) == size_a * size_b
    # Both place the same copies of the block, in a different order.
    assert sorted(_values(blocked)) == sorted(_values(raked))
    assert sorted(_values(blocked)) == sorted(_values(logical_product(a, b)))


# ---------------------------------------------------------------------------
# Serialisation and value semantics
# ---------------------------------------------------------------------------


@SETTINGS
@given(layouts())
def test_repr_parse_json_round_trips(layout):
    assert Layout.parse(repr(layout)) == layout
    assert Layout.parse(str(layout)) == layout
    assert Layout.from_json(layout.to_json()) == layout
    assert Layout.from_json(json.dumps(layout.to_json())) == layout
    assert pickle.loads(pickle.dumps(layout)) == layout


@SETTINGS
@given(layouts())
def test_equal_layouts_hash_equal(layout):
    twin = Layout(layout.shape, layout.stride)
    assert twin == layout and hash(twin) == hash(layout)
    assert len({layout, twin}) == 1
