"""The generated kernel's parameters and what the compiler and launcher need to know of it.

``kernel_params`` turns a function's run-time parameters into the
``@triton.jit`` function's: the ones the IR still uses, in order, named after
the user's parameters (``x_ptr``, ``x_size0``, ``x_stride0``, ``eps``), each
with its Triton signature type and the specialization attributes its facts
allow (``tt.divisibility``; on targets with buffer ops, ``tt.pointer_range``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ... import dtypes as dt
from ...exc import ArgumentError
from ...ir.core import Function
from ...ir.types import TensorType
from ...targets import Target

#: FlyIR dtype -> Triton signature type (ASTSource's ``signature`` values)
SIG_TYPES = {
    dt.bool_: "i1",
    dt.int8: "i8",
    dt.int16: "i16",
    dt.int32: "i32",
    dt.int64: "i64",
    dt.uint8: "u8",
    dt.fp8e4m3: "fp8e4nv",
    dt.fp8e5m2: "fp8e5",
    dt.fp16: "fp16",
    dt.bf16: "bf16",
    dt.fp32: "fp32",
    dt.fp64: "fp64",
}


@dataclass(frozen=True)
class KernelParam:
    """One parameter of the generated ``@triton.jit`` function."""

    name: str  # the Triton parameter name
    kind: str  # "tensor" | "shape" | "stride" | "scalar"
    sig: str  # Triton signature type: "*bf16", "i32", "fp32"
    arg: int  # index of the run-time argument (tensor or scalar) it is read from
    dim: int | None = None  # for shape / stride
    divisibility: int | None = None  # tt.divisibility
    pointer_range_32: bool = False  # every offset from this pointer fits in int32 (buffer ops)
    index_bits: int | None = None  # tensors: 32 or 64

    def attrs(self, *, pointer_range: bool = True) -> list[list[Any]]:
        out: list[list[Any]] = []
        if self.divisibility:
            out.append(["tt.divisibility", self.divisibility])
        if pointer_range and self.pointer_range_32:
            out.append(["tt.pointer_range", 32])
        return out


@dataclass
class GeneratedKernel:
    """The generated source and what the compiler and the launcher need to know about it."""

    name: str  # the @triton.jit function's name
    source: str
    params: list[KernelParam]
    target: str
    interpret: bool
    nargs: int = 0  # run-time arguments of a launch (the function's tensor and scalar params)
    line_locs: dict[int, Any] = field(default_factory=dict)  # source line -> SourceLoc

    @property
    def signature(self) -> dict[str, str]:
        return {p.name: p.sig for p in self.params}

    def attrs(self, *, pointer_range: bool = True) -> dict[tuple[int, ...], list]:
        out = {}
        for i, p in enumerate(self.params):
            a = p.attrs(pointer_range=pointer_range)
            if a:
                out[(i,)] = a
        return out

    @property
    def uses_pointer_range(self) -> bool:
        return any(p.pointer_range_32 for p in self.params)


_RESERVED = {
    "tl",
    "triton",
    "libdevice",
    "float",
    "int",
    "range",
    "True",
    "False",
    "None",
    "and",
    "or",
    "not",
    "if",
    "else",
    "for",
    "while",
    "in",
    "is",
    "def",
    "return",
    "pass",
    "lambda",
    "import",
    "from",
    "class",
    "len",
    "min",
    "max",
    "abs",
}


def safe_name(name: str) -> str:
    """``name`` as a Python identifier that clashes with no generated name (``v3``, ``_fly*``)."""
    name = re.sub(r"\W", "_", name)
    if not name or name[0].isdigit():
        name = "p_" + name
    if name in _RESERVED or name.startswith("_fly") or re.fullmatch(r"v\d+(_\d+)?", name):
        name += "_arg"
    return name


def used_values(fn: Function) -> set[int]:
    used = set()
    for op in fn.walk():
        for v in op.operands:
            used.add(v.id)
    return used


def kernel_params(fn: Function, target: Target) -> tuple[list[KernelParam], dict[int, str]]:
    """The used run-time parameters, in ``fn.params`` order, and value id -> parameter name."""
    used = used_values(fn)
    params: list[KernelParam] = []
    names: dict[int, str] = {}
    runtime = [p for p in fn.params if p.kind in ("tensor", "scalar")]
    arg_of = {p.name: i for i, p in enumerate(runtime)}
    taken: set[str] = set()

    def unique(n):
        while n in taken:
            n += "_"
        taken.add(n)
        return n

    for p in fn.params:
        if p.value is None or p.kind == "constexpr":
            continue
        if p.kind == "tensor":
            name = unique(safe_name(p.name + "_ptr"))
        elif p.kind in ("shape", "stride"):
            name = unique(safe_name(f"{p.of}_{'size' if p.kind == 'shape' else 'stride'}{p.dim}"))
        else:
            name = unique(safe_name(p.name))
        names[p.value.id] = name
        if p.value.id not in used:
            continue  # specialized away (a stride of 1, a static size) or never read
        if p.kind == "tensor":
            t: TensorType = p.value.type
            bits = p.facts.get("index_bits", 64)
            params.append(
                KernelParam(
                    name,
                    "tensor",
                    "*" + SIG_TYPES[t.dtype],
                    arg_of[p.name],
                    divisibility=16 if p.facts.get("aligned") else None,
                    # buffer loads and stores address with a 32-bit offset from the pointer
                    pointer_range_32=target.has_buffer_ops and bits == 32,
                    index_bits=bits,
                )
            )
            continue
        d = p.value.type.dtype
        arg = arg_of[p.of] if p.kind in ("shape", "stride") else arg_of[p.name]
        div = 16 if p.facts.get("div") == 16 and d.is_int else None
        params.append(KernelParam(name, p.kind, SIG_TYPES[d], arg, dim=p.dim, divisibility=div))
    return params, names


def make_extractor(params: list[KernelParam], nargs: int):
    """``f(args) -> tuple`` of the kernel's arguments, from the launch's run-time arguments."""
    parts = []
    for p in params:
        a = f"a[{p.arg}]"
        if p.kind == "shape":
            parts.append(f"{a}.shape[{p.dim}]")
        elif p.kind == "stride":
            parts.append(f"{a}.stride({p.dim})")
        else:
            parts.append(a)
    body = "(" + "".join(x + ", " for x in parts) + ")"
    code = compile(f"lambda a: {body}", "<flydsl-triton-args>", "eval")
    fn = eval(code, {"__builtins__": {}})

    def extract(args):
        if len(args) != nargs:
            raise ArgumentError(f"expected {nargs} run-time arguments, got {len(args)}")
        try:
            return fn(args)
        except (AttributeError, IndexError, TypeError) as e:
            raise ArgumentError(
                f"the run-time arguments do not match the kernel's parameters: {e}"
            ) from None

    return extract
