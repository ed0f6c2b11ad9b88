"""Cumulative sum along rows of any length: a scan per block, carrying the running total."""

from __future__ import annotations

import flydsl_core as fly

DEFAULT_SHAPE = (13, 3001)
TOLERANCE = {"fp32": (1e-5, 1e-4), "bf16": (1e-2, 5e-2), "fp16": (1e-2, 5e-2)}


@fly.kernel
def cumsum(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
    row = fly.program_id(0)
    n = x.shape[1]
    carry = fly.zeros((), fly.fp32)
    for start in fly.range(0, n, BLOCK):
        t = x[row, fly.ds(start, BLOCK)].load().to(fly.fp32)
        out[row, fly.ds(start, BLOCK)].store(fly.cumsum(t, 0) + carry)
        carry += fly.sum(t, 0)  # in place: the running total is loop-carried


KERNEL = cumsum


def make_inputs(shape=DEFAULT_SHAPE, dtype=None, generator=None):
    import torch

    return (torch.randn(shape, generator=generator).to(dtype or torch.float32),)


def run(x, *, block: int = 512, target=None):
    import torch

    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(x2)
    if x2.numel():
        cumsum[(x2.shape[0],)](x2, out, BLOCK=block, target=target)
    return out.reshape(x.shape)


def reference(x):
    return x.float().cumsum(-1).to(x.dtype)
