"""``Tile``: the traced value a kernel computes with.

A Tile is a *mutable handle* to an SSA value. Operators build new tiles;
in-place operators (``+=``, ``set``) rebind the handle, and that rebinding is
how loops and branches learn which values they carry (see trace.context).

Python numbers mixed with tiles are weakly typed: they take the tile's dtype.
Shapes broadcast as in NumPy.
"""

from __future__ import annotations

import numbers

from .. import dtypes as dt
from ..exc import ControlFlowError, TypeCheckError
from ..ir.core import Value
from ..ir.types import TileType
from ..trace.context import current


class Tile:
    __slots__ = ("__weakref__", "_v")

    def __init__(self, v: Value):
        if not isinstance(v.type, TileType):
            raise TypeCheckError(f"a Tile wraps a tile value, got {v.type}")
        self._v = v

    # -- facts ------------------------------------------------------------------
    @property
    def type(self) -> TileType:
        return self._v.type

    @property
    def dtype(self) -> dt.DType:
        return self._v.type.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._v.type.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return self._v.type.numel

    def __repr__(self) -> str:
        return f"Tile({self.type})"

    # -- mutation ---------------------------------------------------------------
    def _rebind(self, v: Value) -> Tile:
        if v.type != self._v.type:
            raise TypeCheckError(
                f"an in-place update must keep the tile's type {self.type}, got {v.type}; "
                "cast the new value first"
            )
        current().note_write(self, self._v)
        self._v = v
        return self

    def set(self, value) -> Tile:
        """Rebind this handle to ``value`` (cast and broadcast to this tile's type)."""
        new = broadcast_to(cast(as_tile(value, like=self), self.dtype), self.shape)
        return self._rebind(new._v)

    # -- conversions that cannot be traced ------------------------------------------
    def __bool__(self):
        raise ControlFlowError(
            "a Python `if`, `while`, `and`, `or`, `not`, `min` or `max` cannot test a traced "
            "tile, whose value is only known when the kernel runs. Use fly.where(cond, a, b) to "
            "select values, `with fly.if_(cond):` for a data-dependent branch, "
            "fly.maximum/fly.minimum for min/max, `&`/`|`/`~` for logic, or make the condition a "
            "compile-time constant (a fly.constexpr parameter)"
        )

    def __index__(self):
        raise ControlFlowError(
            "a traced tile cannot be used as a Python integer (for example in range() or as a "
            "list index). Use fly.range(...) for a loop with run-time bounds, or pass the value "
            "as a fly.constexpr parameter"
        )

    __int__ = __index__

    def __float__(self):
        raise ControlFlowError(
            "a traced tile cannot become a Python float; its value is only known at run time"
        )

    def __iter__(self):
        raise ControlFlowError(
            "a traced tile cannot be iterated in Python; use fly.static_range over its static "
            "shape and index with a slice, or a reduction"
        )

    def __hash__(self):
        return id(self)

    # -- operators --------------------------------------------------------------
    def __add__(self, o):
        return binary("add", self, o)

    def __radd__(self, o):
        return binary("add", o, self)

    def __sub__(self, o):
        return binary("sub", self, o)

    def __rsub__(self, o):
        return binary("sub", o, self)

    def __mul__(self, o):
        return binary("mul", self, o)

    def __rmul__(self, o):
        return binary("mul", o, self)

    def __truediv__(self, o):
        return truediv(self, o)

    def __rtruediv__(self, o):
        return truediv(o, self)

    def __floordiv__(self, o):
        return floordiv(self, o)

    def __rfloordiv__(self, o):
        return floordiv(o, self)

    def __mod__(self, o):
        return binary("mod", self, o)

    def __rmod__(self, o):
        return binary("mod", o, self)

    def __pow__(self, o):
        return binary("pow", self, o, floating=True)

    def __rpow__(self, o):
        return binary("pow", o, self, floating=True)

    def __and__(self, o):
        return binary("and", self, o)

    def __rand__(self, o):
        return binary("and", o, self)

    def __or__(self, o):
        return binary("or", self, o)

    def __ror__(self, o):
        return binary("or", o, self)

    def __xor__(self, o):
        return binary("xor", self, o)

    def __rxor__(self, o):
        return binary("xor", o, self)

    def __lshift__(self, o):
        return binary("shl", self, o)

    def __rlshift__(self, o):
        return binary("shl", o, self)

    def __rshift__(self, o):
        return binary("shr", self, o)

    def __rrshift__(self, o):
        return binary("shr", o, self)

    def __lt__(self, o):
        return binary("lt", self, o)

    def __le__(self, o):
        return binary("le", self, o)

    def __gt__(self, o):
        return binary("gt", self, o)

    def __ge__(self, o):
        return binary("ge", self, o)

    def __eq__(self, o):  # elementwise, as in NumPy
        return binary("eq", self, o)

    def __ne__(self, o):
        return binary("ne", self, o)

    def __neg__(self):
        return unary("neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return unary("abs", self)

    def __invert__(self):
        return unary("invert", self)

    # In-place forms rebind the handle: this is what makes a value loop-carried.
    def __iadd__(self, o):
        return self._rebind(_keep(self, binary("add", self, o))._v)

    def __isub__(self, o):
        return self._rebind(_keep(self, binary("sub", self, o))._v)

    def __imul__(self, o):
        return self._rebind(_keep(self, binary("mul", self, o))._v)

    def __itruediv__(self, o):
        return self._rebind(_keep(self, truediv(self, o))._v)

    def __ifloordiv__(self, o):
        return self._rebind(_keep(self, floordiv(self, o))._v)

    def __imod__(self, o):
        return self._rebind(_keep(self, binary("mod", self, o))._v)

    def __iand__(self, o):
        return self._rebind(_keep(self, binary("and", self, o))._v)

    def __ior__(self, o):
        return self._rebind(_keep(self, binary("or", self, o))._v)

    def __ixor__(self, o):
        return self._rebind(_keep(self, binary("xor", self, o))._v)

    def __ilshift__(self, o):
        return self._rebind(_keep(self, binary("shl", self, o))._v)

    def __irshift__(self, o):
        return self._rebind(_keep(self, binary("shr", self, o))._v)

    # -- indexing: only NumPy-style axis insertion on tiles ------------------------
    def __getitem__(self, idx):
        if not isinstance(idx, tuple):
            idx = (idx,)
        shape, k = [], 0
        for i in idx:
            if i is None:
                shape.append(1)
            elif isinstance(i, slice) and i == slice(None):
                if k >= self.ndim:
                    raise TypeCheckError(f"too many indices for {self.type}")
                shape.append(self.shape[k])
                k += 1
            else:
                raise TypeCheckError(
                    "a tile can only be indexed with `:` and `None` (to add axes); load "
                    "elements through a tensor view instead"
                )
        shape += self.shape[k:]
        return reshape(self, tuple(shape))

    # -- methods mirroring the functions -----------------------------------------------
    def to(self, dtype, *, bitcast: bool = False) -> Tile:
        return globals()["bitcast" if bitcast else "cast"](self, dtype)

    astype = to

    def reshape(self, *shape) -> Tile:
        if len(shape) == 1 and isinstance(shape[0], tuple):
            shape = shape[0]
        return reshape(self, tuple(shape))

    def broadcast_to(self, shape) -> Tile:
        return broadcast_to(self, tuple(shape))

    @property
    def T(self) -> Tile:
        return permute(self, tuple(reversed(range(self.ndim))))

    def permute(self, *order) -> Tile:
        if len(order) == 1 and isinstance(order[0], tuple):
            order = order[0]
        return permute(self, tuple(order))

    def sum(self, axis=None, **kw):
        return _REDUCTIONS["sum"](self, axis, **kw)

    def max(self, axis=None, **kw):
        return _REDUCTIONS["max"](self, axis, **kw)

    def min(self, axis=None, **kw):
        return _REDUCTIONS["min"](self, axis, **kw)


def _keep(old: Tile, new: Tile) -> Tile:
    """In-place ops keep the handle's dtype and shape (as NumPy's do)."""
    if new.shape != old.shape:
        raise TypeCheckError(f"in-place update would change shape {old.shape} -> {new.shape}")
    return cast(new, old.dtype)


# --- construction helpers -------------------------------------------------------------


def emit1(name, operands, attrs=None) -> Tile:
    return Tile(current().emit(name, [t._v for t in operands], attrs).result)


def constant(value, dtype, shape=()) -> Tile:
    dtype = dt.dtype(dtype)
    if dtype.is_bool:
        value = bool(value)
    elif dtype.is_int:
        if isinstance(value, float) and not value.is_integer():
            raise TypeCheckError(f"{value} is not an integer constant for {dtype}")
        value = int(value)
    else:
        value = float(value)
    return emit1("constant", [], {"value": value, "dtype": dtype, "shape": tuple(shape)})


def is_number(x) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, complex)


def as_tile(x, like=None) -> Tile:
    """A tile from a tile or a Python number.

    A number is weakly typed: it takes ``like``'s dtype (a Tile or a DType)
    when that is a computing dtype it fits in.
    """
    if isinstance(x, Tile):
        return x
    if hasattr(x, "__fly_tile__"):
        return x.__fly_tile__()
    d = like.dtype if isinstance(like, Tile) else like
    if d is not None and d.storage_only:
        d = dt.fp32
    if isinstance(x, bool):
        return constant(int(x), d) if d is not None and not d.is_bool else constant(x, dt.bool_)
    if isinstance(x, numbers.Integral):
        x = int(x)
        if d is not None and not d.is_bool and (d.is_float or _fits(x, d)):
            return constant(x, d)
        return constant(x, dt.int_dtype_for(x))
    if isinstance(x, numbers.Real):
        return constant(float(x), d if d is not None and d.is_float else dt.fp32)
    raise TypeCheckError(
        f"cannot use a {type(x).__name__} in a kernel computation; expected a tile or a number"
    )


def _fits(x: int, d: dt.DType) -> bool:
    if d.kind == "uint":
        return 0 <= x < 2**d.bits
    return -(2 ** (d.bits - 1)) <= x < 2 ** (d.bits - 1)


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            raise TypeCheckError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def reshape(x: Tile, shape) -> Tile:
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return emit1("reshape", [x], {"shape": shape})


def broadcast_to(x, shape) -> Tile:
    x = as_tile(x)
    shape = tuple(shape)
    if x.shape == shape:
        return x
    if x.ndim < len(shape):
        x = reshape(x, (1,) * (len(shape) - x.ndim) + x.shape)
        if x.shape == shape:
            return x
    if x.ndim > len(shape):
        raise TypeCheckError(f"cannot broadcast {x.type} to shape {shape}")
    return emit1("broadcast", [x], {"shape": shape})


def permute(x: Tile, order) -> Tile:
    order = tuple(order)
    if order == tuple(range(x.ndim)):
        return x
    return emit1("permute", [x], {"order": order})


def cast(x, dtype) -> Tile:
    x = as_tile(x)
    dtype = dt.dtype(dtype)
    if x.dtype == dtype:
        return x
    return emit1("cast", [x], {"dtype": dtype})


def bitcast(x: Tile, dtype) -> Tile:
    dtype = dt.dtype(dtype)
    if x.dtype == dtype:
        return x
    return emit1("bitcast", [x], {"dtype": dtype})


def unify(*xs, floating: bool = False, dtype: dt.DType | None = None) -> list[Tile]:
    """Promote and broadcast operands to one type, NumPy/Triton style."""
    like = None
    for x in xs:
        if isinstance(x, Tile):
            like = x.dtype if like is None else dt.promote(like, x.dtype)
    out = [as_tile(x, like) for x in xs]
    target = dtype
    if target is None:
        target = out[0].dtype
        for t in out[1:]:
            target = dt.promote(target, t.dtype)
    if floating and not target.is_float:
        target = dt.fp32
    shape = broadcast_shapes(*(t.shape for t in out))
    return [broadcast_to(cast(t, target), shape) for t in out]


def binary(name: str, a, b, *, floating: bool = False) -> Tile:
    a, b = unify(a, b, floating=floating)
    return emit1(name, [a, b])


def unary(name: str, a) -> Tile:
    return emit1(name, [as_tile(a)])


def truediv(a, b) -> Tile:
    return binary("truediv", a, b, floating=True)


def floordiv(a, b) -> Tile:
    a, b = unify(a, b)
    if a.dtype.is_float:
        return unary("floor", emit1("truediv", [a, b]))
    return emit1("intdiv", [a, b])


# --- one-axis reductions (``Tile.sum`` / ``max`` / ``min``; ``reduce.py`` exports them all) ------


def reduce_axis(x: Tile, axis) -> int:
    if axis is None:
        raise TypeCheckError("give the reduction an axis (tiles reduce along one axis)")
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a < x.ndim:
        raise TypeCheckError(f"axis {axis} is out of range for {x.type}")
    return a


def acc_dtype(x: Tile, kind: str, dtype) -> dt.DType:
    if dtype is not None:
        return dt.dtype(dtype)
    if kind in ("sum", "prod", "cumsum", "cumprod"):
        if x.dtype.is_float and x.dtype.bits < 32:
            return dt.fp32
        if (x.dtype.is_int or x.dtype.is_bool) and x.dtype.bits < 32:
            return dt.int32
    if x.dtype.storage_only:
        return dt.fp32
    return x.dtype


def keep_dims(x: Tile, r: Tile, axis: int, keepdims: bool) -> Tile:
    if not keepdims:
        return r
    shape = list(x.shape)
    shape[axis] = 1
    return reshape(r, tuple(shape))


def reduction(kind: str):
    """The one-axis reduction ``kind`` (``sum``, ``prod``, ``max``, ``min``, ``xor_sum``) as a
    function ``fn(x, axis, *, keepdims=False, dtype=None)``: the ``reduce`` op of ``x`` in its
    accumulation dtype (``acc_dtype``)."""

    def fn(x, axis=None, *, keepdims: bool = False, dtype=None) -> Tile:
        x = as_tile(x)
        a = reduce_axis(x, axis)
        src = cast(x, acc_dtype(x, kind, dtype))
        r = Tile(current().emit("reduce", [src._v], {"kind": kind, "axis": a}).result)
        return keep_dims(x, r, a, keepdims)

    fn.__name__ = kind
    return fn


_REDUCTIONS = {k: reduction(k) for k in ("sum", "max", "min")}
