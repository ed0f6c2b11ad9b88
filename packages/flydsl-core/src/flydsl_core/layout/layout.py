"""CuTe layouts and their algebra.

A :class:`Layout` is a pair of congruent IntTuples ``shape:stride`` and is a
function from coordinates to integers: ``L(c) = sum(c_i * d_i)``. It is a
frozen, hashable value.

Conventions (identical to NVIDIA CuTe):

* The default stride is compact column-major (``LayoutLeft``): the leftmost
  mode is contiguous; size-1 modes get stride 0. ``LayoutRight`` gives
  compact row-major strides.
* Coordinates are colexicographic. ``L(i)`` for an int ``i`` splits ``i``
  across the modes with the leftmost varying fastest; the last mode absorbs
  any remainder, so ``L(i)`` is defined (by extension) past ``size(L)``.
* Notation: ``(4,8):(8,1)``; nested ``((2,2),8):((1,16),2)``; an int shape
  is a rank-1 layout ``8:1``, and a 1-tuple shape prints ``(8):(1)``.
* ``None`` plays the role of CuTe's ``_``: ``L(None, 3)`` is a slice and a
  ``None`` inside a tiler leaves that mode alone.

The algebra (coalesce, composition, complement, inverses, divides and
products) follows CuTe's C++ implementation, including its divisibility
conditions, which raise :class:`~flydsl_core.exc.LayoutError` here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..exc import LayoutError
from .int_tuple import (
    _fmt,
    _require_congruent,
    ceil_div,
    compact_col_major,
    compact_row_major,
    crd2crd,
    crd2idx,
    flatten,
    has_none,
    idx2crd,
    is_int,
    is_tuple,
    product,
    shape_div,
    shape_min,
    signum,
    slice_tuple,
)
from .int_tuple import depth as _tuple_depth
from .int_tuple import rank as _tuple_rank

__all__ = [
    "Layout",
    "LayoutLeft",
    "LayoutRight",
    "blocked_product",
    "coalesce",
    "complement",
    "composition",
    "cosize",
    "crd2crd",
    "crd2idx",
    "depth",
    "filter_layout",
    "filter_zeros",
    "flat_divide",
    "flat_product",
    "idx2crd",
    "is_layout",
    "left_inverse",
    "logical_divide",
    "logical_product",
    "make_layout",
    "make_layout_right",
    "raked_product",
    "rank",
    "right_inverse",
    "size",
    "slice_and_offset",
    "slice_layout",
    "tiled_divide",
    "tiled_product",
    "zipped_divide",
    "zipped_product",
]


class _MajorTag:
    """A stride tag: ``Layout(shape, LayoutRight)`` builds compact row-major strides."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self):
        return self._name  # pickles as the module-level singleton


LayoutLeft = _MajorTag("LayoutLeft")
LayoutRight = _MajorTag("LayoutRight")


def _to_int_tuple(x, what: str):
    """Validate an IntTuple, turning lists (from JSON) into tuples."""
    if isinstance(x, (tuple, list)):
        return tuple(_to_int_tuple(v, what) for v in x)
    if is_int(x):
        return x
    raise LayoutError(
        f"layout {what} must be an int or a nested tuple of ints; got {x!r} "
        f"of type {type(x).__name__}"
    )


def _check_positive(shape) -> None:
    for s in flatten(shape):
        if s < 1:
            raise LayoutError(
                f"layout shape {_fmt(shape)} has a mode of size {s}; every mode size must be >= 1"
            )


class Layout:
    """``shape:stride``, a function from (nested) coordinates to integers.

    ``Layout(8)`` is ``8:1``; ``Layout((4, 8))`` is ``(4,8):(1,4)``;
    ``Layout((4, 8), LayoutRight)`` is ``(4,8):(8,1)``.
    """

    __slots__ = ("shape", "stride")

    def __init__(self, shape, stride=None):
        shape = _to_int_tuple(shape, "shape")
        _check_positive(shape)
        if stride is None or stride is LayoutLeft:
            stride = compact_col_major(shape)
        elif stride is LayoutRight:
            stride = compact_row_major(shape)
        else:
            stride = _to_int_tuple(stride, "stride")
            _require_congruent(shape, stride, "Layout")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "stride", stride)

    @classmethod
    def _make(cls, shape, stride) -> Layout:
        """Trusted constructor for results of the algebra (no validation)."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "shape", shape)
        object.__setattr__(obj, "stride", stride)
        return obj

    # -- value semantics -----------------------------------------------------

    def __setattr__(self, name, value):
        raise AttributeError(f"Layout is immutable; cannot set {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"Layout is immutable; cannot delete {name!r}")

    def __eq__(self, other):
        if not isinstance(other, Layout):
            return NotImplemented
        return self.shape == other.shape and self.stride == other.stride

    def __hash__(self) -> int:
        return hash((Layout, self.shape, self.stride))

    def __reduce__(self):
        return (Layout._make, (self.shape, self.stride))

    def __repr__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"

    __str__ = __repr__

    # -- shape queries -------------------------------------------------------

    def size(self) -> int:
        """Size of the domain: the product of the shape."""
        return product(self.shape)

    def cosize(self) -> int:
        """Size of the codomain: ``1 + max L(c)``, measured with ``|stride|``."""
        abs_stride = _map_leaves(abs, self.stride)
        return crd2idx(self.size() - 1, self.shape, abs_stride) + 1

    def rank(self) -> int:
        return _tuple_rank(self.shape)

    def depth(self) -> int:
        return _tuple_depth(self.shape)

    def __len__(self) -> int:
        return self.rank()

    def __iter__(self):
        for i in range(self.rank()):
            yield self[i]

    def __getitem__(self, i):
        """Mode ``i`` as a Layout (a Python slice gives a concatenation of modes)."""
        if isinstance(i, slice):
            return make_layout(*list(self)[i])
        if not is_int(i):
            raise LayoutError(f"layout mode index must be an int; got {i!r}")
        if is_tuple(self.shape):
            n = len(self.shape)
            if not -n <= i < n:
                raise LayoutError(f"mode {i} is out of range for {self}, which has rank {n}")
            return Layout._make(self.shape[i], self.stride[i])
        if i not in (0, -1):
            raise LayoutError(f"mode {i} is out of range for the rank-1 layout {self}")
        return self

    # -- the function ----------------------------------------------------------

    def __call__(self, *crd):
        """``L(i)``, ``L(i, j)`` or ``L((i, (j, k)))`` map to an index; a ``None``
        anywhere in the coordinate makes this a slice and returns a Layout."""
        if not crd:
            raise LayoutError(f"{self} was called without a coordinate")
        coord = crd[0] if len(crd) == 1 else crd
        if has_none(coord):
            return slice_layout(coord, self)
        return crd2idx(coord, self.shape, self.stride)

    def compose(self, *tilers) -> Layout:
        """``self o tiler``; several tilers form a by-mode tiler."""
        return composition(self, tilers[0] if len(tilers) == 1 else tilers)

    def with_shape(self, shape) -> Layout:
        """Reinterpret the layout's first ``size(shape)`` elements with ``shape``."""
        return composition(self, Layout(shape))

    # -- serialisation ---------------------------------------------------------

    def to_json(self) -> dict:
        """``{"shape": ..., "stride": ...}`` with tuples as lists."""
        return {"shape": _to_lists(self.shape), "stride": _to_lists(self.stride)}

    @classmethod
    def from_json(cls, data) -> Layout:
        """Inverse of :meth:`to_json`; also accepts the JSON text."""
        if isinstance(data, str):
            data = json.loads(data)
        if not isinstance(data, dict) or set(data) != {"shape", "stride"}:
            raise LayoutError(
                f"Layout.from_json needs a mapping with exactly the keys 'shape' and "
                f"'stride'; got {data!r}"
            )
        return cls(data["shape"], data["stride"])

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Read CuTe notation, e.g. ``"(4,8):(8,1)"`` or ``"8:1"``; CuTe's static
        prefix ``_`` (``"(_4,_8):(_8,_1)"``) is accepted too."""
        if not isinstance(text, str):
            raise LayoutError(f"Layout.parse needs a string; got {type(text).__name__}")
        parser = _Parser(text)
        shape = parser.int_tuple()
        parser.expect(":")
        stride = parser.int_tuple()
        parser.end()
        return cls(shape, stride)


def _to_lists(t):
    return [_to_lists(v) for v in t] if is_tuple(t) else t


def _map_leaves(fn, t):
    return tuple(_map_leaves(fn, v) for v in t) if is_tuple(t) else fn(t)


class _Parser:
    """Recursive-descent reader for ``int_tuple := INT | '(' [int_tuple (',' int_tuple)*] ')'``."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def _fail(self, what: str):
        raise LayoutError(
            f"cannot parse layout {self.text!r}: {what} at position {self.pos}; "
            "expected CuTe notation such as '(4,8):(8,1)'"
        )

    def _skip(self):
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _peek(self) -> str:
        self._skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, ch: str):
        if self._peek() != ch:
            self._fail(f"expected {ch!r}")
        self.pos += 1

    def end(self):
        if self._peek():
            self._fail("unexpected trailing text")

    def int_tuple(self):
        if self._peek() == "(":
            self.pos += 1
            items = []
            if self._peek() == ")":
                self.pos += 1
                return ()
            while True:
                items.append(self.int_tuple())
                ch = self._peek()
                self.pos += 1
                if ch == ")":
                    return tuple(items)
                if ch != ",":
                    self.pos -= 1
                    self._fail("expected ',' or ')'")
        return self._int()

    def _int(self) -> int:
        self._skip()
        if self.text.startswith("_", self.pos):
            self.pos += 1  # CuTe prints static integers as _N
        start = self.pos
        if self.text.startswith("-", self.pos):
            self.pos += 1
        digits = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        if self.pos == digits:
            self._fail("expected an integer")
        return int(self.text[start : self.pos])


# ------------------------------------------------------------------------------
# Construction and queries
# ------------------------------------------------------------------------------


def is_layout(x) -> bool:
    return isinstance(x, Layout)


def make_layout(*layouts) -> Layout:
    """Concatenate layouts: each argument becomes one mode of the result.

    ``make_layout(A, B)`` is ``(A.shape, B.shape):(A.stride, B.stride)``;
    ``make_layout(A)`` wraps ``A`` as a rank-1 tuple layout and
    ``make_layout()`` is the rank-0 layout ``():()``. A single iterable of
    layouts is accepted as well.
    """
    if len(layouts) == 1 and isinstance(layouts[0], (tuple, list, Iterator)):
        layouts = tuple(layouts[0])  # a single sequence (or generator) of layouts
    for x in layouts:
        if not isinstance(x, Layout):
            raise LayoutError(
                f"make_layout concatenates Layouts; got {x!r}. Use Layout(shape, stride) "
                "to build a layout from a shape"
            )
    return Layout._make(tuple(x.shape for x in layouts), tuple(x.stride for x in layouts))


def make_layout_right(shape) -> Layout:
    """Compact row-major layout of ``shape`` (CuTe's ``LayoutRight``)."""
    return Layout(shape, LayoutRight)


def _as_layout(x, where: str) -> Layout:
    if isinstance(x, Layout):
        return x
    if is_int(x) or is_tuple(x):
        return Layout(x)
    raise LayoutError(f"{where}: expected a Layout or a shape; got {x!r}")


def size(x) -> int:
    """Size of a Layout (or anything with ``size()``) or product of an IntTuple."""
    if hasattr(x, "size") and callable(x.size):
        return x.size()
    return product(x)


def cosize(x) -> int:
    return x.cosize()


def rank(x) -> int:
    if hasattr(x, "rank") and callable(x.rank):
        return x.rank()
    return _tuple_rank(x)


def depth(x) -> int:
    if hasattr(x, "depth") and callable(x.depth):
        return x.depth()
    return _tuple_depth(x)


def _modes(layout: Layout) -> list:
    return [layout[i] for i in range(layout.rank())]


def _by_mode(fn, layout: Layout, profile, name: str) -> Layout:
    """Apply ``fn(mode_i, profile_i)`` to the leading modes; keep the rest as is."""
    if len(profile) > layout.rank():
        raise LayoutError(
            f"{name}: the profile/tiler {_fmt_tiler(profile)} has {len(profile)} modes but "
            f"{layout} has rank {layout.rank()}; it may have at most rank(layout) modes"
        )
    modes = _modes(layout)
    head = [fn(modes[i], profile[i]) for i in range(len(profile))]
    return make_layout(*head, *modes[len(profile) :])


def _fmt_tiler(t) -> str:
    if is_tuple(t):
        return "<" + ",".join(_fmt_tiler(v) for v in t) + ">"
    return "_" if t is None else str(t)


# ------------------------------------------------------------------------------
# Coalesce and filter
# ------------------------------------------------------------------------------


def _bw_coalesce(shapes, strides, new_shape, new_stride) -> Layout:
    """Fold modes right to left onto the front of (new_shape, new_stride).

    For each mode ``s:d`` against the current front mode ``S:D``:
    size-1 modes are dropped; a front ``1`` is replaced; ``s*d == D`` merges
    into ``s*S:d``; anything else is prepended. One mode left gives an int
    layout, and a lone size-1 mode is normalised to ``1:0``.
    """
    acc_shape, acc_stride = [new_shape], [new_stride]  # reversed: acc[-1] is the front
    for s, d in zip(reversed(shapes), reversed(strides)):
        if s == 1:
            continue
        if len(acc_shape) == 1 and acc_shape[0] == 1:
            acc_shape[0], acc_stride[0] = s, d
        elif s * d == acc_stride[-1]:
            acc_shape[-1] *= s
            acc_stride[-1] = d
        else:
            acc_shape.append(s)
            acc_stride.append(d)
    if len(acc_shape) == 1:
        return (
            Layout._make(1, 0) if acc_shape[0] == 1 else Layout._make(acc_shape[0], acc_stride[0])
        )
    return Layout._make(tuple(reversed(acc_shape)), tuple(reversed(acc_stride)))


def coalesce(layout: Layout, profile=None) -> Layout:
    """Simplify ``layout`` to as few flat modes as possible, keeping the same
    function on ``[0, size)`` and the same size.

    With a tuple ``profile`` coalescing is applied by mode: ``profile[i]``
    (an int flag or a nested profile) says how to coalesce mode ``i``, and
    modes past the profile are kept as they are.
    """
    layout = _as_layout(layout, "coalesce")
    if is_tuple(profile):
        return _by_mode(coalesce, layout, profile, "coalesce")
    flat_shape, flat_stride = flatten(layout.shape), flatten(layout.stride)
    if not flat_shape:
        return Layout._make(1, 0)  # the rank-0 layout is the constant 0 on one element
    return _bw_coalesce(flat_shape[:-1], flat_stride[:-1], flat_shape[-1], flat_stride[-1])


def _coalesce_x(layout: Layout) -> Layout:
    """Coalesce that also preserves the function *past* the domain (CuTe's
    ``coalesce_x``): a trailing size-1 mode is kept as a placeholder of size 2
    so its stride still governs the extension, as composition needs."""
    flat_shape, flat_stride = flatten(layout.shape), flatten(layout.stride)
    if not flat_shape:
        return Layout._make(2, 0)  # rank 0: every index maps to 0
    last = flat_shape[-1] if flat_shape[-1] != 1 else 2
    return _bw_coalesce(flat_shape[:-1], flat_stride[:-1], last, flat_stride[-1])


def filter_zeros(layout: Layout) -> Layout:
    """Replace the shape of every stride-0 mode by 1 (structure is kept)."""

    def go(s, d):
        if is_tuple(s):
            return tuple(go(x, y) for x, y in zip(s, d))
        return 1 if d == 0 else s

    return Layout._make(go(layout.shape, layout.stride), layout.stride)


def filter_layout(layout: Layout, profile=None) -> Layout:
    """Remove stride-0 and size-1 modes, then coalesce (CuTe's ``filter``).

    The result is ``1:0`` when nothing is left. A tuple ``profile`` applies
    the filter by mode, as in :func:`coalesce`.
    """
    layout = _as_layout(layout, "filter_layout")
    if is_tuple(profile):
        return _by_mode(filter_layout, layout, profile, "filter_layout")
    return coalesce(filter_zeros(layout))


# ------------------------------------------------------------------------------
# Composition
# ------------------------------------------------------------------------------


def composition(layout_a, layout_b):
    """``A o B``: the layout ``R`` with ``R(c) == A(B(c))`` for ``c`` in B's domain.

    ``layout_b`` may be a Layout, an int ``n`` (meaning ``n:1``), ``None``
    (leave ``A`` as is) or a by-mode tiler: a tuple whose ``i``-th entry is
    composed with mode ``i`` of ``A``. As in CuTe, modes of ``A`` not named by
    a by-mode tiler are dropped from the result.

    Requires the stride and shape divisibility conditions of CuTe: dividing
    ``A``'s (coalesced) shape by B's stride, then by B's shape, must go evenly
    mode by mode; otherwise :class:`LayoutError` is raised.
    """
    if not isinstance(layout_a, Layout):
        compose = getattr(layout_a, "compose", None)
        if callable(compose):
            return compose(layout_b)  # e.g. a ComposedLayout or a Swizzle
        raise LayoutError(f"composition: the left operand must be a Layout; got {layout_a!r}")
    if layout_b is None:
        return layout_a
    if is_int(layout_b):
        layout_b = Layout(layout_b, 1)
    if is_tuple(layout_b):
        if len(layout_b) > layout_a.rank():
            raise LayoutError(
                f"composition: the tiler {_fmt_tiler(layout_b)} has {len(layout_b)} modes "
                f"but {layout_a} has rank {layout_a.rank()}; a by-mode tiler may have at "
                "most rank(layout) modes"
            )
        return make_layout(*(composition(layout_a[i], b) for i, b in enumerate(layout_b)))
    if not isinstance(layout_b, Layout):
        raise LayoutError(
            f"composition: the right operand must be a Layout, an int, None or a tuple of "
            f"those; got {layout_b!r}"
        )
    flat_a = _coalesce_x(layout_a)
    try:
        return _compose(flat_a.shape, flat_a.stride, layout_b.shape, layout_b.stride)
    except LayoutError as err:
        raise LayoutError(
            f"composition {layout_a} o {layout_b} is not defined: {err.msg}. The "
            "divisibility conditions require B's strides and shapes to divide "
            "A's (coalesced) mode sizes evenly, or be divisible by them"
        ) from None


def _compose(a_shape, a_stride, b_shape, b_stride) -> Layout:
    """Compose a flat coalesced ``A`` with ``B``, recursing on B's modes."""
    if is_tuple(b_shape):
        # Right-distributivity: A o (B0, B1, ...) == (A o B0, A o B1, ...)
        return make_layout(*(_compose(a_shape, a_stride, s, d) for s, d in zip(b_shape, b_stride)))
    if b_stride == 0:
        return Layout._make(b_shape, 0)  # B is constant; so is A o B
    if not is_tuple(a_shape):
        return Layout._make(b_shape, b_stride * a_stride)  # A is one mode: strides multiply
    # Divide B's stride out of A's leading modes (stride divisibility condition).
    shapes_1 = []
    rest_stride = b_stride
    for s in a_shape[:-1]:
        shapes_1.append(shape_div(s, rest_stride))
        rest_stride = shape_div(rest_stride, s)
    # Mode sizes that shrank scale their strides: every k-th element of s:d is s/k:k*d.
    strides_1 = [d * shape_div(s, s1) for s, d, s1 in zip(a_shape, a_stride, shapes_1)]
    # Keep only B's shape worth of elements (shape divisibility condition).
    shapes_2 = []
    rest_shape = b_shape
    for s1 in shapes_1:
        shapes_2.append(shape_min(abs(s1), rest_shape))
        rest_shape = shape_div(rest_shape, abs(s1))
    return _bw_coalesce(shapes_2, strides_1, rest_shape, rest_stride * a_stride[-1])


# ------------------------------------------------------------------------------
# Complement and inverses
# ------------------------------------------------------------------------------


def complement(layout: Layout, cotarget=None) -> Layout:
    """The layout of "the rest": ``R`` such that ``(layout, R)`` covers
    ``[0, cotarget)`` without hitting layout's image again.

    ``R`` is ordered (positive, increasing strides), its image meets
    layout's only at 0, and ``cosize((layout, R)) >= size(cotarget)``.
    ``cotarget`` is an int or a shape and defaults to ``cosize(layout)``.
    Requires the (filtered) layout's modes, sorted by stride, not to
    overlap: each stride must be at least the previous mode's
    ``shape * stride``; otherwise the layout is not injective in the way
    complement needs and :class:`LayoutError` is raised.
    """
    layout = _as_layout(layout, "complement")
    filtered = filter_layout(layout)
    if cotarget is None:
        cotarget = filtered.cosize()
    elif isinstance(cotarget, Layout):
        cotarget = cotarget.shape
    flat_shape, flat_stride = flatten(filtered.shape), flatten(filtered.stride)
    if flat_stride == (0,):
        # Nothing but a constant: the rest is all of [0, cotarget).
        return Layout(product(cotarget))
    if any(d < 0 for d in flat_stride):
        raise LayoutError(
            f"complement of {layout} is not defined: it has negative strides; "
            "complement needs non-negative strides"
        )
    result_shape, result_stride = [], []
    current = 1  # the codomain span covered so far
    for d, s in sorted(zip(flat_stride, flat_shape)):
        gap = d // current
        if gap == 0:
            raise LayoutError(
                f"complement of {layout} is not defined: its mode {s}:{d} overlaps the modes "
                f"of smaller stride (which already span {current}); the layout must be "
                "injective, with each stride (in sorted order) at least the previous "
                "mode's shape*stride"
            )
        result_shape.append(gap)
        result_stride.append(current)
        current = d * s
    rest = product(ceil_div(cotarget, current))
    result_shape.append(rest)
    result_stride.append(current if rest != 1 else 0)
    return coalesce(Layout._make(tuple(result_shape), tuple(result_stride)))


def right_inverse(layout) -> Layout:
    """``R`` with ``layout(R(i)) == i`` for all ``i < size(R)``, as large as
    possible: it follows the chain of strides 1, s0, s0*s1, ... through the
    coalesced layout."""
    if layout is None:
        return None
    layout = _as_layout(layout, "right_inverse")
    flat = coalesce(layout)
    shapes, strides = flatten(flat.shape), flatten(flat.stride)
    rstride = flatten(compact_col_major(flat.shape))
    chain = []
    want = 1
    while True:
        # The first mode whose |stride| is the next index continues the chain.
        nxt = next((i for i, d in enumerate(strides) if abs(d) == want), None)
        if nxt is None:
            break
        chain.append(nxt)
        step = shapes[nxt] * abs(strides[nxt])
        if step == want:
            break  # a size-1 mode cannot extend the chain
        want = step
    if not chain:
        return Layout._make(1, 0)
    out_shape = tuple(shapes[i] for i in chain)
    out_stride = tuple(signum(strides[i]) * rstride[i] for i in chain)
    if len(chain) == 1:
        return Layout._make(out_shape[0], out_stride[0])
    return Layout._make(out_shape, out_stride)


def left_inverse(layout) -> Layout:
    """``L`` with ``L(layout(i)) == i`` for all ``i < size(layout)`` (layout injective
    and complementable)."""
    if layout is None:
        return None
    layout = _as_layout(layout, "left_inverse")
    return right_inverse(make_layout(layout, complement(layout)))


# ------------------------------------------------------------------------------
# Slicing
# ------------------------------------------------------------------------------


def slice_layout(crd, layout: Layout) -> Layout:
    """The sub-layout of the modes where ``crd`` has ``None``."""
    return Layout._make(slice_tuple(crd, layout.shape), slice_tuple(crd, layout.stride))


def slice_and_offset(crd, layout: Layout):
    """``(slice_layout(crd, layout), layout(crd with None as 0))``."""
    return slice_layout(crd, layout), crd2idx(crd, layout.shape, layout.stride)


# ------------------------------------------------------------------------------
# Divide
# ------------------------------------------------------------------------------


def logical_divide(layout: Layout, tiler) -> Layout:
    """``A / B = A o (B, complement(B, shape(A)))``: mode 0 is the tile ``B``,
    mode 1 iterates over the tiles. A tuple tiler divides mode by mode and
    keeps the modes of ``A`` it does not name."""
    layout = _as_layout(layout, "logical_divide")
    if tiler is None:
        return layout
    if is_int(tiler):
        tiler = Layout(tiler, 1)
    if is_tuple(tiler):
        return _by_mode(logical_divide, layout, tiler, "logical_divide")
    if not isinstance(tiler, Layout):
        raise LayoutError(
            f"logical_divide: the tiler must be a Layout, int, None or tuple; got {tiler!r}"
        )
    return composition(layout, make_layout(tiler, complement(tiler, layout.shape)))


def _unzip(layout: Layout, guide) -> Layout:
    """Gather the rank-2 (tile, rest) modes at the leaves of ``guide`` into
    ``((tiles...), (rests..., untouched modes...))`` (CuTe's ``zip2_by``)."""
    if is_tuple(guide):
        modes = _modes(layout)
        parts = [_unzip(modes[i], g) for i, g in enumerate(guide)]
        first = make_layout(*(p[0] for p in parts))
        second = make_layout(*(p[1] for p in parts), *modes[len(guide) :])
        return make_layout(first, second)
    if guide is None:
        return make_layout(Layout._make(1, 0), layout)  # untouched: a trivial tile
    return layout  # already (tile, rest)


def zipped_divide(layout: Layout, tiler) -> Layout:
    """``((TileM,TileN,...), (RestM,RestN,...,L,...))``."""
    layout = _as_layout(layout, "zipped_divide")
    return _unzip(logical_divide(layout, tiler), tiler)


def tiled_divide(layout: Layout, tiler) -> Layout:
    """``((TileM,TileN,...), RestM, RestN, ..., L, ...)``."""
    result = zipped_divide(layout, tiler)
    return make_layout(result[0], *_modes(result[1]))


def flat_divide(layout: Layout, tiler) -> Layout:
    """``(TileM, TileN, ..., RestM, RestN, ..., L, ...)``."""
    result = zipped_divide(layout, tiler)
    return make_layout(*_modes(result[0]), *_modes(result[1]))


# ------------------------------------------------------------------------------
# Product
# ------------------------------------------------------------------------------


def logical_product(block: Layout, tiler) -> Layout:
    """``A * B = (A, complement(A, size(A)*cosize(B)) o B)``: mode 0 is ``A``, mode 1
    places a copy of ``A`` at each element of ``B``. A tuple tiler works by mode."""
    block = _as_layout(block, "logical_product")
    if tiler is None:
        return block
    if is_int(tiler):
        tiler = Layout(tiler, 1)
    if is_tuple(tiler):
        return _by_mode(logical_product, block, tiler, "logical_product")
    if not isinstance(tiler, Layout):
        raise LayoutError(
            f"logical_product: the tiler must be a Layout, int, None or tuple; got {tiler!r}"
        )
    rest = complement(block, block.size() * tiler.cosize())
    return make_layout(block, composition(rest, tiler))


def zipped_product(block: Layout, tiler) -> Layout:
    """``((M,N,...), (TileM,TileN,...,L,...))``."""
    block = _as_layout(block, "zipped_product")
    return _unzip(logical_product(block, tiler), tiler)


def tiled_product(block: Layout, tiler) -> Layout:
    """``((M,N,...), TileM, TileN, ..., L, ...)``."""
    result = zipped_product(block, tiler)
    return make_layout(result[0], *_modes(result[1]))


def flat_product(block: Layout, tiler) -> Layout:
    """``(M, N, ..., TileM, TileN, ..., L, ...)``."""
    result = zipped_product(block, tiler)
    return make_layout(*_modes(result[0]), *_modes(result[1]))


def _padded_modes(layout: Layout, r: int) -> list:
    """The modes of ``layout`` padded with ``1:0`` to rank ``r`` (CuTe's ``append<R>``)."""
    return _modes(layout) + [Layout._make(1, 0)] * (r - layout.rank())


def _rank_sensitive_product(block, tiler, name: str, block_first: bool) -> Layout:
    block, tiler = _as_layout(block, name), _as_layout(tiler, name)
    r = max(block.rank(), tiler.rank())
    a = make_layout(*_padded_modes(block, r)) if r > 1 else block
    b = make_layout(*_padded_modes(tiler, r)) if r > 1 else tiler
    product_ab = logical_product(a, b)
    # Pair like modes of the block and the tile arrangement, then coalesce each.
    # At rank 1 the whole block pairs with the whole arrangement.
    if r > 1:
        pairs = zip(_modes(product_ab[0]), _modes(product_ab[1]))
    else:
        pairs = [(product_ab[0], product_ab[1])]
    modes = [make_layout(x, y) if block_first else make_layout(y, x) for x, y in pairs]
    return make_layout(*(coalesce(m) for m in modes))


def blocked_product(block: Layout, tiler: Layout) -> Layout:
    """Tile ``block`` over ``tiler`` keeping each copy of the block contiguous in
    each mode: mode ``i`` of the result is ``(block_i, tiler_i)`` (coalesced).
    The result has rank ``max(rank(block), rank(tiler))``."""
    return _rank_sensitive_product(block, tiler, "blocked_product", block_first=True)


def raked_product(block: Layout, tiler: Layout) -> Layout:
    """Like :func:`blocked_product` but interleaved: mode ``i`` is
    ``(tiler_i, block_i)``, so copies of the block are raked across each mode."""
    return _rank_sensitive_product(block, tiler, "raked_product", block_first=False)
