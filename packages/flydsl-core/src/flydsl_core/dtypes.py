"""Element types of the FlyDSL language.

A ``DType`` is a small frozen value: its name in FlyIR (``bf16``), its width,
its kind, and the names the backends use for it. Torch is not imported here;
``torch_dtype()`` resolves the torch dtype lazily, so the IR stays free of it.

Promotion follows Triton's rules, which are also what the GPU code does:
int with float gives the float; two floats give the wider one, and fp16 with
bf16 gives fp32; two ints give the wider one. Python numbers are *weak*: they
adopt the dtype of the tile they meet (``x * 2`` keeps ``x`` in bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

from .exc import TypeCheckError


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    kind: str  # "bool" | "int" | "uint" | "float"
    torch_name: str
    triton_name: str
    # Floats the language can only move, convert and feed to dot: no arithmetic.
    storage_only: bool = False

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int" or self.kind == "float"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    def torch_dtype(self):
        import torch

        return getattr(torch, self.torch_name)

    def to_json(self) -> str:
        return self.name


bool_ = DType("bool", 1, "bool", "bool", "tl.int1")
int8 = DType("int8", 8, "int", "int8", "tl.int8")
int16 = DType("int16", 16, "int", "int16", "tl.int16")
int32 = DType("int32", 32, "int", "int32", "tl.int32")
int64 = DType("int64", 64, "int", "int64", "tl.int64")
uint8 = DType("uint8", 8, "uint", "uint8", "tl.uint8")
fp8e4m3 = DType("fp8e4m3", 8, "float", "float8_e4m3fn", "tl.float8e4nv", storage_only=True)
fp8e5m2 = DType("fp8e5m2", 8, "float", "float8_e5m2", "tl.float8e5", storage_only=True)
fp16 = DType("fp16", 16, "float", "float16", "tl.float16")
bf16 = DType("bf16", 16, "float", "bfloat16", "tl.bfloat16")
fp32 = DType("fp32", 32, "float", "float32", "tl.float32")
fp64 = DType("fp64", 64, "float", "float64", "tl.float64")

ALL_DTYPES: tuple[DType, ...] = (
    bool_,
    int8,
    int16,
    int32,
    int64,
    uint8,
    fp8e4m3,
    fp8e5m2,
    fp16,
    bf16,
    fp32,
    fp64,
)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update({"float32": fp32, "float16": fp16, "bfloat16": bf16, "float64": fp64, "i1": bool_})
_BY_TORCH = {d.torch_name: d for d in ALL_DTYPES}

_FLOAT_RANK = {fp8e4m3: 0, fp8e5m2: 0, fp16: 1, bf16: 1, fp32: 2, fp64: 3}


def dtype(x) -> DType:
    """Resolve a DType from a DType, a FlyIR name, or a torch dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x in _BY_NAME:
            return _BY_NAME[x]
        raise TypeCheckError(f"unknown dtype {x!r}; known: {', '.join(d.name for d in ALL_DTYPES)}")
    name = str(x).removeprefix("torch.")
    if name in _BY_TORCH:
        return _BY_TORCH[name]
    raise TypeCheckError(
        f"dtype {x!r} is not supported by FlyDSL; supported: "
        + ", ".join(d.torch_name for d in ALL_DTYPES)
    )


def promote(a: DType, b: DType) -> DType:
    """The common dtype of two tiles in a binary operation."""
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float and b.is_float:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        if ra == rb:
            # fp16 with bf16 (or e4m3 with e5m2) has no common 16-bit type.
            return fp32 if ra <= 1 else a
        return a if ra > rb else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    # Two integers: the wider wins; at equal width a signed type wins.
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if a.kind == "int" else b


def int_dtype_for(value: int) -> DType:
    """The dtype a Python int literal takes when it stands alone."""
    return int32 if -(2**31) <= value < 2**31 else int64
