"""Argument specialization: what about a call's arguments a compile may assume.

Each run-time argument becomes an ``ArgSpec`` carrying the facts the code
generator may rely on, the same way Triton specializes: an integer equal to
1 becomes a constant, one divisible by 16 is marked so. Tensors record their
dtype, rank, whether their data is 16-byte aligned, whether every offset
fits in 32 bits (so index math can be int32 and AMD buffer loads apply), and
those facts for each size and stride. The tuple of specs is the
specialization key: two calls with the same key share one compile.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from .. import dtypes as dt
from ..exc import ArgumentError

DIV = 16  # the divisibility Triton specializes on, and that 128-bit access needs for 8-bit types


class constexpr:
    """Annotation: this parameter is a compile-time value."""


class Tensor:
    """Annotation: this parameter is a tensor."""


def is_constexpr_annotation(a) -> bool:
    return a is constexpr or a == "constexpr" or str(a).endswith("constexpr")


def is_tensor_annotation(a) -> bool:
    return a is Tensor or a == "Tensor" or str(a).endswith(".Tensor")


def typed(v):
    """A constexpr as part of a cache key. Equal values of different types (2, 2.0, True)
    or signs (0.0, -0.0) trace differently, so they must not share a compile."""
    if isinstance(v, tuple):
        return (tuple, tuple(typed(x) for x in v))
    if isinstance(v, float):
        return (float, v, repr(v))
    return (type(v), v)


def int_facts(v: int) -> tuple:
    """Facts of one integer, as a hashable tuple of (name, value) pairs."""
    if v == 1:
        return (("value", 1),)
    if v % DIV == 0:
        return (("div", DIV),)
    return ()


@dataclass(frozen=True)
class ArgSpec:
    kind: str  # "tensor" | "int" | "float" | "constexpr"
    dtype: dt.DType | None = None
    rank: int = 0
    size_facts: tuple = ()
    stride_facts: tuple = ()
    aligned: bool = False
    index_bits: int = 32
    facts: tuple = ()  # for "int"
    value: object = None  # for "constexpr"

    def to_json(self):
        return {
            "kind": self.kind,
            "dtype": self.dtype.name if self.dtype else None,
            "rank": self.rank,
            "size_facts": [dict(f) for f in self.size_facts],
            "stride_facts": [dict(f) for f in self.stride_facts],
            "aligned": self.aligned,
            "index_bits": self.index_bits,
            "facts": dict(self.facts),
            "value": _json_value(self.value),
        }


def _json_value(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return [_json_value(x) for x in v]
    if hasattr(v, "to_json"):
        return v.to_json()
    return repr(v)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument described without data, for compiling ahead of time.

    ``shape`` and ``stride`` entries are ints (their facts are taken, not
    their values) or ``None`` (nothing is assumed). ``stride=None`` means
    contiguous row-major.
    """

    dtype: object
    shape: tuple
    stride: tuple | None = None
    aligned: bool = True
    index_bits: int = 32

    def arg_spec(self, static_dims=()) -> ArgSpec:
        d = dt.dtype(self.dtype)
        shape = tuple(self.shape)
        stride = self.stride
        if stride is None:
            stride, acc = [], 1
            for s in reversed(shape):
                stride.append(acc)
                acc = acc * s if (s is not None and acc is not None) else None
            stride = tuple(reversed(stride))
        sizes = tuple(
            (("value", s),)
            if i in static_dims and s is not None
            else (int_facts(s) if s is not None else ())
            for i, s in enumerate(shape)
        )
        strides = tuple(int_facts(s) if s is not None else () for s in stride)
        return ArgSpec("tensor", d, len(shape), sizes, strides, self.aligned, self.index_bits)


def _fits32(t) -> bool:
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s > 0)
    return span < 2**31 and t.numel() < 2**31


def is_tensor_like(value) -> bool:
    """A torch.Tensor (checked without importing torch) or a ``TensorSpec``."""
    return isinstance(value, TensorSpec) or (
        hasattr(value, "data_ptr") and hasattr(value, "stride")
    )


def spec_of(value, *, static_dims=(), name="argument") -> ArgSpec:
    """Specialize one run-time argument."""
    if isinstance(value, TensorSpec):
        return value.arg_spec(static_dims)
    if is_tensor_like(value):  # a torch.Tensor, without importing torch
        d = dt.dtype(value.dtype)
        sizes = tuple(
            (("value", s),) if i in static_dims else int_facts(s) for i, s in enumerate(value.shape)
        )
        strides = tuple(int_facts(s) for s in value.stride())
        aligned = value.data_ptr() % 16 == 0
        return ArgSpec(
            "tensor", d, value.dim(), sizes, strides, aligned, 32 if _fits32(value) else 64
        )
    if isinstance(value, bool) or value is None:
        return ArgSpec("constexpr", value=value)
    if isinstance(value, numbers.Integral):
        v = int(value)
        bits = 32 if -(2**31) <= v < 2**31 else 64
        return ArgSpec("int", dt.int32 if bits == 32 else dt.int64, facts=int_facts(v))
    if isinstance(value, numbers.Real):
        return ArgSpec("float", dt.fp32)
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    raise ArgumentError(
        f"{name} got {type(value).__name__} {text}; kernel arguments are tensors, ints, floats, "
        "bools or None (constexpr parameters may be any hashable value)"
    )
