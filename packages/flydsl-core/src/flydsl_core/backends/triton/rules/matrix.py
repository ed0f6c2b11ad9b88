"""Triton rules for matrix multiplies: ``dot`` and the MX block-scaled ``dot_scaled``."""

from __future__ import annotations

from .... import dtypes as dt
from ....ir.core import Op
from ..emitter import Lowering, lower


@lower("dot")
def _dot(cx: Lowering, op: Op):
    a, b, acc = op.operand("a"), op.operand("b"), op.operand("acc")
    d = a.type.dtype
    args = [cx.full(a), cx.full(b)]
    tacc = cx.get(acc)
    if tacc.literal and tacc.value == 0:
        if d.is_int:
            args.append("out_dtype=tl.int32")  # a zero accumulator is Triton's default
    else:
        args.append(cx.full(acc))
    if d == dt.fp32:
        prec = op.attrs.get("input_precision", "ieee")
        if prec not in cx.dot_precisions:
            prec = "ieee"  # tf32 permits a faster product; ieee is always a valid choice
        args.append(f'input_precision="{prec}"')
    cx.define(op.results[0], f"tl.dot({', '.join(args)})", loc=op.loc)


@lower("dot_scaled")
def _dot_scaled(cx: Lowering, op: Op):
    a, sa, b, sb = (op.operand(n) for n in ("a", "a_scale", "b", "b_scale"))
    fa, fb = op.attrs["a_format"], op.attrs["b_format"]
    tacc = cx.get(op.operand("acc"))
    args = [cx.full(a), cx.full(sa), f'"{fa}"', cx.full(b), cx.full(sb), f'"{fb}"']
    if not (tacc.literal and tacc.value == 0):
        args.append(cx.full(op.operand("acc")))
    cx.define(op.results[0], f"tl.dot_scaled({', '.join(args)})", loc=op.loc)
