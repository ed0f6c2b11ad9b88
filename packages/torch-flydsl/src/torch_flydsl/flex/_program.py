"""Run a translated mod program on FlyDSL tiles, at kernel trace time.

A program (``_fx.translate``) is a tuple of instructions ``(op, dtype, operands, compute)``:
``op`` one of ``OPS`` below, ``dtype`` the result's FlyDSL dtype name (torch's promotion,
decided at capture: each result is cast to it, so FlyDSL computes what torch computes),
``compute`` the dtype the operands of a binary op are cast to first (torch's promotion of the
operands: it differs from the result's for comparisons), ``operands`` a tuple of
``("v", i)`` (the result of instruction ``i``), ``("arg", name)`` (``score``, ``b``, ``h``,
``q_idx``, ``kv_idx``, ``grad_out``), ``("c", kind, text)`` (a constant: ``"f"`` float written
with ``repr``, ``"i"`` int, ``"b"`` bool; text keeps ``inf`` encodable in the cache key) or,
for ``gather``, ``("t", slot, sizes)`` (the kernel's mod tensor ``slot`` and its shape). The
last instruction is the result. Programs are plain tuples of strings and numbers, so the kernel
cache key (``flydsl_core.cache.source_fingerprint`` over the closures below) covers them.
"""

from __future__ import annotations

import flydsl_core as fly

_DT = {
    "fp32": fly.fp32,
    "bf16": fly.bf16,
    "fp16": fly.fp16,
    "int32": fly.int32,
    "bool": fly.bool_,
}

_UNARY = {
    "exp": fly.exp,
    "exp2": fly.exp2,
    "log": fly.log,
    "log2": fly.log2,
    "tanh": fly.tanh,
    "sigmoid": fly.sigmoid,
    "sqrt": fly.sqrt,
    "rsqrt": fly.rsqrt,
    "erf": fly.erf,
    "sin": fly.sin,
    "cos": fly.cos,
    "floor": fly.floor,
    "ceil": fly.ceil,
    "abs": fly.abs,
}


def _const(kind, text):
    if kind == "f":
        return float(text)
    if kind == "b":
        return text == "True"
    return int(text)


def _c_floor_parts(a, b):
    """Torch's floor division and remainder from FlyDSL's C (truncating) ones, integers."""
    q = a // b
    r = a % b
    fix = (r != 0) & ((r < 0) != (b < 0))
    return fly.where(fix, q - 1, q), fly.where(fix, r + b, r)


def _binary(op, a, b):
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
    if op == "floordiv":
        if a.dtype.is_float:
            return fly.floor(a / b)
        return _c_floor_parts(a, b)[0]
    if op == "remainder":
        if a.dtype.is_float:
            return a - fly.floor(a / b) * b
        return _c_floor_parts(a, b)[1]
    if op == "truncdiv":
        return (
            fly.where((a / b) < 0, fly.ceil(a / b), fly.floor(a / b))
            if a.dtype.is_float
            else a // b
        )
    raise AssertionError(op)


BINARY = [
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
]
UNARY = (*_UNARY, "neg", "not", "sign", "copy")
OPS = (*BINARY, *UNARY, "where", "gather")


def run(prog, args: dict, tensors):
    """The value of ``prog`` on FlyDSL tiles ``args`` and mod tensors ``tensors``."""
    vals = []

    def get(o, dtype=None):
        if o[0] == "v":
            x = vals[o[1]]
        elif o[0] == "arg":
            x = args[o[1]]
        else:
            x = _const(o[1], o[2])
        return fly.cast(x, dtype) if dtype is not None else x

    for op, dname, ops, cname in prog:
        d = _DT[dname]
        if op == "gather":
            slot, sizes = ops[0][1], ops[0][2]
            idx = []
            for o, n in zip(ops[1:], sizes):
                i = get(o, fly.int32)
                idx.append(fly.where(i < 0, i + n, i))  # torch's negative indices
            x = tensors[slot].gather(*idx).load()
        elif op == "where":
            c = get(ops[0], fly.bool_)
            x = fly.where(c, get(ops[1], d), get(ops[2], d))
        elif op in _UNARY:
            x = _UNARY[op](get(ops[0], d if d.is_float else None))
        elif op == "neg":
            x = -get(ops[0], d)
        elif op == "not":
            x = get(ops[0], fly.bool_) == False  # noqa: E712  (elementwise, not identity)
        elif op == "sign":
            a = get(ops[0], d)
            x = fly.where(a > 0, 1, fly.where(a < 0, -1, 0))
        elif op == "copy":
            x = get(ops[0])
        else:
            cd = _DT[cname]
            x = _binary(op, get(ops[0], cd), get(ops[1], cd))
        vals.append(fly.cast(x, d))
    return vals[-1]


def score_fn(prog):
    """A FlyDSL score mod (``attention.mods.ScoreMod``'s ``fn``) running ``prog``."""

    def flex_score_mod(score, b, h, q_idx, kv_idx, *tensors):
        return run(
            prog, {"score": score, "b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx}, tensors
        )

    return flex_score_mod


def grad_fn(prog):
    """A FlyDSL score-mod gradient (``ScoreMod``'s ``grad``) running the joint ``prog``."""

    def flex_score_grad(score, out, grad_out, b, h, q_idx, kv_idx, *tensors):
        a = {"score": score, "grad_out": grad_out, "b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx}
        return run(prog, a, tensors)

    return flex_score_grad


def mask_fn(prog):
    """A FlyDSL mask mod (``MaskMod``'s ``fn``) running ``prog``."""

    def flex_mask_mod(b, h, q_idx, kv_idx, *tensors):
        return run(prog, {"b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx}, tensors)

    return flex_mask_mod
