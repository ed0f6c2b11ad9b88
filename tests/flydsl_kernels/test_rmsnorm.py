"""RMSNorm family on the CPU: every kernel on cpu-reference and through Triton's interpreter.

References: ``aten::_fused_rms_norm`` (CPU) for the forward, torch.autograd of
``torch.nn.functional.rms_norm`` in fp64 for the backward, and transformers'
LlamaRMSNorm / GemmaRMSNorm formulas written out below for the fused variants.
Inputs are fresh random data (seeded per test), never zeros.

Tolerances (rtol, atol), stated: fp32 1e-5 / 1e-5 (sums in another order);
bf16 1e-2 / 1e-2 and fp16 2e-3 / 2e-3 (one rounding of a value that agrees
to fp32 precision: about one ulp of the output). The transformers-formula
variants are compared exactly: bf16/fp16 outputs equal, or one ulp apart
where the two fp32 sums of squares differ in their last bit and the
normalized value sits on a rounding boundary (at most 1% of elements here).
The reference backend runs one program per Python loop iteration and the
interpreter is slower still, so grids stay small (M <= 8 for long rows).
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from flydsl_kernels.rmsnorm import (
    FAMILY,
    configs,
    fused_add_rms_norm,
    reference,
    rms_norm,
    rms_norm_backward,
)
from flydsl_kernels.rmsnorm.configs import Config

pytestmark = pytest.mark.cpu

TARGETS = ["cpu-reference", "cpu-interpret"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}


def gen(*key) -> torch.Generator:
    # crc32, not hash(): str hashes are salted per process, and seeds must repeat run to run
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, dtype, g, scale=2.0):
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def close(out, ref, dtype, tol=None):
    rtol, atol = tol or TOL[dtype]
    torch.testing.assert_close(out.double(), ref.double(), rtol=rtol, atol=atol, equal_nan=True)


def ulps_apart(a, b):
    """Elementwise distance in ulps of two same-dtype 16-bit float tensors (finite, same sign)."""
    ia = a.view(torch.int16).to(torch.int32)
    ib = b.view(torch.int16).to(torch.int32)
    return (ia - ib).abs()


# -- forward ------------------------------------------------------------------------------------------

# Rows of every kind: N = 1, primes, 2^k + 1, N % 8 == 0 but % 16 != 0, and multi-dim leading shapes.
SHAPES = [(1, 1), (5, 7), (2, 3, 17), (3, 129), (9, 1000), (1, 2053), (2, 4104)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("has_w", [False, True], ids=["no_w", "w"])
def test_forward_shipped_configs(target, dtype, shape, has_w):
    g = gen("fwd", shape, dtype, has_w)
    x = randn(shape, dtype, g)
    w = randn(shape[-1:], dtype, g, 1.0) if has_w else None
    y, r = rms_norm(x, shape[-1:], w, 1e-6, target=target)
    yr, rr = reference.rms_norm(x, shape[-1:], w, 1e-6)
    assert y.dtype == yr.dtype and y.shape == yr.shape and y.is_contiguous()
    assert r.dtype == torch.float32 and r.shape == rr.shape
    close(y, yr, dtype)
    close(r, rr, torch.float32)


# Each kernel forced at small sizes (including masked tails and N below its block).
FORCED = [
    (Config("fwd_rows", 128, 4, 1), (7, 100)),
    (Config("fwd_rows", 8, 8, 1), (13, 5)),
    (Config("fwd_rows", 1024, 2, 2), (5, 1024)),
    (Config("fwd_row", 256, 1, 2), (3, 129)),
    (Config("fwd_row", 512, 1, 4), (2, 512)),
    (Config("fwd_looped", 64, 1, 2), (3, 1000)),  # 15 full blocks + a masked tail
    (Config("fwd_looped", 128, 1, 2), (2, 1024)),  # full blocks only
    (Config("fwd_looped", 256, 1, 2), (2, 97)),  # the tail only
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "cfg,shape",
    FORCED,
    ids=lambda v: str(v) if isinstance(v, tuple) else f"{v.kernel}{v.BLOCK}x{v.R}",
)
def test_forward_each_kernel(target, dtype, cfg, shape):
    g = gen("forced", cfg, shape, dtype)
    x = randn(shape, dtype, g)
    w = randn(shape[-1:], dtype, g, 1.0)
    y, r = rms_norm(x, shape[-1:], w, target=target, config=cfg)  # eps=None
    yr, rr = reference.rms_norm(x, shape[-1:], w, None)
    close(y, yr, dtype)
    close(r, rr, torch.float32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_long_rows_looped(target, dtype):
    # 2^15 + 1 and 262144: past every register-resident limit, so the shipped looped kernel
    n_small, n_big = 32769, 262144
    assert configs.select("fwd", n_small, dtype).kernel == "fwd_looped"
    for m, n in ((2, n_small), (1, n_big)) if target == "cpu-reference" else ((1, n_small),):
        g = gen("long", n, dtype)
        x, w = randn((m, n), dtype, g), randn((n,), dtype, g, 1.0)
        y, r = rms_norm(x, (n,), w, 1e-5, target=target)
        yr, rr = reference.rms_norm(x, (n,), w, 1e-5)
        close(y, yr, dtype)
        close(r, rr, torch.float32)


@pytest.mark.parametrize("target", TARGETS)
def test_forward_empty_and_degenerate(target):
    for shape in ((0, 33), (2, 0, 7)):
        x = torch.randn(shape)
        y, r = rms_norm(x, shape[-1:], torch.randn(shape[-1]), target=target)
        yr, rr = reference.rms_norm(x, shape[-1:], None)
        assert y.shape == yr.shape and r.shape == rr.shape
    # N = 0: ATen's rstd is the NaN of an empty mean
    y, r = rms_norm(torch.randn(3, 0), (0,), target=target)
    _, rr = reference.rms_norm(torch.randn(3, 0), (0,))
    assert y.shape == (3, 0) and r.shape == rr.shape and r.isnan().all() and rr.isnan().all()


# NaN/Inf inputs: numpy (the interpreter) warns on the inf * 0 that these rows are meant to hit
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_magnitudes_and_specials(target, dtype):
    g = gen("special", dtype)
    big = {torch.float32: 1e18, torch.bfloat16: 1e18, torch.float16: 3e3}[dtype]  # fp16 max 65504
    x = randn((6, 40), dtype, g)
    x[0] *= big  # large but squares still finite in fp32
    x[1, 3] = float("nan")  # the whole row becomes NaN
    x[2, 5] = float("inf")  # rstd 0: inf * 0 = NaN there, zeros elsewhere (as torch)
    x[3, 7] = float("-inf")
    x[4] = torch.tensor(1e-20 if dtype != torch.float16 else 1e-7).to(dtype)  # eps dominates
    x[5, :3] = 1e30 if dtype != torch.float16 else 6e4  # fp32 sum of squares overflows
    w = randn((40,), dtype, g, 1.0)
    y, r = rms_norm(x, (40,), w, target=target)
    yr, rr = reference.rms_norm(x, (40,), w)
    close(y, yr, dtype)
    close(r, rr, torch.float32)
    assert y[1].isnan().all() and y[2, 5].isnan() and not y[0].isnan().any()


def test_eps_default_is_the_fp32_epsilon():
    # ATen's default eps is its accumulation type's epsilon (fp32 for bf16/fp16/fp32 inputs),
    # not torch.finfo(x.dtype).eps; with mean(x^2) ~ 1e-7 the difference is large.
    for dtype in DTYPES:
        x = torch.full((2, 16), 3.45e-4).to(dtype) * (1 + torch.rand(2, 16, generator=gen(dtype)))
        x = x.to(dtype)
        y, r = rms_norm(x, (16,))
        yr, rr = reference.rms_norm(x, (16,))
        close(r, rr, torch.float32)
        close(y, yr, dtype)
        wrong = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + torch.finfo(dtype).eps)
        if dtype != torch.float32:
            assert not torch.allclose(r, wrong, rtol=1e-2)


@pytest.mark.parametrize("target", TARGETS)
def test_forward_layouts(target):
    g = gen("layouts")
    # multi-dim normalized_shape: rstd keeps a 1 for each normalized dim
    x, w = randn((4, 3, 20), torch.float32, g), randn((3, 20), torch.float32, g)
    y, r = rms_norm(x, (3, 20), w, target=target)
    yr, rr = reference.rms_norm(x, (3, 20), w)
    assert r.shape == (4, 1, 1)
    close(y, yr, torch.float32)
    close(r, rr, torch.float32)
    # a row stride: a slice of wider rows (bf16, N % 8 == 0 with a row stride of 72)
    xs = randn((6, 72), torch.bfloat16, g)[:, 8:48]
    close(rms_norm(xs, (40,), target=target)[0], reference.rms_norm(xs, (40,))[0], torch.bfloat16)
    # leading dims that collapse to one row stride, and broadcast rows (row stride 0)
    xb = randn((1, 33), torch.float16, g).expand(5, 33)
    close(rms_norm(xb, (33,), target=target)[0], reference.rms_norm(xb, (33,))[0], torch.float16)
    x4 = randn((2, 3, 50), torch.float32, g)[:, :, 5:45]
    close(rms_norm(x4, (40,), target=target)[0], reference.rms_norm(x4, (40,))[0], torch.float32)
    # storage not 16-byte aligned
    xm = randn((5 * 24 + 1,), torch.bfloat16, g)[1:].view(5, 24)
    close(rms_norm(xm, (24,), target=target)[0], reference.rms_norm(xm, (24,))[0], torch.bfloat16)
    # a weight of another float dtype, as ATen allows
    wf = randn((24,), torch.float32, g)
    close(
        rms_norm(xm, (24,), wf, target=target)[0],
        reference.rms_norm(xm, (24,), wf)[0],
        torch.bfloat16,
    )


def test_forward_rejects_what_it_does_not_support():
    with pytest.raises(ValueError, match="inner stride 1"):
        rms_norm(torch.randn(40, 6).t(), (40,))
    with pytest.raises(ValueError, match="inner stride 1"):
        rms_norm(torch.randn(4, 6, 5).transpose(0, 1), (4, 5))  # rows do not collapse
    with pytest.raises(ValueError, match="fp32, bf16 and fp16"):
        rms_norm(torch.randn(3, 4, dtype=torch.float64), (4,))
    with pytest.raises(ValueError, match="suffix"):
        rms_norm(torch.randn(3, 4), (3,))
    with pytest.raises(ValueError, match="weight has shape"):
        rms_norm(torch.randn(3, 4), (4,), torch.randn(5))


# -- backward -----------------------------------------------------------------------------------------

BWD_FORCED = [
    ((Config("bwd_rows", 8, 4, 1),), (13, 7)),  # R rows per tile, masked last tile and columns
    ((Config("bwd_rows", 128, 1, 2),), (6, 100)),
    ((Config("bwd_rows", 1024, 2, 4),), (5, 1024)),
    ((Config("bwd_rowdot", 64, 1, 2), Config("bwd_cols", 128, 1, 2)), (9, 1000)),
    (
        (
            Config("bwd_rowdot", 128, 1, 2),
            Config("bwd_cols", 64, 1, 1),
            Config("dw_reduce", 32, 4, 1),
        ),
        (7, 257),
    ),
]


def _bwd_case(shape, dtype, has_w, key):
    g = gen("bwd", key, shape, dtype, has_w)
    x = randn(shape, dtype, g)
    w = randn(shape[-1:], dtype, g, 1.0) if has_w else None
    gy = randn(shape, dtype, g, 1.0)
    _, r = reference.rms_norm(x, shape[-1:], w, 1e-6)
    dxr, dwr = reference.rms_norm_backward(gy, x, w, 1e-6)
    return x, w, gy, r, dxr, dwr


def _bwd_close(dx, dw, dxr, dwr, dtype, m):
    close(dx, dxr, dtype)
    if dwr is not None:
        # dweight sums m products: fp32 accumulation error grows with m, bf16/fp16 output rounding
        rtol, atol = TOL[dtype]
        close(dw, dwr, dtype, (rtol, atol * max(1.0, math.sqrt(m))))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "cfgs,shape",
    BWD_FORCED,
    ids=lambda v: str(v) if isinstance(v[0], int) else "+".join(f"{c.kernel}{c.BLOCK}" for c in v),
)
def test_backward_each_kernel(target, dtype, cfgs, shape):
    x, w, gy, r, dxr, dwr = _bwd_case(shape, dtype, True, cfgs)
    for det in (True, False):
        dx, dw = rms_norm_backward(gy, x, r, w, deterministic=det, target=target, config=cfgs)
        assert dx.dtype == dtype and dw.dtype == w.dtype and dw.shape == w.shape
        _bwd_close(dx, dw, dxr, dwr, dtype, shape[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 3, 129), (4, 2053)], ids=str)
@pytest.mark.parametrize("has_w", [False, True], ids=["no_w", "w"])
def test_backward_shipped_configs(target, dtype, shape, has_w):
    x, w, gy, r, dxr, dwr = _bwd_case(shape, dtype, has_w, "shipped")
    dx, dw = rms_norm_backward(gy, x, r, w, deterministic=True, target=target)
    m = math.prod(shape[:-1])
    _bwd_close(dx, dw, dxr, dwr, dtype, m)
    assert (dw is None) == (w is None)


def test_backward_long_rows_shipped():
    n = 32769  # 2^15 + 1: the rowdot + cols kernels
    assert configs.select("bwd", n, torch.bfloat16)[0].kernel == "bwd_rowdot"
    x, w, gy, r, dxr, dwr = _bwd_case((3, n), torch.bfloat16, True, "long")
    dx, dw = rms_norm_backward(gy, x, r, w, deterministic=True)
    _bwd_close(dx, dw, dxr, dwr, torch.bfloat16, 3)


@pytest.mark.parametrize("target", TARGETS)
def test_backward_deterministic_is_bitwise_reproducible(target):
    x, w, gy, r, _, _ = _bwd_case((37, 300), torch.float32, True, "det")
    cfgs = (Config("bwd_rows", 512, 2, 2),)
    a = rms_norm_backward(gy, x, r, w, deterministic=True, target=target, config=cfgs)
    b = rms_norm_backward(gy, x, r, w, deterministic=True, target=target, config=cfgs)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    cols = (Config("bwd_rowdot", 128, 1, 2), Config("bwd_cols", 64, 1, 1))
    a = rms_norm_backward(gy, x, r, w, deterministic=True, target=target, config=cols)
    b = rms_norm_backward(gy, x, r, w, deterministic=True, target=target, config=cols)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_backward_output_mask_empty_and_layouts():
    x, w, gy, r, dxr, dwr = _bwd_case((2, 3, 24), torch.float32, True, "mask")
    dx, dw = rms_norm_backward(gy, x, r, w, output_mask=(False, True))
    assert dx is None
    close(dw, dwr, torch.float32)
    dx, dw = rms_norm_backward(gy, x, r, w, output_mask=(True, False))
    assert dw is None
    close(dx, dxr, torch.float32)
    assert rms_norm_backward(gy, x, r, w, output_mask=(False, False)) == (None, None)
    # normalized_shape inferred from rstd (no weight), multi-dim
    x2, _, g2, _, _, _ = _bwd_case((4, 3, 5), torch.float32, False, "nd")
    _, r2 = reference.rms_norm(x2, (3, 5), None, 1e-6)
    dx, dw = rms_norm_backward(g2, x2, r2, None)
    dxr, _ = reference.rms_norm_backward(g2, x2, None, 1e-6, normalized_shape=(3, 5))
    assert dw is None
    close(dx, dxr, torch.float32)
    # empty: zeros, as ATen's decomposition
    e, we = torch.randn(0, 8), torch.randn(8)
    dx, dw = rms_norm_backward(torch.randn(0, 8), e, torch.randn(0, 1), we)
    assert dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8))
    # a strided grad (rows of a wider buffer)
    gs = torch.randn(2, 3, 40)[:, :, 8:32]
    dx, dw = rms_norm_backward(gs, x, r, w)
    dxr, dwr = reference.rms_norm_backward(gs, x, w, 1e-6)
    close(dx, dxr, torch.float32)
    close(dw, dwr, torch.float32)


# -- fused residual add -------------------------------------------------------------------------------


def llama_rmsnorm(hidden_states, weight, eps):
    """transformers.models.llama.modeling_llama.LlamaRMSNorm.forward, written out."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def gemma_rmsnorm(x, weight, eps):
    """transformers.models.gemma.modeling_gemma.GemmaRMSNorm.forward, written out."""
    output = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    output = output * (1.0 + weight.float())
    return output.type_as(x)


FUSED_CFGS = [None, Config("fwd_rows", 64, 4, 1), Config("fwd_looped", 64, 1, 2)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["aten", "llama", "gemma"])
@pytest.mark.parametrize(
    "n,cfg",
    [(13, None), (4104, None), (50, FUSED_CFGS[1]), (1000, FUSED_CFGS[2])],
    ids=["13", "4104", "rows50", "looped1000"],
)
def test_fused_add(target, dtype, mode, n, cfg):
    g = gen("fused", dtype, mode, n)
    shape = (2, 3, n) if n < 1000 else (2, n)
    x, res = randn(shape, dtype, g), randn(shape, dtype, g)
    w = randn((n,), dtype, g, 1.0)
    y, h = fused_add_rms_norm(
        x,
        res,
        w,
        1e-6,
        llama_numerics=mode == "llama",
        gemma=mode == "gemma",
        target=target,
        config=cfg,
    )
    assert torch.equal(h, x + res)  # the new residual is the rounded sum, exactly
    if mode == "aten":
        close(y, reference.rms_norm(x + res, (n,), w, 1e-6)[0], dtype)
        return
    yr = llama_rmsnorm(x + res, w, 1e-6) if mode == "llama" else gemma_rmsnorm(x + res, w, 1e-6)
    assert y.dtype == yr.dtype
    if dtype == torch.float32:
        close(y, yr, dtype)
        return
    d = ulps_apart(y, yr)
    assert int(d.max()) <= 1, "more than one ulp from the transformers formula"
    # rounding ties broken differently by an fp32 rsqrt ulp: rare (<= 1%, or one element of a tiny row)
    assert int((d > 0).sum()) <= max(1, d.numel() // 100)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["llama", "gemma"])
@pytest.mark.parametrize("shape", [(1, 64), (3, 5, 13), (7, 1000)], ids=str)
def test_forward_transformers_numerics(target, dtype, mode, shape):
    """rms_norm without a residual, with LlamaRMSNorm / GemmaRMSNorm numerics (the modules' forwards)."""
    g = gen("fwd-modes", dtype, mode, shape)
    x, w = randn(shape, dtype, g), randn(shape[-1:], dtype, g, 1.0)
    n = shape[-1]
    y, rstd = rms_norm(
        x, (n,), w, 1e-6, llama_numerics=mode == "llama", gemma=mode == "gemma", target=target
    )
    yr = llama_rmsnorm(x, w, 1e-6) if mode == "llama" else gemma_rmsnorm(x, w, 1e-6)
    assert y.dtype == yr.dtype and y.shape == yr.shape
    close(rstd, reference.rms_norm(x, (n,), None, 1e-6)[1], torch.float32, (1e-5, 1e-6))
    if dtype == torch.float32:
        close(y, yr, dtype)
        return
    d = ulps_apart(y, yr)
    assert int(d.max()) <= 1, "more than one ulp from the transformers formula"
    assert int((d > 0).sum()) <= max(1, d.numel() // 100)


def test_forward_transformers_numerics_options():
    g = gen("fwd-modes-opts")
    x, wf = randn((3, 40), torch.bfloat16, g), randn((40,), torch.float32, g)
    y, _ = rms_norm(x, (40,), wf, 1e-5, llama_numerics=True)
    assert y.dtype == torch.float32  # weight * hidden.to(bf16) promotes, as in transformers
    close(y, llama_rmsnorm(x, wf, 1e-5), torch.float32)
    with pytest.raises(ValueError, match="exclusive"):
        rms_norm(x, (40,), None, 1e-5, llama_numerics=True, gemma=True)


def test_fused_add_options():
    g = gen("fused-opts")
    x, res = randn((3, 40), torch.bfloat16, g), randn((3, 40), torch.bfloat16, g)
    wf = randn((40,), torch.float32, g)
    y, _ = fused_add_rms_norm(x, res, wf, 1e-5, llama_numerics=True)
    assert y.dtype == torch.float32  # weight * hidden.to(bf16) promotes, as in transformers
    close(y, llama_rmsnorm(x + res, wf, 1e-5), torch.float32)
    y, _h = fused_add_rms_norm(x, res, None, None)
    close(y, reference.rms_norm(x + res, (40,), None, None)[0], torch.bfloat16)
    with pytest.raises(ValueError, match="exclusive"):
        fused_add_rms_norm(x, res, None, 1e-5, llama_numerics=True, gemma=True)
    with pytest.raises(ValueError, match="must match"):
        fused_add_rms_norm(x, res.float(), None, 1e-5)


# -- the family ---------------------------------------------------------------------------------------


def test_family_cases_check_on_cpu():
    cases = list(FAMILY.cases())
    kernels = {c.kernel for c in cases}
    assert {
        "rmsnorm_fwd_rows",
        "rmsnorm_fwd_row",
        "rmsnorm_fwd_looped",
        "rmsnorm_bwd_rows",
        "rmsnorm_bwd_cols",
    } <= kernels
    for c in cases:
        assert c.family == "rmsnorm" and c.config_for("gfx950")
        assert c.check("cpu") <= 1, (c.kernel, c.shape)
