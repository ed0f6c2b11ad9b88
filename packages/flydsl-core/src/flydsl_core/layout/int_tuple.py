"""Nested integer tuples ("IntTuples"), the raw material of CuTe layouts.

An IntTuple is a Python ``int`` or a (possibly empty) ``tuple`` of IntTuples,
e.g. ``8``, ``(4, 8)`` or ``((2, 2), 8)``. Shapes, strides and coordinates are
all IntTuples.

Conventions (the same as NVIDIA CuTe):

* Coordinates are colexicographic: the leftmost mode varies fastest. A 1-D
  index ``i`` into shape ``(s0, s1, s2)`` is the coordinate
  ``(i % s0, (i // s0) % s1, i // (s0 * s1))``.
* The default stride of a shape is compact column-major (``LayoutLeft``):
  the exclusive prefix product of the shape, except that a size-1 mode gets
  stride 0, as CuTe does for static shapes.
* ``rank`` of an int is 1, ``depth`` of an int is 0.

Shapes and strides are always static Python ints. Coordinates and indices
passed to :func:`crd2idx`, :func:`idx2crd` and :func:`crd2crd` may also be
symbolic integers (traced values that implement ``+ * // %``); these
functions never call ``int()``, never compare them and never test their
type beyond "is it a tuple / is it None".
"""

from __future__ import annotations

from ..exc import LayoutError

__all__ = [
    "ceil_div",
    "compact_col_major",
    "compact_row_major",
    "compatible",
    "congruent",
    "crd2crd",
    "crd2idx",
    "depth",
    "elem_scale",
    "flatten",
    "has_none",
    "idx2crd",
    "inner_product",
    "is_int",
    "is_int_tuple",
    "is_tuple",
    "prefix_product",
    "product",
    "rank",
    "shape_div",
    "shape_min",
    "signum",
    "slice_tuple",
    "tuple_max",
    "weakly_congruent",
]


# --------------------------------------------------------------------------
# Predicates and structure
# --------------------------------------------------------------------------


def is_int(x) -> bool:
    """True for a Python int (bool excluded: ``True`` is not a shape)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_tuple(x) -> bool:
    return isinstance(x, tuple)


def is_int_tuple(x) -> bool:
    """True if ``x`` is an int or a nested tuple whose leaves are all ints."""
    if is_tuple(x):
        return all(is_int_tuple(v) for v in x)
    return is_int(x)


def has_none(x) -> bool:
    """True if ``None`` (CuTe's ``_`` slice marker) appears at any leaf."""
    if is_tuple(x):
        return any(has_none(v) for v in x)
    return x is None


def flatten(t) -> tuple:
    """All leaves of ``t``, left to right; an int becomes a 1-tuple."""
    if is_tuple(t):
        return tuple(leaf for v in t for leaf in flatten(v))
    return (t,)


def rank(t) -> int:
    """Number of top-level modes; an int has rank 1."""
    return len(t) if is_tuple(t) else 1


def depth(t) -> int:
    """Nesting depth: 0 for an int, 1 + max depth of the elements for a tuple."""
    if is_tuple(t):
        # The empty tuple is still a tuple: depth 1.
        return 1 + max((depth(v) for v in t), default=0)
    return 0


def congruent(a, b) -> bool:
    """True if ``a`` and ``b`` have the same nested tuple profile."""
    if is_tuple(a) and is_tuple(b):
        return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))
    return not is_tuple(a) and not is_tuple(b)


def weakly_congruent(a, b) -> bool:
    """True if ``b``'s profile refines ``a``'s (an int in ``a`` matches anything)."""
    if is_tuple(a) and is_tuple(b):
        return len(a) == len(b) and all(weakly_congruent(x, y) for x, y in zip(a, b))
    return not is_tuple(a)  # an int in a matches any sub-profile of b


def compatible(a, b) -> bool:
    """True if every coordinate of shape ``a`` is also a coordinate of shape ``b``:
    the sizes agree at every leaf of ``a``."""
    if is_tuple(a) and is_tuple(b):
        return len(a) == len(b) and all(compatible(x, y) for x, y in zip(a, b))
    if is_tuple(a):
        return False
    return a == product(b)


# --------------------------------------------------------------------------
# Arithmetic on static IntTuples
# --------------------------------------------------------------------------


def signum(a: int) -> int:
    return (a > 0) - (a < 0)


def product(a):
    """Product of all leaves; the empty tuple has product 1."""
    if is_tuple(a):
        result = 1
        for v in a:
            result *= product(v)
        return result
    return a


def tuple_max(a):
    """Largest leaf."""
    if is_tuple(a):
        return max(tuple_max(v) for v in a)
    return a


def inner_product(a, b):
    """Sum of leafwise products of two congruent IntTuples."""
    if is_tuple(a) and is_tuple(b):
        if len(a) != len(b):
            raise LayoutError(
                f"inner_product of {a} and {b}: the tuples have ranks {len(a)} and "
                f"{len(b)}; they must be congruent"
            )
        return sum(inner_product(x, y) for x, y in zip(a, b))
    if is_tuple(a) or is_tuple(b):
        raise LayoutError(f"inner_product of {a} and {b}: an int cannot pair with a tuple")
    return a * b


def elem_scale(a, b):
    """Scale each leaf of ``a`` by the product of the matching mode of ``b``."""
    if is_tuple(a):
        if not is_tuple(b) or len(a) != len(b):
            raise LayoutError(
                f"elem_scale of {a} by {b}: a tuple must be scaled by a tuple of the same rank"
            )
        return tuple(elem_scale(x, y) for x, y in zip(a, b))
    return a * product(b)


def prefix_product(a, init=1):
    """Exclusive prefix product, congruent to ``a``.

    ``prefix_product((2, (3, 4), 5)) == (1, (2, 6), 24)``. A tuple ``init``
    applies one starting value per mode.
    """
    if is_tuple(a):
        if is_tuple(init):
            if len(init) != len(a):
                raise LayoutError(
                    f"prefix_product of {a} with init {init}: ranks {len(a)} and "
                    f"{len(init)} differ; they must be equal"
                )
            return tuple(prefix_product(x, i) for x, i in zip(a, init))
        result = []
        for v in a:
            result.append(prefix_product(v, init))
            init = init * product(v)
        return tuple(result)
    if is_tuple(init):
        raise LayoutError(f"prefix_product of int {a} with tuple init {init} is undefined")
    return init


def _compact(shape, current: int, right: bool):
    """Compact strides for ``shape`` starting at ``current``; returns (strides, next).

    Size-1 modes get stride 0 (CuTe does this for static shapes); their
    coordinate is always 0, so the stride is irrelevant inside the domain.
    """
    if is_tuple(shape):
        strides = [None] * len(shape)
        order = reversed(range(len(shape))) if right else range(len(shape))
        for i in order:
            strides[i], current = _compact(shape[i], current, right)
        return tuple(strides), current
    if shape == 1:
        return 0, current
    return current, current * shape


def compact_col_major(shape, current: int = 1):
    """LayoutLeft strides: the leftmost mode is contiguous."""
    return _compact(shape, current, right=False)[0]


def compact_row_major(shape, current: int = 1):
    """LayoutRight strides: the rightmost mode is contiguous."""
    return _compact(shape, current, right=True)[0]


def _div_away_from_zero(a: int, b: int) -> int:
    """C-style ``a / b`` (truncating), but 0 becomes ±1 (rounded away from zero)."""
    q = abs(a) // abs(b)
    sign = signum(a) * signum(b)
    return sign * q if q != 0 else sign


def shape_div(a, b):
    """CuTe's ``shape_div``: divide shape ``a`` by ``b``, folding left to right.

    * tuple / tuple: elementwise.
    * tuple / int: ``b`` is divided out of the modes from the left, e.g.
      ``shape_div((4, 5, 6), 40) == (1, 1, 3)``.
    * int / tuple: divide by ``product(b)``.
    * int / int: requires ``a % b == 0 or b % a == 0`` (the divisibility
      condition); the result is ``a / b`` rounded away from zero, so
      ``shape_div(2, 8) == 1``.
    """
    if is_tuple(a):
        if is_tuple(b):
            if len(a) != len(b):
                raise LayoutError(
                    f"shape_div of {a} by {b}: ranks {len(a)} and {len(b)} differ; "
                    "a tuple can only be divided by a tuple of the same rank"
                )
            return tuple(shape_div(x, y) for x, y in zip(a, b))
        result = []
        for v in a:
            result.append(shape_div(v, b))
            b = shape_div(b, v)
        return tuple(result)
    if is_tuple(b):
        return shape_div(a, product(b))
    if b == 0 or (a % b != 0 and b % a != 0):
        raise LayoutError(
            f"shape_div({a}, {b}) violates the divisibility condition: "
            f"one of {a} and {b} must divide the other"
        )
    return _div_away_from_zero(a, b)


def ceil_div(a, b):
    """Ceiling division, CuTe style: tuple / int folds ``b`` across the modes
    (``ceil_div((4, 3), 3) == (2, 3)``: 3 is absorbed by the first mode)."""
    if is_tuple(a):
        if is_tuple(b):
            if len(b) > len(a):
                raise LayoutError(f"ceil_div of {a} by {b}: the divisor has more modes")
            b = b + (1,) * (len(a) - len(b))  # missing modes of b divide by 1
            return tuple(ceil_div(x, y) for x, y in zip(a, b))
        result = []
        for v in a:
            result.append(ceil_div(v, b))
            b = ceil_div(b, v)
        return tuple(result)
    if is_tuple(b):
        return ceil_div(a, product(b))
    if b == 0:
        raise LayoutError(f"ceil_div({a}, 0): the divisor must be non-zero")
    return -((-a) // b)


def shape_min(a: int, b: int) -> int:
    """Minimum of two int shapes (CuTe's ``shape_min``)."""
    if is_tuple(a) or is_tuple(b):
        raise LayoutError(f"shape_min({a}, {b}) is defined for ints only")
    return min(a, b)


# --------------------------------------------------------------------------
# Coordinate <-> index maps (symbolic-safe)
# --------------------------------------------------------------------------
#
# These helpers fold away operations whose static operand makes them trivial.
# They only ever inspect the *static* operand (a shape or stride), or a
# coordinate after checking it is a plain Python int, so symbolic values pass
# straight through to their own + * // % operators.


def _add(a, b):
    if is_int(a) and a == 0:
        return b
    if is_int(b) and b == 0:
        return a
    if is_int(a) and not is_int(b):
        return b + a  # keep the symbolic operand on the left
    return a + b


def _mul(c, d: int):
    if d == 0:
        return 0
    if d == 1:
        return c
    return c * d


def _mod(c, n: int):
    return 0 if n == 1 else c % n


def _floordiv(c, n: int):
    return c if n == 1 else c // n


# Containers and floats are never coordinates; rejecting them by type leaves
# every other (possibly symbolic) value alone.
_NOT_COORDINATES = (list, dict, set, str, bytes, float)


def _check_scalar(x, where: str) -> None:
    if isinstance(x, _NOT_COORDINATES):
        raise LayoutError(
            f"{where}: {x!r} of type {type(x).__name__} is not a coordinate; use an int "
            "(or a traced integer) or a tuple of those"
        )


def _require_congruent(shape, stride, where: str) -> None:
    if not congruent(shape, stride):
        raise LayoutError(
            f"{where}: shape {_fmt(shape)} and stride {_fmt(stride)} are not congruent; "
            "the stride must have exactly the nested tuple structure of the shape"
        )


def _fmt(t) -> str:
    if is_tuple(t):
        return "(" + ",".join(_fmt(v) for v in t) + ")"
    return str(t)


def crd2idx(crd, shape, stride=None):
    """Map a coordinate to an index: ``sum(c_i * d_i)``.

    ``crd`` may be congruent to ``shape`` (a natural coordinate), or an int
    (or symbolic) 1-D index at any level, which is split colexicographically
    across that level's modes; the last mode takes the remainder without a
    modulo, so indices past the end extend the last mode as in CuTe.
    ``None`` in ``crd`` counts as 0 (the offset of a slice). ``stride``
    defaults to compact column-major.
    """
    if stride is None:
        stride = compact_col_major(shape)
    else:
        _require_congruent(shape, stride, "crd2idx")
    return _crd2idx(crd, shape, stride)


def _crd2idx(crd, shape, stride):
    if is_tuple(crd):
        if not is_tuple(shape):
            raise LayoutError(
                f"coordinate {_fmt(crd)} is a tuple but the shape {shape} is an int; "
                "a tuple coordinate needs a tuple shape of the same rank"
            )
        if len(crd) != len(shape):
            raise LayoutError(
                f"coordinate {_fmt(crd)} has rank {len(crd)} but shape {_fmt(shape)} has "
                f"rank {len(shape)}; they must match"
            )
        result = 0
        for c, s, d in zip(crd, shape, stride):
            result = _add(result, _crd2idx(c, s, d))
        return result
    if crd is None:
        return 0
    _check_scalar(crd, "crd2idx")
    if is_tuple(shape):
        # Split a 1-D index across the modes: mod by each mode's size, carry the
        # quotient; the last mode keeps the whole remainder.
        result = 0
        last = len(shape) - 1
        for i, (s, d) in enumerate(zip(shape, stride)):
            if i == last:
                return _add(result, _crd2idx(crd, s, d))
            n = product(s)
            result = _add(result, _crd2idx(_mod(crd, n), s, d))
            crd = _floordiv(crd, n)
        return result  # rank-0 shape: the only index is 0
    return _mul(crd, stride)


def idx2crd(idx, shape, stride=None):
    """Split a 1-D index into a coordinate of ``shape`` (colexicographic).

    With a tuple shape every leaf gets ``(idx // d) % s`` with compact
    column-major ``d`` (or the given compact ``stride``). With an int shape
    and no stride the index is already the coordinate and is returned
    unchanged, as in CuTe. A tuple ``idx`` is split mode by mode.
    """
    if is_tuple(idx):
        if not is_tuple(shape) or len(idx) != len(shape):
            raise LayoutError(
                f"idx2crd: index {_fmt(idx)} and shape {_fmt(shape)} do not have the same rank"
            )
        if stride is None:
            return tuple(idx2crd(i, s) for i, s in zip(idx, shape))
        _require_congruent(shape, stride, "idx2crd")
        return tuple(idx2crd(i, s, d) for i, s, d in zip(idx, shape, stride))
    _check_scalar(idx, "idx2crd")
    if is_tuple(shape):
        if stride is None or is_int(stride):
            stride = compact_col_major(shape, 1 if stride is None else stride)
        else:
            _require_congruent(shape, stride, "idx2crd")
        return tuple(_idx2crd_leafwise(idx, s, d) for s, d in zip(shape, stride))
    if stride is None:
        return idx
    return _idx2crd_leafwise(idx, shape, stride)


def _idx2crd_leafwise(idx, shape, stride):
    if is_tuple(shape):
        return tuple(_idx2crd_leafwise(idx, s, d) for s, d in zip(shape, stride))
    if shape == 1:
        return 0  # a size-1 mode's coordinate is 0; also avoids dividing by stride 0
    if stride == 0:
        raise LayoutError(
            f"idx2crd: mode of size {shape} has stride 0; idx2crd needs compact "
            "(non-zero) strides to recover a coordinate"
        )
    return _mod(_floordiv(idx, stride), shape)


def crd2crd(crd, src_shape, dst_shape):
    """Re-express a coordinate of ``src_shape`` as a coordinate of ``dst_shape``
    (same size), mode by mode where both are tuples of the coordinate's rank."""
    if (
        is_tuple(crd)
        and is_tuple(src_shape)
        and is_tuple(dst_shape)
        and len(crd) == len(src_shape) == len(dst_shape)
    ):
        return tuple(crd2crd(c, s, d) for c, s, d in zip(crd, src_shape, dst_shape))
    return idx2crd(crd2idx(crd, src_shape), dst_shape)


# --------------------------------------------------------------------------
# Slicing
# --------------------------------------------------------------------------


def slice_tuple(crd, t):
    """Keep the parts of ``t`` where ``crd`` has ``None`` (CuTe's ``slice``).

    A ``None`` at the top keeps ``t`` whole; inside a tuple, each kept part
    is concatenated into one flat tuple, so ``slice_tuple((None, (None, 2)),
    (4, (3, 5))) == (4, 3)``.
    """
    if is_tuple(crd):
        return _lift_slice(crd, t)
    if crd is None:
        return t
    return ()


def _lift_slice(crd, t) -> tuple:
    if is_tuple(crd):
        if not is_tuple(t) or len(crd) != len(t):
            raise LayoutError(
                f"slice coordinate {_fmt(crd)} does not match {_fmt(t)}: "
                "a tuple coordinate needs a tuple of the same rank"
            )
        return tuple(x for c, v in zip(crd, t) for x in _lift_slice(c, v))
    if crd is None:
        return (t,)
    return ()
