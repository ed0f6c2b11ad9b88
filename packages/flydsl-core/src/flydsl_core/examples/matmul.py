"""Tiled ``c = a @ b`` with a K loop and an fp32 accumulator."""

from __future__ import annotations

import flydsl_core as fly

DEFAULT_SHAPE = (70, 96, 50)  # M, K, N
TOLERANCE = {"fp32": (1e-5, 1e-4), "bf16": (1e-2, 1e-2), "fp16": (1e-2, 1e-2)}


@fly.kernel
def matmul(
    a: fly.Tensor,
    b: fly.Tensor,
    c: fly.Tensor,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
):
    pm, pn = fly.program_id(0), fly.program_id(1)
    acc = fly.zeros((BM, BN), fly.fp32)
    # acc is updated in place, which makes it the loop's carried value.
    for k in fly.range(0, a.shape[1], BK, stages=2):
        at = a[fly.ds(pm * BM, BM), fly.ds(k, BK)].load()
        bt = b[fly.ds(k, BK), fly.ds(pn * BN, BN)].load()
        acc += fly.dot(at, bt)
    c.tile((BM, BN), (pm, pn)).store(acc)


KERNEL = matmul


def make_inputs(shape=DEFAULT_SHAPE, dtype=None, generator=None):
    import torch

    m, k, n = shape
    dtype = dtype or torch.float32
    return (
        torch.randn(m, k, generator=generator).to(dtype),
        torch.randn(k, n, generator=generator).to(dtype),
    )


def run(a, b, *, bm: int = 32, bn: int = 32, bk: int = 32, target=None):
    import torch

    m, n = a.shape[0], b.shape[1]
    c = torch.empty(m, n, dtype=a.dtype)
    if m and n:
        matmul[(fly.cdiv(m, bm), fly.cdiv(n, bn))](a, b, c, BM=bm, BN=bn, BK=bk, target=target)
    return c


def reference(a, b):
    return (a.float() @ b.float()).to(a.dtype)
