"""Eager overrides of the GEMM ops on the CPU test backend: ``torch._grouped_mm`` (the MoE path
transformers takes in eager mode) and MX ``torch._scaled_mm`` / ``F.scaled_mm`` /
``F.scaled_grouped_mm``.

References: ATen itself where it computes the op on the CPU (``_grouped_mm``), else the MX
spec reference (``flydsl_kernels.mx.reference``: float64 dequantization, then a matmul).
Fresh random data; awkward sizes (ragged and empty groups, M = 1, N and K off the tiles).
Tolerances: bf16 outputs 1e-2 relative + 1e-2 absolute (FlyDSL rounds the fp32 sum once,
ATen per group / per op); fp32 outputs 1e-4 against the float64-based MX reference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_flydsl
from torch_flydsl.ops import scaled_mm as smm

pytestmark = pytest.mark.cpu

BF16 = torch.bfloat16
E4M3, E5M2, E2M1 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2
BLK = F.ScalingType.BlockWise1x32
NO, SW = F.SwizzleType.NO_SWIZZLE, F.SwizzleType.SWIZZLE_32_4_4


@pytest.fixture
def gemm_backend(cpu_backend):
    torch_flydsl.disable()
    torch_flydsl.enable(ops=["grouped_mm", "scaled_mm", "scaled_grouped_mm"], device="cpu")
    torch_flydsl.reset_stats()
    return cpu_backend


def _s(op):
    return torch_flydsl.stats().get(op, {"calls": 0, "hits": 0, "fallbacks": {}})


def _close(out, ref, tol=1e-2):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


def _offs(sizes):
    return torch.tensor(sizes).cumsum(0).to(torch.int32)


def _aten(fn):
    with torch_flydsl.disabled():
        return fn()


# -- torch._grouped_mm ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form",
    ["2d-3d", "3d-3d", "2d-2d", "3d-2d"],
)
def test_grouped_mm_forms_match_aten(gemm_backend, form):
    g = torch.Generator().manual_seed(3)

    def r(*s):
        return torch.randn(*s, generator=g).to(BF16)

    if form == "2d-3d":  # MoE forward: ragged tokens per expert, some experts empty
        offs = _offs([3, 0, 1, 12, 0])
        args = (r(16, 40), r(5, 24, 40).transpose(1, 2), offs)
    elif form == "3d-3d":
        args = (r(3, 9, 40), r(3, 40, 24))
    elif form == "2d-2d":  # weight gradient: ragged K
        offs = _offs([5, 0, 11])
        args = (r(16, 24).t(), r(16, 40), offs)
    else:
        offs = _offs([8, 0, 16])
        args = (r(3, 7, 40), r(24, 40).t(), offs)
    out = torch._grouped_mm(*args)
    _close(out, _aten(lambda: torch._grouped_mm(*args)))
    assert _s("_grouped_mm") == {"calls": 1, "hits": 1, "fallbacks": {}}


def test_grouped_mm_fallbacks_and_aten_errors(gemm_backend):
    x, w, offs = torch.randn(8, 16), torch.randn(2, 16, 8), _offs([3, 5])
    out = torch._grouped_mm(x, w, offs)  # fp32: FlyDSL takes bf16 / fp16
    assert torch.equal(out, _aten(lambda: torch._grouped_mm(x, w, offs)))
    assert _s("_grouped_mm")["fallbacks"] == {"dtype": 1}
    xb, wb = x.to(BF16), w.to(BF16)
    for bad in (
        lambda: torch._grouped_mm(xb, wb),  # 2-D x 3-D without offs
        lambda: torch._grouped_mm(xb, wb, offs, bias=torch.zeros(2, 8, dtype=BF16)),
        lambda: torch._grouped_mm(xb, wb, offs.long()),
    ):
        with pytest.raises(Exception) as ours:
            bad()
        with torch_flydsl.disabled(), pytest.raises(Exception) as theirs:
            bad()
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert _s("_grouped_mm")["hits"] == 0 and _s("_grouped_mm")["fallbacks"]["params"] == 3


def test_moe_layer_eager(gemm_backend):
    """A top-1 MoE layer (tokens sorted by expert, two torch._grouped_mm): FlyDSL runs both."""
    from .test_compile_cpu import MoE

    torch.manual_seed(5)
    moe = MoE(32, 48, experts=4).to(BF16)
    x = torch.randn(19, 32).to(BF16)
    out = moe(x)
    _close(out, _aten(lambda: moe(x)), tol=2e-2)
    assert _s("_grouped_mm")["hits"] == 2


# -- MX _scaled_mm ---------------------------------------------------------------------------------


def _mx(rows, k, fmt, seed):
    from flydsl_kernels.mx import to_mx

    g = torch.Generator().manual_seed(seed)
    return to_mx(torch.randn(rows, k, generator=g) * 3, fmt)


def _ref(aq, sa, wq, sw, fa, fb, out=BF16, bias=None):
    from flydsl_kernels.mx import reference

    r = reference.from_mx(aq, sa, fa).double() @ reference.from_mx(wq, sw, fb).double().T
    if bias is not None:
        r = r + bias.double()
    return r.to(out)


def test_unswizzle_inverts_the_cublas_layout():
    from flydsl_kernels.mx.baseline import cublas_blocked_scales

    for rows, kb in ((1, 1), (7, 5), (128, 4), (130, 9)):
        s = torch.randint(0, 255, (rows, kb), dtype=torch.uint8)
        blocked = cublas_blocked_scales(s).view(torch.uint8)
        assert blocked.numel() == smm.swizzled_numel(rows, kb)
        assert torch.equal(smm.unswizzle_32_4_4(blocked, rows, kb), s)


@pytest.mark.parametrize("fmts", [(E4M3, E4M3), (E5M2, E5M2), (E2M1, E2M1), (E4M3, E2M1)])
def test_scaled_mm_v2_mx(gemm_backend, fmts):
    fa, fb = fmts
    m, n, k = 7, 40, 96
    aq, sa = _mx(m, k, fa, 1)
    wq, sw = _mx(n, k, fb, 2)
    bias = torch.randn(n)
    out = F.scaled_mm(aq, wq.t(), sa, BLK, sw, BLK, NO, NO, bias=bias, output_dtype=torch.float32)
    _close(out, _ref(aq, sa, wq, sw, fa, fb, torch.float32, bias), tol=1e-4)
    assert _s("_scaled_mm_v2") == {"calls": 1, "hits": 1, "fallbacks": {}}


def test_scaled_mm_v1_and_swizzled_v2(gemm_backend):
    """v1 takes the device library's layout: SWIZZLE_32_4_4 on CUDA builds (and their CPU),
    row-major on ROCm; v2 with an explicit SWIZZLE_32_4_4 is unswizzled the same way."""
    from flydsl_kernels.mx.baseline import cublas_blocked_scales

    m, n, k = 128, 48, 128  # sizes where the v1 meta check's padded numel holds
    aq, sa = _mx(m, k, E4M3, 3)
    wq, sw = _mx(n, k, E4M3, 4)
    ref = _ref(aq, sa, wq, sw, E4M3, E4M3)
    bsa, bsw = cublas_blocked_scales(sa), cublas_blocked_scales(sw)
    out = F.scaled_mm(aq, wq.t(), bsa, BLK, bsw, BLK, SW, SW, output_dtype=BF16)
    _close(out, ref)
    if smm.v1_swizzled():
        out1 = torch._scaled_mm(aq, wq.t(), bsa, bsw, out_dtype=BF16)
        _close(out1, ref)
        assert _s("_scaled_mm")["hits"] == 1
    assert _s("_scaled_mm_v2")["hits"] == 1


def test_scaled_mm_non_mx_stays_aten(gemm_backend):
    a, b = torch.randn(16, 32).to(E4M3), torch.randn(16, 32).to(E4M3)
    one = torch.tensor(1.0)
    out = torch._scaled_mm(a, b.t(), one, one, out_dtype=BF16)  # tensorwise fp8
    assert torch.equal(out, _aten(lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=BF16)))
    assert _s("_scaled_mm")["fallbacks"] == {"dtype": 1}
    aq, sa = _mx(9, 64, E4M3, 5)
    wq, sw = _mx(16, 64, E4M3, 6)
    with pytest.raises(Exception) as ours:  # an fp8 output: ATen's (and its error on the CPU)
        F.scaled_mm(aq, wq.t(), sa, BLK, sw, BLK, NO, NO, output_dtype=E4M3)
    with torch_flydsl.disabled(), pytest.raises(Exception) as theirs:
        F.scaled_mm(aq, wq.t(), sa, BLK, sw, BLK, NO, NO, output_dtype=E4M3)
    assert str(ours.value) == str(theirs.value)
    assert _s("_scaled_mm_v2")["fallbacks"] == {"dtype": 1}


def test_scaled_grouped_mm_v2_mx(gemm_backend):
    from flydsl_kernels.mx import to_mx

    offs = _offs([5, 0, 9])
    aq, sa = _mx(14, 64, E4M3, 7)
    w = torch.randn(3, 24, 64)
    wq, sw = to_mx(w, E4M3)  # (G, N, K): the weight's transpose is (G, K, N) column-major
    out = F.scaled_grouped_mm(
        aq, wq.transpose(1, 2), sa, BLK, sw, BLK, NO, NO, offs=offs, output_dtype=torch.float32
    )
    ref = torch.zeros(14, 24, dtype=torch.float64)
    for g, (s, e) in enumerate(zip([0, 5, 5], [5, 5, 14])):
        ref[s:e] = _ref(aq[s:e], sa[s:e], wq[g], sw[g], E4M3, E4M3, torch.float64)
    _close(out, ref.float(), tol=1e-4)
    assert _s("_scaled_grouped_mm_v2") == {"calls": 1, "hits": 1, "fallbacks": {}}
