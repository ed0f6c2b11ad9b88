"""The trace driver: a kernel's Python function, called on stand-ins, becomes verified FlyIR.

``trace_function(fn, name, signature, spec)`` builds the parameters of one specialization
(``runtime.kernel.Specialization``): a constexpr is passed as its Python value, a scalar as a
``Tile`` of a parameter value, a tensor as a ``TensorRef`` whose sizes and strides are
parameters too (with the facts the specialization proved: divisibility, known values). It
then runs ``fn`` inside a ``TraceContext`` (``context.py``), checks that every region it
opened was closed and that it returned nothing, and verifies the ``Function``.
"""

from __future__ import annotations

import inspect
from typing import Any

from .. import dtypes as dt
from ..exc import ArgumentError, ControlFlowError, TraceError
from ..ir.core import Block, Function, Param, Value
from ..ir.types import TensorType, TileType
from ..ir.verifier import verify
from ..language.tile import Tile
from ..language.views import TensorRef
from .context import TraceContext, tracing

__all__ = ["trace_function"]


def trace_function(fn, name: str, signature: inspect.Signature, spec) -> Function:
    """The verified FlyIR of ``fn`` (the kernel ``name`` with ``signature``) for ``spec``."""
    ctx = TraceContext(name)
    body = Block()
    ctx.push(body)
    params: list[Param] = []
    call: dict[str, Any] = {}
    for pname in signature.parameters:
        if pname in spec.constexprs:
            call[pname] = spec.constexprs[pname]
            params.append(Param(pname, "constexpr", None, facts={"value": spec.constexprs[pname]}))
            continue
        s = spec.specs[pname]
        if s.kind == "tensor":
            call[pname] = _tensor_param(pname, s, params)
        else:
            v = Value(TileType(s.dtype), name=pname)
            params.append(Param(pname, "scalar", v, facts=dict(s.facts)))
            call[pname] = Tile(v)
    with tracing(ctx):
        try:
            ret = fn(**call)
        except AttributeError as e:
            misuse = _misused_parameter(name, e, call, spec)
            if misuse is None:
                raise
            raise misuse from None
    if len(ctx.blocks) != 1:
        raise ControlFlowError(
            "a fly.range / fly.while_ loop or fly.if_ block was left early (break, continue or "
            "return inside it is not supported); use a condition with fly.where or fly.if_"
        )
    if ret is not None:
        raise TraceError(
            f"kernel {name} returned {ret!r}; kernels write their results through stores"
        )
    return verify(Function(name, params, body, dict(spec.constexprs)))


def _tensor_param(name: str, s, params: list[Param]) -> TensorRef:
    tv = Value(TensorType(s.dtype, s.rank), name=name)
    params.append(
        Param(name, "tensor", tv, facts={"aligned": s.aligned, "index_bits": s.index_bits})
    )
    idx = dt.int32 if s.index_bits == 32 else dt.int64
    sizes, strides = [], []
    for d in range(s.rank):
        v = Value(TileType(idx), name=f"{name}_size{d}")
        params.append(
            Param(f"{name}.size{d}", "shape", v, of=name, dim=d, facts=dict(s.size_facts[d]))
        )
        sizes.append(Tile(v))
    for d in range(s.rank):
        v = Value(TileType(idx), name=f"{name}_stride{d}")
        params.append(
            Param(f"{name}.stride{d}", "stride", v, of=name, dim=d, facts=dict(s.stride_facts[d]))
        )
        strides.append(Tile(v))
    known = tuple(dict(f).get("value") for f in s.stride_facts)
    return TensorRef(name, tv, s.dtype, tuple(sizes), tuple(strides), idx, static_strides=known)


def _misused_parameter(kernel_name, e: AttributeError, call: dict, spec) -> ArgumentError | None:
    """An ``AttributeError`` the kernel body raised using the stand-in of a number or None
    argument as a tensor (``x.tile``, ``x.shape``): the caller passed a number or None where
    the kernel wants a tensor. Parameters annotated ``fly.Tensor`` are checked before this."""
    obj, attr = getattr(e, "obj", _NOTHING), getattr(e, "name", None)
    if obj is _NOTHING or not isinstance(attr, str) or not hasattr(TensorRef, attr):
        return None
    if obj is None:
        names = [n for n, v in call.items() if v is None]
        got = "None"
    else:
        names = [n for n, v in call.items() if v is obj and isinstance(v, Tile)]
        kinds = {spec.specs[n].kind for n in names if n in spec.specs}
        got = "an int" if kinds == {"int"} else "a float" if kinds == {"float"} else "a number"
    if not names:
        return None
    which = " or ".join(repr(n) for n in names)
    return ArgumentError(
        f"{kernel_name}: parameter {which} got {got}, but the kernel uses it as a tensor "
        f"(.{attr}); pass a torch.Tensor there"
    )


_NOTHING = object()
