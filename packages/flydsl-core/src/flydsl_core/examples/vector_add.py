"""``out = x + y`` over a 1-D tensor, one block per program."""

from __future__ import annotations

import flydsl_core as fly

DEFAULT_SHAPE = (100_003,)
TOLERANCE = {"fp32": (0.0, 0.0), "bf16": (0.0, 0.0), "fp16": (0.0, 0.0)}


@fly.kernel
def vector_add(x: fly.Tensor, y: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
    i = fly.program_id(0)
    # Each view masks its own tail: the last block of a length that BLOCK does not divide.
    out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load() + y.tile((BLOCK,), i).load())


KERNEL = vector_add


def make_inputs(shape=DEFAULT_SHAPE, dtype=None, generator=None):
    import torch

    dtype = dtype or torch.float32
    return (
        torch.randn(shape, generator=generator).to(dtype),
        torch.randn(shape, generator=generator).to(dtype),
    )


def run(x, y, *, block: int = 1024, target=None):
    import torch

    out = torch.empty_like(x)
    n = x.numel()
    vector_add[(fly.cdiv(n, block),)](
        x.reshape(-1), y.reshape(-1), out.view(-1), BLOCK=block, target=target
    )
    return out


def reference(x, y):
    return x + y
