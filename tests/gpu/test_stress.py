"""Awkward shapes on every family, on the CPU and (marker ``gpu``) on the GPU, with guard
buffers after every output (``call``): M = 1, primes, N one past a power of two, empty groups,
views into large storages (the launcher's 32-bit span fallback), hostile grouped ``offs``.

Tolerances: fp32 outputs 1e-4 relative + 1e-4 absolute against fp32 references of the same
16-bit inputs (summation order only); bf16 outputs 1e-2 / 1e-2 (one rounding); TopK and MX
quantization exact.
"""

from __future__ import annotations

import pytest
import torch

from flydsl_kernels import gemm as G
from flydsl_kernels import mx as MX
from flydsl_kernels import rmsnorm as R
from flydsl_kernels import topk as T
from flydsl_kernels.mx import cases as MX_CASES

BF16, FP32 = torch.bfloat16, torch.float32


def rand(*shape, seed, dtype=BF16, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def close(out, ref, rtol, atol):
    torch.testing.assert_close(out.double(), ref.double(), rtol=rtol, atol=atol)


# -- RMSNorm --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mn", [(1, 4097), (7, 1025), (13, 2053), (1, 129), (3, 65537)])
def test_rmsnorm_awkward(call, device, big, mn):
    m, n = mn
    if device == "cpu" and n > 5000:
        pytest.skip("the reference backend's time: the other shapes cover these kernels")
    m = big(m, m * 97)
    x, w = rand(m, n, seed=m + n), rand(n, seed=n)
    y, rstd = call(R.rms_norm, x, (n,), w, 1e-6)
    ry, rr = R.reference.rms_norm(x, (n,), w, 1e-6)
    close(y, ry, 1e-2, 1e-2)
    close(rstd, rr, 1e-5, 1e-6)
    res = rand(m, n, seed=7)
    y2, r2 = call(R.fused_add_rms_norm, x, res, w, 1e-6)[:2]
    ry2, rr2 = R.reference.fused_add_rms_norm(x, res, w, 1e-6)[:2]
    close(y2, ry2, 1e-2, 1e-2)
    close(r2, rr2, 1e-2, 1e-2)


def test_rmsnorm_backward_awkward(call, big):
    m, n = big(5, 4099), 1031
    x, w, gy = rand(m, n, seed=1), rand(n, seed=2), rand(m, n, seed=3)
    rstd = R.reference.rms_norm(x, (n,), w, 1e-6)[1]
    dx, dw = call(R.rms_norm_backward, gy, x, rstd, w, deterministic=True)
    rdx, rdw = R.reference.rms_norm_backward(gy, x, w, 1e-6)
    close(dx, rdx, 1e-2, 1e-2)
    close(dw, rdw, 1e-2, 1e-2 * max(1.0, m / 64))


# -- TopK and the router --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [FP32, BF16, torch.float16])
@pytest.mark.parametrize("mnk", [(1, 4097, 7), (3, 1031, 16), (2, 8193, 64), (1, 65537, 300)])
def test_topk_awkward_all_kernels(call, device, big, dtype, mnk):
    m, n, k = mnk
    if device == "cpu" and (n > 8193 or (n > 4097 and dtype != FP32)):
        pytest.skip(
            "the reference backend's time: fp32 at N <= 8193 covers these kernels on the CPU"
        )
    m = big(m, m * 64)
    x = rand(m, n, seed=n + k, dtype=dtype)
    x[0, : min(n, 5)] = float("nan")  # NaN ranks highest
    x[-1, 1::3] = x[-1, 0]  # ties
    for det in (True, False):
        v, i = call(T.topk, x, k, deterministic=det)
        tv = torch.topk(x.float(), k).values.to(dtype)
        same = (v == tv) | (v.isnan() & tv.isnan())
        assert bool(same.all()), (mnk, det)
        g = x.gather(-1, i)
        assert bool(((g == v) | (g.isnan() & v.isnan())).all())
        if det:  # ties by index, bitwise reproducible
            ri = T.reference.topk_stable(x, k, -1, True)[1]
            assert torch.equal(i, ri)
            assert torch.equal(call(T.topk, x, k, deterministic=True)[1], i)


@pytest.mark.parametrize("method", ["small", "sort", "radix", "radix_split"])
def test_topk_every_kernel_m1(call, method):
    n, k = 4099, 16 if method == "small" else 100
    x = rand(1, n, seed=3, dtype=FP32)
    v, i = call(T.topk, x, k, method=method, deterministic=True)
    rv, ri = T.reference.topk_stable(x, k, -1, True)
    assert torch.equal(v, rv) and torch.equal(i, ri)


def test_router_awkward(call, big):
    t = big(3, 4099)
    logits = rand(t, 129, seed=5, dtype=FP32)  # experts one past a power of two; no bf16 ties
    w, ids = call(T.moe_router, logits, 8, scoring="softmax", renormalize=True)
    rw, rids = T.reference.qwen3_moe_router(logits, 8, True)
    rw, rids = T.reference.in_kernel_order(rw, rids, logits.float())
    assert torch.equal(ids.long(), rids.long())
    close(w, rw.float(), 1e-5, 1e-6)


# -- GEMM -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mnk", [(1, 4097, 257), (17, 1031, 131), (61, 129, 1025)])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_gemm_awkward_layouts(call, device, mnk, layout):
    m, n, k = mnk
    if device == "cpu":
        n, k = min(n, 67), min(k, 131)
    a = rand(k, m, seed=1).t() if layout[0] == "T" else rand(m, k, seed=1)
    b = rand(n, k, seed=2).t() if layout[1] == "T" else rand(k, n, seed=2)
    out = call(G.gemm, a, b, out_dtype=FP32)
    close(out, G.reference.gemm(a, b, out_dtype=FP32), 1e-4, 1e-4 * k**0.5)


@pytest.mark.parametrize("split_k", [1, 4])
def test_gemm_epilogues_split_k(call, big, split_k):
    m, n, k = big(9, 67), big(37, 4097), big(256, 2048)
    a, b = rand(m, k, seed=1), rand(n, k, seed=2).t()
    bias, c, res = rand(n, seed=3), rand(m, n, seed=4), rand(m, n, seed=5, dtype=FP32)
    kw = dict(bias=bias, alpha=0.5, beta=2.0, c=c, activation="silu", residual=res)
    out = call(G.gemm, a, b, out_dtype=FP32, split_k=split_k, **kw)
    close(out, G.reference.gemm(a, b, out_dtype=FP32, **kw), 1e-4, 1e-3)


def _offs(counts, device="cpu"):
    return torch.tensor(counts).cumsum(0).to(torch.int32)


def test_grouped_empty_groups(call, big):
    e, n, k = 6, big(40, 1031), big(72, 1032)
    counts = [0, big(5, 301), 0, 0, big(3, 1), 0]  # empty groups, first and last among them
    a = rand(sum(counts), k, seed=1)
    w = rand(e, n, k, seed=2).transpose(1, 2)
    offs = _offs(counts)
    out = call(G.grouped_mm, a, w, offs, out_dtype=FP32)
    close(out, G.reference.grouped_mm(a, w, offs, out_dtype=FP32), 1e-4, 1e-3)
    # ragged K with empty groups: zeros for them
    ak, bk = rand(big(7, 129), 40, seed=3), rand(40, big(9, 257), seed=4)
    ok = _offs([0, 16, 0, 24])
    out = call(G.grouped_mm, ak.t().contiguous().t(), bk, ok, out_dtype=FP32)
    close(out, G.reference.grouped_mm(ak, bk, ok, out_dtype=FP32), 1e-4, 1e-3)


def test_grouped_every_form(call, big):
    """``torch._grouped_mm``'s four forms with awkward sizes: 3-D x 3-D (batched), 2-D x 3-D
    (ragged M), 2-D x 2-D (ragged K), 3-D x 2-D (ragged N); bias on the forms that take it."""
    g, m, n, k = 3, big(9, 257), big(33, 1031), big(40, 520)
    a3, b3 = rand(g, m, k, seed=1), rand(g, n, k, seed=2).transpose(1, 2)
    bias = rand(g, n, seed=3)
    out = call(G.grouped_mm, a3, b3, None, bias, out_dtype=FP32)
    close(out, G.reference.grouped_mm(a3, b3, None, bias, out_dtype=FP32), 1e-4, 1e-3)
    a2 = rand(m, k, seed=4)
    offs_k = _offs([8, 0, k - 8])  # ragged K: multiples of 8 (16-byte rows), an empty group
    b2 = rand(k, n, seed=5)
    out = call(G.grouped_mm, a2, b2, offs_k, out_dtype=FP32)
    close(out, G.reference.grouped_mm(a2, b2, offs_k, out_dtype=FP32), 1e-4, 1e-3)
    offs_n = _offs([n - 9, 0, 9])  # ragged N
    a3n, b2n = rand(g, m, k, seed=6), rand(k, n, seed=7)
    out = call(G.grouped_mm, a3n, b2n, offs_n, out_dtype=FP32)
    close(out, G.reference.grouped_mm(a3n, b2n, offs_n, out_dtype=FP32), 1e-4, 1e-3)


HOSTILE = {
    "decreasing": [8, 4, 12],
    "past the rows": [4, 8, 1 << 20],
    "negative": [-4, 4, 8],
    "all empty": [0, 0, 0],
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_grouped_hostile_offs_never_write_out_of_bounds(call, name):
    """Bad ``offs`` is an error or a result; never an out-of-bounds write (``call`` checks the
    guard buffers after every output) and never a crash."""
    a, w = rand(12, 32, seed=1), rand(3, 24, 32, seed=2).transpose(1, 2)
    offs = torch.tensor(HOSTILE[name], dtype=torch.int32)
    try:
        out = call(G.grouped_mm, a, w, offs, out_dtype=FP32)
    except (ValueError, RuntimeError, IndexError) as e:
        assert str(e), "an error must say what is wrong"
        return
    assert out.shape == (12, 24)
    offs_l = HOSTILE[name]
    if name == "all empty" or offs_l != sorted(offs_l):
        return  # overlapping groups: any of them may own a row
    lo = 0
    for g, hi in enumerate(HOSTILE[name]):  # the groups of a well-formed prefix must be right
        if not 0 <= lo <= hi <= 12:
            break
        close(out[lo:hi], a[lo:hi].double() @ w[g].double(), 1e-4, 1e-3)
        lo = hi


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda"])
def test_views_into_large_storage_take_the_span_fallback(call):
    """Views near the end of a > 2 GiB storage: the launcher's 32-bit-offset (buffer load)
    specialization must not serve them (``over_2gb`` fallback compile). GPU only: 2.1 GiB."""
    n = 4096
    store = torch.empty((1 << 31) // 2 + 8 * n, dtype=BF16, device="cuda")
    x = store[-3 * n :].view(3, n).normal_()
    w = torch.randn(n, device="cuda").to(BF16)
    y, _ = call(R.rms_norm, x, (n,), w, 1e-6)
    close(y, R.reference.rms_norm(x.cpu(), (n,), w.cpu(), 1e-6)[0], 1e-2, 1e-2)
    v, i = call(T.topk, x, 8)  # bf16 rows straight from the big storage
    assert torch.equal(v, torch.topk(x.cpu(), 8).values)
    assert torch.equal(x.cpu().gather(-1, i), v)
    b = store[-2 * n - 64 * n : -2 * n].view(64, n).normal_()
    out = call(G.gemm, x, b.t(), out_dtype=FP32)
    close(out, G.reference.gemm(x.cpu(), b.t().cpu(), out_dtype=FP32), 1e-4, 1e-2)


# -- MX -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("elem", ["e4m3", "e5m2", "e2m1"])
def test_mx_quantize_bit_exact_against_the_cpu(call, device, big, elem):
    """The device's bits equal the CPU reference backend's (and reference.py's), specials too."""
    m, k = big(3, 1031), 32 * big(9, 129)
    x = rand(m, k, seed=11, dtype=FP32, scale=8.0)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40])
    x[1 % m, 32:64] = 0.0  # a zero block
    dt = MX_CASES._TORCH[elem]
    q, s = call(MX.to_mx, x, dt)
    rq, rs = MX.reference.to_mx(x, dt)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), rs.view(torch.uint8))
    for out_dtype in (FP32, BF16):
        got = call(MX.from_mx, q, s, dt, out_dtype=out_dtype)
        want = MX.reference.from_mx(rq, rs, dt, out_dtype=out_dtype)
        assert not MX.reference.mismatches(got, want).any()


@pytest.mark.parametrize("fmt", [("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1")])
def test_mx_gemms_awkward(call, big, fmt):
    fa, fb = fmt
    m, n, k = big(1, 33), big(37, 4097), 32 * big(5, 65)
    ops = MX_CASES._mx_operands((m, k), (n, k), fa, fb, "cpu", 5)
    got = call(MX.mx_gemm, *ops, fa, fb, out_dtype=FP32)
    want = MX.reference.mx_gemm(*ops, fa, fb, out_dtype=FP32)
    close(got, want, 1e-4, 1e-3)
    e = 5
    counts = [0, big(3, 200), 0, big(2, 1), big(1, 60)]  # empty groups
    gops = MX_CASES._mx_operands((sum(counts), k), (e, n, k), fa, fb, "cpu", 6)
    offs = _offs(counts)
    got = call(MX.mx_grouped_mm, *gops, fa, fb, offs, out_dtype=FP32)
    want = MX.reference.mx_grouped_mm(*gops, fa, fb, offs, out_dtype=FP32)
    close(got, want, 1e-4, 1e-3)
