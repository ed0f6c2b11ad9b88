"""The op table of the mod translation, derived from torch rather than listed by hand.

``lowering(op)`` says how an ATen / prims op translates:

1. ops whose name is one of FlyDSL's elementwise functions (``exp``, ``sin``, ``sigmoid``, ...)
   or an arithmetic / comparison / bitwise operator run as that instruction;
2. prims FlyDSL has no function for go through textbook identities written in torch
   (``IDENTITIES``: ``tan = sin / cos``, ``trunc``, ``sign``, ``expm1`` ...; a prim is as far as
   torch decomposes);
3. any other op with a decomposition in torch's tables (Inductor's, then ``torch._decomp``) is
   traced through it (``trace_decomposition``) and its pieces translated (``silu``, ``clamp``,
   ``gelu``, ``softplus``, ... down to prims), as are ATen ops named in ``IDENTITIES``;
4. anything else: None (the translation says ``Unsupported`` with the op's name).
"""

from __future__ import annotations

import torch
from torch import fx

from . import program

aten = torch.ops.aten

#: FlyDSL's elementwise functions a same-named ATen / prims op runs as (the program's unary
#: ops but its own ``not`` and ``copy``, which no ATen op of that name maps to)
NATIVE_UNARY = frozenset(program.UNARY) - {"not", "copy"}
#: operator-like ATen / prims names -> binary instruction
OPERATORS = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "true_divide": "div",
    "pow": "pow",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "eq": "eq",
    "ne": "ne",
    "bitwise_and": "and",
    "bitwise_or": "or",
    "bitwise_xor": "xor",
    "logical_and": "and",
    "logical_or": "or",
    "logical_xor": "xor",
    "maximum": "maximum",
    "minimum": "minimum",
    "floor_divide": "floordiv",
    "remainder": "remainder",
    "fmod": "fmod",
    "less": "lt",
    "less_equal": "le",
    "greater": "gt",
    "greater_equal": "ge",
    "equal": "eq",
    "not_equal": "ne",
    "max": "maximum",
    "min": "minimum",
}
LOGICAL = {"logical_and", "logical_or", "logical_xor"}


def _identity_fns():
    """Textbook identities for prims / ATen ops FlyDSL has no function for and torch does not
    decompose further (each written in ops that translate natively)."""

    def sign(x):
        if not x.is_floating_point():
            return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)
        return torch.where(x > 0, 1.0, torch.where(x < 0, -1.0, x * 0)).to(x.dtype)

    def trunc(x):
        return torch.where(x < 0, torch.ceil(x), torch.floor(x)) if x.is_floating_point() else x

    def round_(x):  # half to even, as torch.round
        if not x.is_floating_point():
            return x
        f = torch.floor(x)
        d = x - f
        odd = torch.remainder(f, 2.0) != 0
        return torch.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)

    return {
        "tan": lambda x: torch.sin(x) / torch.cos(x),
        "reciprocal": lambda x: torch.div(torch.ones_like(x), x),  # (1 / x is reciprocal)
        "sign": sign,
        "sgn": sign,
        "signbit": lambda x: x < 0,
        "trunc": trunc,
        "round": round_,
        "frac": lambda x: x - trunc(x),
        "expm1": lambda x: torch.exp(x) - 1.0,
        "log1p": lambda x: torch.log(1.0 + x),
        "log10": lambda x: torch.log2(x) * 0.30102999566398120,
        "sinh": lambda x: (torch.exp(x) - torch.exp(-x)) * 0.5,
        "cosh": lambda x: (torch.exp(x) + torch.exp(-x)) * 0.5,
        "square": lambda x: x * x,
        "erfc": lambda x: 1.0 - torch.erf(x),
        "isnan": lambda x: x != x,
        "isinf": lambda x: torch.abs(x) == float("inf"),
        "isfinite": lambda x: (x == x) & (torch.abs(x) != float("inf")),
        "bitwise_not": lambda x: ~x if x.dtype == torch.bool else -x - 1,
        "logical_not": lambda x: x == 0,
        "positive": lambda x: x,
        "relu": lambda x: torch.maximum(x, torch.zeros_like(x)),
    }


IDENTITIES = _identity_fns()


def op_name(f) -> str:
    return f._schema.name.split("::")[-1] if isinstance(f, torch._ops.OpOverload) else ""


def functional(f):
    """The out-of-place overload of an in-place ATen op (``add_.Tensor`` -> ``add.Tensor``)."""
    if not isinstance(f, torch._ops.OpOverload):
        return None
    name = op_name(f)
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    return getattr(packet, f._overloadname, None) if packet is not None else None


def _decomposition(f):
    """torch's decomposition of ``f`` (Inductor's table first, as a compiled graph would get),
    or None."""
    from torch._decomp import decomposition_table
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table().get(f) or decomposition_table.get(f)


def lowering(f):
    """How ``f`` translates: ``("unary", op)``, ``("binary", op)``, ``("decompose", fn)`` or
    None (the derived table of the module doc)."""
    name = op_name(f)
    if not name:
        return None
    ns = f.namespace
    if ns not in ("aten", "prims"):
        return None
    if name in NATIVE_UNARY:
        return ("unary", name)
    if name in OPERATORS and name not in ("max", "min"):
        return ("binary", name)
    if name in ("max", "min") and f._overloadname in ("other", "default") and ns == "prims":
        return ("binary", name)
    if ns == "aten" and name in ("maximum", "minimum"):
        return ("binary", name)
    if ns == "prims" and name in IDENTITIES:  # a prim is as far as torch decomposes
        return ("decompose", IDENTITIES[name])
    d = _decomposition(f)
    if d is not None:
        return ("decompose", d)
    if name in IDENTITIES:
        return ("decompose", IDENTITIES[name])
    return None


_DECOMP_CACHE: dict = {}


def trace_decomposition(fn, key, args, kwargs, metas):
    """``fn`` traced on 0-d (or shaped) example tensors standing for the node's tensor args."""
    hit = _DECOMP_CACHE.get(key)
    if hit is not None:
        return hit
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.shape_prop import ShapeProp

    where = [i for i, a in enumerate(args) if isinstance(a, fx.Node)]
    ex = [torch.zeros(shape, dtype=dtype) for shape, dtype in metas]

    def call(*ts):
        a = list(args)
        for i, t in zip(where, ts):
            a[i] = t
        return fn(*a, **kwargs)

    gm = make_fx(call)(*ex)
    ShapeProp(gm).propagate(*ex)
    if len(_DECOMP_CACHE) > 512:
        _DECOMP_CACHE.clear()
    _DECOMP_CACHE[key] = gm
    return gm
