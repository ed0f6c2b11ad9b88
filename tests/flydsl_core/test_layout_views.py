"""Views and tiles through the layout algebra, run on the reference backend vs PyTorch."""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core.exc import TypeCheckError
from flydsl_core.layout import Layout, Swizzle, make_swizzled_layout, zipped_divide

pytestmark = pytest.mark.cpu


@fly.kernel
def tile_by_layout(x: fly.Tensor, out: fly.Tensor, L: fly.constexpr, BLOCK: fly.constexpr):
    i = fly.program_id(0)
    out.tile((BLOCK,), i).store(x.tile((L,), i).load())


@pytest.mark.parametrize(
    "layout", [Layout((4, 8), (8, 1)), Layout((2, (2, 4)), (1, (8, 2))), Layout(16, 1)]
)
@pytest.mark.parametrize("n", [1, 37, 64, 70])
def test_tiling_with_a_permuting_layout(layout, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    out = torch.full((n,), float("nan"))
    size = layout.size()
    tile_by_layout[(fly.cdiv(n, size),)](x, out, L=layout, BLOCK=size)
    perm = torch.tensor([layout(j) for j in range(size)])
    ref = torch.empty(n)
    for b in range(fly.cdiv(n, size)):
        src = b * size + perm
        vals = torch.where(src < n, x[src.clamp(max=n - 1)], torch.zeros(()))
        dst = b * size + torch.arange(size)
        keep = dst < n
        ref[dst[keep]] = vals[keep]
    assert torch.equal(out, ref)


def test_a_layout_tiler_must_permute_its_block():
    x = torch.randn(32)
    with pytest.raises(TypeCheckError, match="size == cosize"):
        tile_by_layout[(1,)](x, torch.empty(32), L=Layout(8, 2), BLOCK=8)


@fly.kernel
def via_layout(
    x: fly.Tensor, out: fly.Tensor, SRC: fly.constexpr, DST: fly.constexpr, STEP: fly.constexpr
):
    i = fly.program_id(0)
    out.view(DST, i * STEP).store(x.view(SRC, i * STEP).load())


@pytest.mark.parametrize(
    "src",
    [
        make_swizzled_layout(Swizzle(2, 0, 3), Layout((8, 8), (8, 1))),
        make_swizzled_layout(Swizzle(3, 1, 3), Layout((16, 16), (16, 1))),
        Layout((8, 8), (1, 8)),  # a transpose
    ],
)
def test_layout_views_read_through_swizzles(src, n=300):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g)
    out = torch.zeros(n)
    shape = (src[0].size(), src[1].size())
    dst = Layout(shape, (shape[1], 1))
    step = shape[0] * shape[1]
    via_layout[(fly.cdiv(n, step),)](x, out, SRC=src, DST=dst, STEP=step)
    ref = torch.zeros(n)
    for b in range(fly.cdiv(n, step)):
        for m in range(shape[0]):
            for k in range(shape[1]):
                s, d = b * step + src((m, k)), b * step + m * shape[1] + k
                if d < n:
                    ref[d] = x[s] if s < n else 0.0
    assert torch.equal(out, ref)


@fly.kernel
def remap_programs(out: fly.Tensor, L: fly.constexpr):
    pid = fly.program_id(0)
    out[fly.ds(pid, 1)].store(L(pid))  # the layout algebra on a traced program id


def test_program_id_remap_through_a_layout():
    # The XCD-style remap: neighbouring ids go to different groups, as layout (8, n/8):(n/8, 1).
    n = 64
    L = Layout((8, n // 8), (n // 8, 1))
    out = torch.empty(n, dtype=torch.int32)
    remap_programs[(n,)](out, L=L)
    assert out.tolist() == [L(i) for i in range(n)]
    assert sorted(out.tolist()) == list(range(n))


def test_zipped_divide_describes_the_same_tiles_as_view_tiling():
    # The tile (BM, BN) at (i, j) of a (M, N) row-major tensor is zipped_divide's ((BM,BN),(i,j)).
    M, N, BM, BN = 8, 12, 4, 3
    A = Layout((M, N), (N, 1))
    Z = zipped_divide(A, (BM, BN))
    x = torch.arange(M * N, dtype=torch.float32).reshape(M, N)

    @fly.kernel
    def one_tile(x: fly.Tensor, out: fly.Tensor, I: fly.constexpr, J: fly.constexpr):
        out.tile((BM, BN), (0, 0)).store(x.tile((BM, BN), (I, J)).load())

    for i in range(M // BM):
        for j in range(N // BN):
            out = torch.empty(BM, BN)
            one_tile[(1,)](x, out, I=i, J=j)
            want = torch.tensor(
                [[float(Z(((a, b), (i, j)))) for b in range(BN)] for a in range(BM)]
            )
            assert torch.equal(out, want)
