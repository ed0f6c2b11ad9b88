"""``TensorRef.gather``: elementwise (NumPy advanced) indexing with index tiles, on both CPU
backends, against torch indexing of seeded random data; out-of-range pairs read ``other``."""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core.exc import TypeCheckError

pytestmark = pytest.mark.cpu

TARGETS = ["cpu-reference", "cpu-interpret"]


@fly.kernel
def pair_gather(x, ri, ci, out, BR: fly.constexpr, BC: fly.constexpr):
    r = ri.tile((BR,), 0).load(other=-1)
    c = ci.tile((BC,), 0).load(other=-1)
    # a (BR, 1) row index against a (1, BC) column index: every pair, elementwise
    v = x.gather(r[:, None], c[None, :] - r[:, None]).load(other=-3.0)
    out.tile((BR, BC), (0, 0)).store(v)


@fly.kernel
def diag_gather(x, idx, out, B: fly.constexpr):
    i = idx.tile((B,), 0).load(other=0)
    out.tile((B,), 0).store(x.gather(i, i).load())  # the same index on both axes: a diagonal
    x.gather(i, fly.full((B,), 0, fly.int32)).store(i.to(fly.fp32) * 10, i < 3)


@pytest.mark.parametrize("target", TARGETS)
def test_gather_pairs_indices_and_masks_out_of_range(target):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 9, generator=g)
    ri = torch.tensor([0, 6, 3, -1, 7], dtype=torch.int32)
    ci = torch.randint(-2, 12, (6,), generator=g).to(torch.int32)
    out = torch.full((5, 6), 99.0)
    pair_gather[(1,)](x, ri, ci, out, BR=8, BC=8, target=target)
    r, c = ri[:, None].long(), ci[None, :].long() - ri[:, None].long()
    ok = (r >= 0) & (r < 7) & (c >= 0) & (c < 9)
    want = torch.where(ok, x[r.clamp(0, 6), c.clamp(0, 8)], torch.tensor(-3.0))
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
def test_gather_store_and_diagonal(target):
    x = torch.randn(5, 5, generator=torch.Generator().manual_seed(4))
    idx = torch.tensor([4, 1, 2, 0], dtype=torch.int32)
    out = torch.zeros(4)
    ref = x.clone()
    diag_gather[(1,)](x, idx, out, B=4, target=target)
    torch.testing.assert_close(out, ref[idx.long(), idx.long()], rtol=0, atol=0)
    ref[idx[idx < 3].long(), 0] = idx[idx < 3].float() * 10
    torch.testing.assert_close(x, ref, rtol=0, atol=0)


def test_gather_needs_one_index_per_dim():
    @fly.kernel
    def bad(x, out):
        out.tile((4,), 0).store(x.gather(fly.arange(0, 4)).load())

    with pytest.raises(TypeCheckError, match="one index per dimension"):
        bad[(1,)](torch.zeros(4, 4), torch.zeros(4), target="cpu-reference")
