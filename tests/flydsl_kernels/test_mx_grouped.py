"""The MX grouped GEMM (MoE forward) on the CPU targets, against the dequantize-then-matmul reference.

Tolerance: the kernel sums exactly the dequantized products in fp32 (MX
elements times power-of-two scales are exact in fp32), so it differs from the
fp32 reference only by the order of the fp32 additions: fp32 outputs are
compared with rtol 1e-6 and atol 4e-6 times the largest output, bf16 / fp16
outputs with one rounding (2^-8 / 2^-11 relative) on top (``assert_gemm_close``).
Shapes stay small: the reference backend runs programs one after another.
"""

from __future__ import annotations

import pytest
import torch

from flydsl_kernels.mx import mx_grouped_mm, reference, to_mx
from flydsl_kernels.mx.configs import GemmConfig

TARGETS = ("cpu-reference", "cpu-interpret")
FP8 = torch.float8_e4m3fn
_TORCH = {"e4m3": FP8, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}
#: mxfp8 x mxfp8 (both fp8 kinds), mxfp4 x mxfp4, a8w4
FORMATS = (("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1"))
#: a small tile, so that a few rows already span several tiles and programs
SMALL = GemmConfig(BM=16, BN=16, BK=64)


def assert_gemm_close(got, want):
    """fp32: the order of the fp32 sums (rtol 1e-6, atol 4e-6 of the largest output); bf16 /
    fp16: one output rounding on top."""
    scale = float(want.float().abs().max()) or 1.0
    eps = {torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-11}[got.dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=eps, atol=4 * eps * scale)


def offsets(sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)


def operands(m, n, k, groups, fa, fb, seed, batched=False, device="cpu"):
    """Fresh random MX operands: a ``(m, k)`` (``(groups, m, k)`` if batched), b ``(groups, n, k)``,
    blocks at different scales; and a ``(groups, n)`` bias."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*((groups,) if batched else ()), m, k, generator=g)
    w = torch.randn(groups, n, k, generator=g) * 0.1
    a[..., : min(k, 32)] *= 8.0
    w[..., -32:] *= 0.25
    bias = torch.randn(groups, n, generator=g).to(device)
    a, w = a.to(device), w.to(device)
    return (*to_mx(a, _TORCH[fa]), *to_mx(w, _TORCH[fb])), bias


def test_reference_matches_torch_grouped_mm_on_dequantized_inputs():
    """The reference is torch._grouped_mm on the dequantized operands (fp32 on the CPU)."""
    offs = offsets([5, 0, 1, 11])
    ops, _ = operands(17, 24, 96, 4, "e4m3", "e4m3", seed=3)
    a = reference.from_mx(ops[0], ops[1], "e4m3")
    b = reference.from_mx(ops[2], ops[3], "e4m3")
    want = torch._grouped_mm(a, b.transpose(1, 2), offs)
    got = reference.mx_grouped_mm(*ops, "e4m3", "e4m3", offs, out_dtype=torch.float32)
    assert_gemm_close(got, want)
    ops, _ = operands(6, 24, 64, 3, "e4m3", "e4m3", seed=4, batched=True)
    a = reference.from_mx(ops[0], ops[1], "e4m3")
    b = reference.from_mx(ops[2], ops[3], "e4m3")
    want = torch._grouped_mm(a, b.transpose(1, 2))
    assert_gemm_close(reference.mx_grouped_mm(*ops, "e4m3", "e4m3", out_dtype=torch.float32), want)


RAGGED = [
    # sizes, N, K, config: primes, M = 1 groups, empty groups (first, middle, last)
    ([3, 0, 1, 17, 0], 20, 96, SMALL),  # K = 96: a 32-element K tail of the 64 tile
    ([0, 1, 5], 7, 160, None),  # shipped tile (BK 256 masks K), M = 1, N < BN
    ([33], 18, 64, SMALL),  # G = 1, a group over three row tiles
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa, fb", FORMATS)
@pytest.mark.parametrize("sizes, n, k, cfg", RAGGED, ids=("5groups", "3groups", "G1"))
def test_ragged_m_matches_reference(sizes, n, k, cfg, fa, fb, target):
    offs = offsets(sizes)
    m, groups = int(offs[-1]), len(sizes)
    ops, bias = operands(m, n, k, groups, fa, fb, seed=m + n + k)
    for out_dtype, b in ((torch.float32, None), (torch.bfloat16, bias)):
        got = mx_grouped_mm(
            *ops, fa, fb, offs, bias=b, out_dtype=out_dtype, target=target, config=cfg
        )
        want = reference.mx_grouped_mm(*ops, fa, fb, offs, bias=b, out_dtype=out_dtype)
        assert got.shape == (m, n) and got.dtype == out_dtype
        assert_gemm_close(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa, fb", FORMATS[::2])
def test_batched_3d_3d_matches_reference(fa, fb, target):
    ops, bias = operands(19, 21, 96, 3, fa, fb, seed=11, batched=True)
    got = mx_grouped_mm(
        *ops, fa, fb, bias=bias, out_dtype=torch.float32, target=target, config=SMALL
    )
    want = reference.mx_grouped_mm(*ops, fa, fb, bias=bias, out_dtype=torch.float32)
    assert got.shape == (3, 19, 21)
    assert_gemm_close(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa, fb", FORMATS[::2])
def test_ragged_k_matches_reference(fa, fb, target):
    """2-D x 2-D (weight gradient): groups split K at multiples of 32, empty ones give zeros;
    the 64 tile straddles group boundaries, so the K mask at each group's end is exercised."""
    offs = offsets([32, 0, 96, 32, 0])
    g = torch.Generator().manual_seed(13)
    x = torch.randn(11, int(offs[-1]), generator=g)  # (M, K): e.g. activations^T
    dy = torch.randn(9, int(offs[-1]), generator=g)  # (N, K): gradients^T
    ops = (*to_mx(x, _TORCH[fa]), *to_mx(dy, _TORCH[fb]))
    got = mx_grouped_mm(*ops, fa, fb, offs, out_dtype=torch.float32, target=target, config=SMALL)
    want = reference.mx_grouped_mm(*ops, fa, fb, offs, out_dtype=torch.float32)
    assert got.shape == (5, 11, 9)
    assert_gemm_close(got, want)
    assert not got[1].any() and not got[4].any()
    a = reference.from_mx(*ops[:2], fa)
    b = reference.from_mx(*ops[2:], fb)
    assert_gemm_close(want, torch._grouped_mm(a, b.T, offs))  # the reference is torch's


@pytest.mark.parametrize("target", TARGETS)
def test_all_groups_empty_and_no_rows(target):
    ops, _ = operands(0, 16, 64, 3, "e4m3", "e4m3", seed=1)
    out = mx_grouped_mm(*ops, "e4m3", "e4m3", offsets([0, 0, 0]), target=target)
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16
    # rows exist but every group is empty except the last: the others own no tiles
    ops, _ = operands(4, 16, 64, 3, "e4m3", "e4m3", seed=2)
    offs = offsets([0, 0, 4])
    got = mx_grouped_mm(*ops, "e4m3", "e4m3", offs, out_dtype=torch.float32, target=target)
    assert_gemm_close(
        got, reference.mx_grouped_mm(*ops, "e4m3", "e4m3", offs, out_dtype=torch.float32)
    )


def test_fp16_out_uint8_storage_and_k_zero():
    offs = offsets([2, 3])
    ops, bias = operands(5, 8, 64, 2, "e4m3", "e2m1", seed=6)
    raw = [t.view(torch.uint8) for t in ops]  # uint8 tensors holding the same bytes are accepted
    got = mx_grouped_mm(*raw, "e4m3", "e2m1", offs, bias=bias.half(), out_dtype=torch.float16)
    want = reference.mx_grouped_mm(*ops, "e4m3", "e2m1", offs, bias=bias, out_dtype=torch.float16)
    assert_gemm_close(got, want)
    a0, s0 = torch.empty(5, 0, dtype=FP8), torch.empty(5, 0, dtype=torch.float8_e8m0fnu)
    w0, t0 = torch.empty(2, 8, 0, dtype=FP8), torch.empty(2, 8, 0, dtype=torch.float8_e8m0fnu)
    got = mx_grouped_mm(a0, s0, w0, t0, "e4m3", "e4m3", offs, bias=bias, out_dtype=torch.float32)
    torch.testing.assert_close(got, bias[[0, 0, 1, 1, 1]])


def test_rejects_what_it_does_not_support():
    offs = offsets([2, 3])
    (aq, sa, bq, sb), bias = operands(5, 8, 64, 2, "e4m3", "e4m3", seed=7)
    kq, ks = to_mx(torch.randn(5, 64), FP8)  # ragged K: 2-D x 2-D
    with pytest.raises(
        ValueError, match=r"ragged K .* multiple of the MX block 32.*offs\[1\] = 34"
    ):
        mx_grouped_mm(kq, ks, kq, ks, "e4m3", "e4m3", offsets([32, 2]))
    with pytest.raises(ValueError, match="bias is for the 2-D x 3-D and 3-D x 3-D forms"):
        mx_grouped_mm(kq, ks, kq, ks, "e4m3", "e4m3", offsets([32, 32]), bias=bias)
    with pytest.raises(ValueError, match="needs offs"):
        mx_grouped_mm(aq, sa, bq, sb, "e4m3", "e4m3")
    with pytest.raises(TypeError, match=r"offs must be a 1-D int32 tensor, got torch\.int64"):
        mx_grouped_mm(aq, sa, bq, sb, "e4m3", "e4m3", offs.long())
    with pytest.raises(ValueError, match="operands have 2 groups but offs has 3"):
        mx_grouped_mm(aq, sa, bq, sb, "e4m3", "e4m3", offsets([1, 2, 2]))
    with pytest.raises(ValueError, match="takes no offs"):
        mx_grouped_mm(
            aq[None].expand(2, 5, 64), sa[None].expand(2, 5, 2), bq, sb, "e4m3", "e4m3", offs
        )
    with pytest.raises(ValueError, match="a_q has 1 groups, b_q 2"):
        mx_grouped_mm(aq[None], sa[None], bq, sb, "e4m3", "e4m3")
    with pytest.raises(ValueError, match="a holds K=64 elements per row, b K=32"):
        mx_grouped_mm(aq, sa, bq[..., :32], sb[..., :1], "e4m3", "e4m3", offs)
    with pytest.raises(ValueError, match="multiple of the MX block 32"):
        mx_grouped_mm(aq[:, :48], sa, bq[..., :48], sb, "e4m3", "e4m3", offs)
    with pytest.raises(ValueError, match="scales must be"):
        mx_grouped_mm(aq, sa[:, :1], bq, sb, "e4m3", "e4m3", offs)
    with pytest.raises(ValueError, match="bias must be a float"):
        mx_grouped_mm(aq, sa, bq, sb, "e4m3", "e4m3", offs, bias=bias[0])
    with pytest.raises(ValueError, match="out_dtype must be"):
        mx_grouped_mm(aq, sa, bq, sb, "e4m3", "e4m3", offs, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="e2m1 elements must be"):
        mx_grouped_mm(aq, sa, bq, sb, "e4m3", "e2m1", offs)
    with pytest.raises(ValueError, match="unsupported MX element format"):
        mx_grouped_mm(aq, sa, bq, sb, "e4m3", "int8", offs)
    with pytest.raises(ValueError, match="takes 2-D x 3-D"):
        mx_grouped_mm(aq, sa, bq[0, 0], sb[0, 0], "e4m3", "e4m3", offs)


def test_family_grouped_checks_pass_on_cpu():
    from flydsl_kernels.mx import FAMILY

    cases = [c for c in FAMILY.cases() if c.kernel == "mx_grouped_gemm_nt"]
    assert any("mxfp4 x mxfp4" in c.shape for c in cases) and len(cases) == 5
    # each check runs its case's shipped config: mxfp8 decode tile, mxfp8 down and a8w4 large tile
    for c in cases[::2]:
        assert c.check("cpu") <= 1.0, c.shape
    assert cases[0].check("cpu-interpret") <= 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("fa, fb", FORMATS)
def test_ragged_m_on_gpu_with_the_shipped_configs(fa, fb):
    """On a GPU (skipped without one): every shipped tile class against the reference."""
    g = torch.Generator().manual_seed(21)
    for rows, experts in ((40, 16), (3000, 8)):  # decode-like and large-tile rows per expert
        counts = torch.bincount(torch.randint(0, experts, (rows,), generator=g), minlength=experts)
        offs = counts.cumsum(0).to(torch.int32)
        ops, bias = operands(rows, 200, 544, experts, fa, fb, seed=rows, device="cuda")
        got = mx_grouped_mm(*ops, fa, fb, offs.cuda(), bias=bias)
        want = reference.mx_grouped_mm(*(t.cpu() for t in ops), fa, fb, offs, bias=bias.cpu())
        assert_gemm_close(got.cpu(), want)
