"""A translated flex_attention mod: one representation, ``Program``, and the two ways to run it.

A program is a straight-line list of scalar instructions over named inputs (``score``, ``b``,
``h``, ``q_idx``, ``kv_idx``, and ``grad_out`` in a gradient program) and the captured tensors
it reads by slot. Each instruction is ``(op, dtype, operands, compute)``:

* ``op``: one of ``UNARY``, ``BINARY``, ``"where"`` or ``"gather"``;
* ``dtype``: the result's dtype name (``DTYPES``): torch's promotion, decided at translation,
  each result cast to it, so FlyDSL computes what torch computes;
* ``compute``: the dtype a binary op's operands are cast to first (torch's promotion of the
  operands: for comparisons it differs from the result's);
* ``operands``: ``("v", i)`` (instruction ``i``'s result), ``("arg", name)`` (an input),
  ``("c", kind, text)`` (a constant: ``"f"`` float written with ``repr``, ``"i"`` int, ``"b"``
  bool) or, first in a ``gather``, ``("t", slot)``, then one index per dimension of that
  tensor (negative indices wrap, as torch's do).

``outputs`` lists the operands the program returns (the mod's value; a gradient program returns
the gradient w.r.t. the score, then one per gradient site). ``tensors`` gives each slot's shape
and dtype. A program is made of tuples of strings and numbers: hashable, a kernel cache key
(``flydsl_core.cache.source_fingerprint`` covers the closures of ``kernel_fn``), and ``text()``
/ ``Program.from_text`` give the one text form a custom op argument needs under torch.compile.

``kernel_fn`` runs a program on FlyDSL tiles when a kernel is traced; ``evaluate`` runs it on
torch tensors (the host-side index checks, the gradient-site index grids, and the traces the
gradient programs are derived from).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

#: value dtypes of a program and their torch names
DTYPES = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "int32": "int32",
    "bool": "bool",
}

UNARY = (
    "exp",
    "exp2",
    "log",
    "log2",
    "tanh",
    "sigmoid",
    "sqrt",
    "rsqrt",
    "erf",
    "sin",
    "cos",
    "floor",
    "ceil",
    "abs",
    "neg",
    "not",
    "copy",
)
BINARY = (
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
    "and",
    "or",
    "xor",
    "maximum",
    "minimum",
    "floordiv",
    "remainder",
    "truncdiv",
    "fmod",
)
OPS = (*UNARY, *BINARY, "where", "gather")
#: inputs a program may name
ARGS = ("score", "b", "h", "q_idx", "kv_idx", "grad_out")
INDEX_ARGS = ("b", "h", "q_idx", "kv_idx")


@dataclass(frozen=True)
class Program:
    """A translated mod (see the module doc)."""

    inputs: tuple
    instrs: tuple
    outputs: tuple
    tensors: tuple = ()  # per slot: (shape, torch dtype name)

    def text(self) -> str:
        return json.dumps([self.inputs, self.instrs, self.outputs, self.tensors])

    @staticmethod
    def from_text(text: str) -> Program:
        return _from_text(text)

    def cache_key(self):
        return self.text()

    @property
    def output(self):
        return self.outputs[0]

    def with_outputs(self, outputs) -> Program:
        return Program(self.inputs, self.instrs, tuple(outputs), self.tensors)

    def deps(self) -> list[frozenset]:
        """Per instruction, the inputs its value depends on (``"t<slot>"`` for data read)."""
        out: list[frozenset] = []

        def of(o):
            if o[0] == "v":
                return out[o[1]]
            if o[0] == "arg":
                return frozenset((o[1],))
            if o[0] == "t":
                return frozenset((f"t{o[1]}",))
            return frozenset()

        for _op, _d, ops, _c in self.instrs:
            s = frozenset()
            for o in ops:
                s |= of(o)
            out.append(s)
        return out

    def operand_deps(self, o, deps=None) -> frozenset:
        deps = self.deps() if deps is None else deps
        if o[0] == "v":
            return deps[o[1]]
        if o[0] == "arg":
            return frozenset((o[1],))
        return frozenset()

    def gathers(self, slot=None) -> list[int]:
        """Indices of the gather instructions (of ``slot``, or all)."""
        return [
            i
            for i, (op, _d, ops, _c) in enumerate(self.instrs)
            if op == "gather" and (slot is None or ops[0][1] == slot)
        ]

    def is_identity(self) -> bool:
        """The score mod returns the score unchanged."""
        o = self.output
        if o == ("arg", "score"):
            return True
        return (
            o[0] == "v"
            and self.instrs[o[1]][0] == "copy"
            and self.instrs[o[1]][2][0]
            == (
                "arg",
                "score",
            )
            and self.instrs[o[1]][1] == "fp32"
        )

    def is_true(self) -> bool:
        """The mask mod returns True everywhere (torch's ``noop_mask``)."""
        o = self.output
        while o[0] == "v" and self.instrs[o[1]][0] == "copy":
            o = self.instrs[o[1]][2][0]
        return o == ("c", "b", "True") or (o[0] == "c" and o[1] in "if" and float(o[2]) != 0)


def _tuples(x):
    return tuple(_tuples(i) for i in x) if isinstance(x, list) else x


@functools.lru_cache(maxsize=512)
def _from_text(text: str) -> Program:
    inputs, instrs, outputs, tensors = _tuples(json.loads(text))
    return Program(inputs, instrs, outputs, tensors)


def const(v) -> tuple:
    """The operand of a Python constant."""
    if isinstance(v, bool):
        return ("c", "b", str(v))
    if isinstance(v, int):
        return ("c", "i", str(v))
    if isinstance(v, float):
        return ("c", "f", repr(v) if math.isfinite(v) else str(v))
    raise TypeError(type(v).__name__)


def const_value(kind, text):
    if kind == "f":
        return float(text)
    if kind == "b":
        return text == "True"
    return int(text)


# -- on FlyDSL tiles (kernel trace time) ------------------------------------------------------------


def _fly_binary(fly, op, a, b):
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return a / b
    if op == "pow":
        return a**b
    if op == "lt":
        return a < b
    if op == "le":
        return a <= b
    if op == "gt":
        return a > b
    if op == "ge":
        return a >= b
    if op == "eq":
        return a == b
    if op == "ne":
        return a != b
    if op == "and":
        return a & b
    if op == "or":
        return a | b
    if op == "xor":
        return a ^ b
    if op == "maximum":
        return fly.maximum(a, b)
    if op == "minimum":
        return fly.minimum(a, b)
    if op in ("floordiv", "remainder"):
        if a.dtype.is_float:
            f = fly.floor(a / b)
            return f if op == "floordiv" else a - f * b
        q, r = a // b, a % b  # C's truncating division: torch's rounds towards -inf
        fix = (r != 0) & ((r < 0) != (b < 0))
        return fly.where(fix, q - 1, q) if op == "floordiv" else fly.where(fix, r + b, r)
    if op in ("truncdiv", "fmod"):
        if a.dtype.is_float:
            x = a / b
            t = fly.where(x < 0, fly.ceil(x), fly.floor(x))
            return t if op == "truncdiv" else a - t * b
        return a // b if op == "truncdiv" else a % b
    raise AssertionError(op)


def _fly_unary(fly, op, x):
    if op == "neg":
        return -x
    if op == "not":
        return x == False  # noqa: E712  (elementwise, not identity)
    if op == "copy":
        return x
    if op == "abs":
        return fly.abs(x)
    return getattr(fly, op)(x)


def run_fly(prog: Program, args: dict, tensors, layout) -> list:
    """The outputs of ``prog`` on FlyDSL tiles ``args``; ``tensors``: the kernel's mod tensors,
    ``layout``: per slot ``(arg, offset, strides)`` (``strides`` None: the kernel tensor has
    the slot's shape, a 0-d one as ``(1,)``; else a flat buffer holding the slot at
    ``offset``)."""
    import flydsl_core as fly

    dt = {
        "fp32": fly.fp32,
        "bf16": fly.bf16,
        "fp16": fly.fp16,
        "int32": fly.int32,
        "bool": fly.bool_,
    }
    vals: list = []

    def get(o, dtype=None):
        if o[0] == "v":
            x = vals[o[1]]
        elif o[0] == "arg":
            x = args[o[1]]
        else:
            x = const_value(o[1], o[2])
        return fly.cast(x, dtype) if dtype is not None else x

    for op, dname, ops, cname in prog.instrs:
        d = dt[dname]
        if op == "gather":
            slot = ops[0][1]
            shape = prog.tensors[slot][0]
            arg, offset, strides = layout[slot]
            idx = []
            for o, n in zip(ops[1:], shape):
                i = get(o, fly.int32)
                i = fly.where(i < 0, i + n, i)  # torch's negative indices
                # in range wherever the mod is defined (checked on the host, ``bounds``);
                # clamped for the padding rows and keys of edge tiles, whose scores are dropped
                idx.append(fly.minimum(fly.maximum(i, 0), n - 1))
            if strides is None:
                x = tensors[arg].gather(*(idx or [0])).load(bounds_check=False)
            else:
                flat = offset
                for i, s in zip(idx, strides):
                    flat = i * s + flat
                x = tensors[arg].gather(flat).load(bounds_check=False)
        elif op == "where":
            x = fly.where(get(ops[0], fly.bool_), get(ops[1], d), get(ops[2], d))
        elif op in UNARY:
            x = _fly_unary(fly, op, get(ops[0], d if op not in ("not", "copy") else None))
        else:
            cd = dt[cname]
            x = _fly_binary(fly, op, get(ops[0], cd), get(ops[1], cd))
        vals.append(fly.cast(x, d))
    return [get(o) for o in prog.outputs]


def kernel_fn(prog: Program, layout: tuple, output: int = 0, names=None):
    """A FlyDSL mod function running ``prog`` (its output ``output``), with positional
    inputs ``names`` (default: the program's) then the mod tensors."""
    names = tuple(prog.inputs if names is None else names)

    def flex_mod(*a):
        return run_fly(prog, dict(zip(names, a)), a[len(names) :], layout)[output]

    return flex_mod


# -- on torch tensors --------------------------------------------------------------------------------


def torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


def _torch_binary(torch, op, a, b):
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return a / b
    if op == "pow":
        return torch.pow(a, b)
    if op in ("lt", "le", "gt", "ge", "eq", "ne"):
        return getattr(torch, op)(a, b)
    if op == "and":
        return a & b
    if op == "or":
        return a | b
    if op == "xor":
        return a ^ b
    if op == "maximum":
        return torch.maximum(a, b)
    if op == "minimum":
        return torch.minimum(a, b)
    if op == "floordiv":
        return torch.div(a, b, rounding_mode="floor")
    if op == "remainder":
        return torch.remainder(a, b)
    if op == "truncdiv":
        return torch.div(a, b, rounding_mode="trunc")
    if op == "fmod":
        return torch.fmod(a, b)
    raise AssertionError(op)


def evaluate(prog: Program, env: dict, tensors, *, replace=None, upto=None) -> list:
    """The outputs of ``prog`` on torch tensors (``env``: input name -> tensor, broadcasting;
    ``tensors``: the captured tensors by slot). ``replace``: instruction index -> tensor used
    instead of computing it (a gradient site's value); ``upto``: stop after that instruction
    and return its value alone (instructions it does not depend on are skipped)."""
    import torch

    need = None
    if upto is not None:
        need = set()
        stack = [upto]
        while stack:
            i = stack.pop()
            if i in need:
                continue
            need.add(i)
            if replace and i in replace:
                continue
            stack.extend(o[1] for o in prog.instrs[i][2] if o[0] == "v")
    vals: dict = {}

    def get(o, dtype=None):
        if o[0] == "v":
            x = vals[o[1]]
        elif o[0] == "arg":
            x = env[o[1]]
        else:
            v = const_value(o[1], o[2])
            x = torch.tensor(
                v, dtype=dtype or {"f": torch.float32, "b": torch.bool, "i": torch.int32}[o[1]]
            )
        return x.to(dtype) if dtype is not None and x.dtype != dtype else x

    for n, (op, dname, ops, cname) in enumerate(prog.instrs):
        if need is not None and n not in need:
            continue
        d = torch_dtype(dname)
        if replace and n in replace:
            vals[n] = replace[n]
            continue
        if op == "gather":
            t = tensors[ops[0][1]]
            idx = [get(o).long() for o in ops[1:]]
            x = torch.ops.aten.index.Tensor(t, idx) if idx else t  # traceable on 0-d indices
        elif op == "where":
            x = torch.where(get(ops[0], torch.bool), get(ops[1], d), get(ops[2], d))
        elif op in UNARY:
            a = get(ops[0], d if op not in ("not", "copy") else None)
            if op == "neg":
                x = -a
            elif op == "not":
                x = ~a.bool()
            elif op == "copy":
                x = a
            else:
                x = getattr(torch, op)(a)
        else:
            cd = torch_dtype(cname)
            x = _torch_binary(torch, op, get(ops[0], cd), get(ops[1], cd))
        vals[n] = x.to(d) if x.dtype != d else x
        if upto is not None and n == upto:
            return [vals[n]]
    return [get(o) for o in prog.outputs]
