"""Attention family on the CPU: forward, backward, varlen, paged decode, mods, schedules.

References: ``reference.attention`` (float64, flash-attn's conventions; its gradients by
autograd in float64), itself checked against ``F.scaled_dot_product_attention`` on the math
backend in float64 (``reference.sdpa``) for everything SDPA can express. Fresh seeded random
data per test; the kernels run on ``cpu-reference`` and, for a subset (the interpreter is about
20x slower), on ``cpu-interpret``.

Tolerances, stated: outputs (bf16) ``atol = rtol = 1e-2`` (one bf16 rounding of the output,
plus P rounded to bf16 before P @ V, as flash-attn does); fp16 ``2e-3``; LSE (fp32) ``atol
1e-4``; gradients (bf16) ``atol = rtol = 2e-2`` (P and dS are rounded to bf16 before their
matmuls), fp16 ``5e-3``; fp32 ``1e-5`` (IEEE fp32 products). Deterministic mode is checked bitwise. Small tiles (16 x 16) are used
where a test needs windows and masks to cut through several tiles at small sizes.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from flydsl_kernels.attention import (
    FAMILY,
    BlockSparse,
    MaskMod,
    ScoreMod,
    configs,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    mods,
    plan,
    reference,
)
from flydsl_kernels.attention import api as attn_api

pytestmark = pytest.mark.cpu

REF, INTERP = "cpu-reference", "cpu-interpret"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
OUT_TOL = {BF16: 1e-2, FP16: 2e-3, FP32: 1e-5}
GRAD_TOL = {BF16: 2e-2, FP16: 5e-3, FP32: 1e-5}
C16 = configs.Config(16, 16, 4)
SMALL = {"fwd": C16, "bwd_dkdv": C16, "bwd_dq": C16}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rand(*shape, g, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


#: a problem with fp32 operands (``plan.Problem.dtype``)
F32 = {"dtype": "fp32"}


def close(out, ref, tol, what=""):
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=tol, msg=what)


@pytest.mark.parametrize(
    "table, d, dv, window, terms, kind, want",
    [
        # configs.WINDOW_TILES: gfx950 d192's 1-warp level takes the 2-warp tile at 32 keys
        # (a 16-key window narrower than it: every trip masked)
        ("gfx950", 192, 128, (15, 0), {}, "fwd", {"BM": 64, "BN": 32, "num_warps": 2}),
        ("gfx950", 128, 128, (127, 0), {}, "fwd", {"BM": 64, "num_warps": 2, "k_t": False}),
        ("gfx942", 128, 128, (40, 0), {}, "bwd_dq", {"BM": 64, "BN": 16, "num_warps": 2}),
        ("sm90", 128, 128, (15, 0), {}, "bwd_dkdv", {"BM": 16, "BN": 32, "num_warps": 2}),
        # configs.MOD_TILES, over the window's where there is one
        ("gfx950", 128, 128, (15, 0), {"alibi": True}, "fwd", {"BM": 64, "BN": 32, "num_warps": 2}),
        ("gfx950", 128, 128, (-1, -1), {"alibi": True}, "fwd", {"BM": 256, "BN": 32}),
        ("gfx942", 128, 128, (40, 0), {"alibi": True}, "bwd_dq", {"BM": 128, "num_warps": 4}),
        ("gfx950", 256, 256, (63, 0), {"softcap": 5.0}, "fwd", {"BM": 64, "num_warps": 4}),
        ("sm90", 128, 128, (15, 0), {"alibi": True}, "bwd_dkdv", {"BN": 32, "num_warps": 4}),
        # configs.FP32_TILES: fp32's tile (half the keys) takes its own level's changes
        ("gfx950", 128, 128, (300, 0), F32, "fwd", {"BM": 128, "BN": 32, "nonkdim": 16}),
        ("gfx950", 192, 128, (-1, -1), F32, "fwd", {"BM": 256, "lane_sums": False}),
        ("gfx950", 256, 256, (100, 0), F32, "fwd", {"BM": 64, "BN": 16, "num_warps": 8}),
        ("gfx950", 128, 128, (-1, -1), F32, "bwd_dq", {"BM": 128, "nonkdim": 16}),
        ("gfx950", 192, 128, (15, 0), F32, "bwd_dq", {"BM": 16, "BN": 16, "num_warps": 2}),
        ("gfx942", 256, 256, (-1, -1), F32, "bwd_dq", {"BM": 64, "BN": 16, "nonkdim": 16}),
        ("sm90", 128, 128, (-1, -1), F32, "fwd", {"BM": 64, "BN": 16, "num_warps": 8}),
        ("sm90", 192, 128, (47, 0), F32, "bwd_dq", {"num_warps": 4, "num_stages": 2}),
        # with a score term, its changes on top of the plain fp32 ones
        ("gfx950", 192, 128, (-1, -1), F32 | {"alibi": True}, "fwd", {"BM": 128, "nonkdim": 16}),
        ("gfx1250", 192, 128, (-1, -1), F32 | {"alibi": True}, "bwd_dq", {"BM": 64, "BN": 16}),
    ],
)  # fmt: skip
def test_window_tiles_against_the_reference(table, d, dv, window, terms, kind, want):
    p = plan.Problem(1, 77, 77, 2, 1, d, dv, causal=True, window=window, **terms)
    if kind == "fwd":
        c = plan.plan_forward(p, REF, table=table).config
    else:
        bp = plan.plan_backward(p, REF, table=table)
        c = bp.dkdv if kind == "bwd_dkdv" else bp.dq
    assert {f: getattr(c, f) for f in want} == want
    dt = FP32 if terms.get("dtype") == "fp32" else BF16
    q, k, v = qkv(1, 77, 77, 2, 1, d, dv, seed=37, grad=True, dtype=dt)
    kw = {"softcap": terms["softcap"]} if "softcap" in terms else {}
    if terms.get("alibi"):
        kw["alibi_slopes"] = torch.rand(2, generator=gen(38)) * 0.5
    check_fwd_bwd(q, k, v, REF, table=table, config=None, causal=True, window_size=window, **kw)


@pytest.mark.parametrize(
    "table, d, page, window, terms, want",
    [
        # configs.PAGED_TILES: a chunked prefill over a paged cache takes its level's changes,
        # on top of the window's and the score term's
        ("gfx950", 64, 256, (100, 0), {}, {"BM": 32, "num_warps": 1, "lane_sums": False}),
        ("gfx950", 128, 64, (200, 0), {}, {"BM": 128, "BN": 32, "num_warps": 4}),
        ("gfx942", 64, 64, (20, 0), {}, {"BM": 64, "BN": 64, "num_warps": 2}),
        ("gfx1250", 64, 64, (200, 0), {"softcap": 5.0}, {"BM": 256, "num_warps": 8}),
        ("sm90", 256, 64, (15, 0), {"alibi": True}, {"BM": 32, "BN": 16, "num_warps": 2}),
        # without a window (the table's level): d192 with ALiBi, pages smaller than its tile
        ("gfx950", 192, 32, (-1, -1), {"alibi": True}, {"BN": 32, "lane_sums": False}),
        # the key tile capped at the page again after the level's 32 keys
        ("gfx950", 128, 16, (200, 0), {}, {"BM": 128, "BN": 16, "num_warps": 4}),
        # configs.FP32_PAGED_TILES: fp32 operands, on top of FP32_TILES' (not PAGED_TILES')
        ("gfx950", 192, 256, (-1, -1), F32, {"BM": 128, "nonkdim": 16, "lane_sums": True}),
        ("gfx950", 128, 64, (100, 0), F32 | {"alibi": True}, {"BM": 32, "nonkdim": 16}),
        ("gfx942", 256, 32, (-1, -1), F32 | {"softcap": 5.0}, {"BN": 16, "num_warps": 8}),
        ("gfx1250", 128, 16, (20, 0), F32, {"BM": 64, "num_warps": 2}),
        ("sm90", 256, 64, (200, 0), F32, {"BN": 16, "num_stages": 1}),
    ],
)  # fmt: skip
def test_paged_prefill_tiles_against_the_reference(
    table, d, page, window, terms, want, monkeypatch
):
    g = gen(61 + page)
    dv = 128 if d == 192 else d
    B, Sq, H, Hk, S = 2, 77, 2, 1, 256
    dt = FP32 if terms.get("dtype") == "fp32" else BF16
    q = rand(B, Sq, H, d, g=g, dtype=dt)
    kfull, vfull = rand(B, S, Hk, d, g=g, dtype=dt), rand(B, S, Hk, dv, g=g, dtype=dt)
    kw = {"softcap": terms["softcap"]} if "softcap" in terms else {}
    if terms.get("alibi"):
        kw["alibi_slopes"] = torch.rand(H, generator=g) * 0.5
    fp = _checked_kvcache(monkeypatch, q, kfull, vfull, page, g, window, table, **kw)
    assert fp.problem.page_size == page and not fp.problem.decode
    assert fp.problem.dtype == terms.get("dtype", "bf16")
    assert {f: getattr(fp.config, f) for f in want} == want


@pytest.mark.parametrize(
    "table, d, page, sq, window, terms, want",
    [
        # configs.WINDOW_TILES' decode levels: a windowed decode tile (gpt-oss's: d64, a
        # 128-key window, sinks) takes half its keys (one wave, or SGPR spills, before)
        ("gfx950", 64, 64, 1, (127, 0), {"sinks": True}, {"BM": 16, "BN": 64, "num_warps": 1}),
        ("gfx950", 128, 16, 1, (127, 0), {}, {"BM": 16, "BN": 32, "num_warps": 1}),
        ("gfx950", 128, 0, 4, (127, 0), {}, {"BM": 16, "BN": 32, "num_warps": 1}),
        ("gfx942", 64, 64, 1, (60, 0), {}, {"BN": 64, "sched": "iterative-ilp"}),
        # without a window the table's tile
        ("gfx950", 128, 64, 1, (-1, -1), {}, {"BM": 16, "BN": 64, "num_warps": 1}),
    ],
)  # fmt: skip
def test_windowed_decode_tiles_against_the_reference(
    table, d, page, sq, window, terms, want, monkeypatch
):
    g = gen(71 + page + sq)
    B, H, Hk, S = 2, 8, 2, 256
    q = rand(B, sq, H, d, g=g)
    kfull, vfull = rand(B, S, Hk, d, g=g), rand(B, S, Hk, d, g=g)
    kw = {"sinks": torch.randn(H, generator=g)} if terms.get("sinks") else {}
    fp = _checked_kvcache(monkeypatch, q, kfull, vfull, page, g, window, table, **kw)
    assert fp.problem.decode
    assert {f: getattr(fp.config, f) for f in want} == want


def _checked_kvcache(monkeypatch, q, kfull, vfull, page, g, window, table, **kw):
    """``flash_attn_with_kvcache`` (causal, ``window``, planned with ``table``'s tiles on the
    reference backend) over ``kfull`` / ``vfull`` (2 sequences of 256 and 190 keys; paged in a
    random page order where ``page``), output and LSE against the float64 reference; the
    forward plan it launched."""
    kc, vc, bt = _paged(kfull, vfull, page, g) if page else (kfull, vfull, None)
    lens = torch.tensor([256, 190], dtype=torch.int32)
    seen, real = [], plan.plan_forward
    monkeypatch.setattr(
        plan, "plan_forward", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]
    )
    out, lse = flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, block_table=bt, causal=True, window_size=window,
        return_softmax_lse=True, target=REF, table=table, **kw,
    )  # fmt: skip
    ro, rl = reference.attention(
        q, kfull, vfull, causal=True, seqused_k=lens, window_size=window, **kw
    )
    close(out, ro, OUT_TOL[q.dtype])
    close_lse(lse, rl)
    return seen[0]


def close_lse(lse, ref):
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), fin) and torch.equal(lse[~fin], ref[~fin].float())
    torch.testing.assert_close(lse[fin].double(), ref[fin], rtol=1e-5, atol=1e-4)


def qkv(b, sq, sk, h, hk, d, dv=None, *, seed, dtype=BF16, grad=False):
    g = gen(seed)
    q = rand(b, sq, h, d, g=g, dtype=dtype)
    k = rand(b, sk, hk, d, g=g, dtype=dtype)
    v = rand(b, sk, hk, dv or d, g=g, dtype=dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v


def check_fwd_bwd(q, k, v, target, *, config=SMALL, seed=0, extra_grad=(), ref_kw=None, **kw):
    """Forward (out, lse) and backward (q, k, v and ``extra_grad`` tensors, the sinks) against
    the float64 reference; ``ref_kw`` replaces arguments for the reference (torch mods)."""
    out, lse, _ = flash_attn_func(
        q, k, v, return_attn_probs=True, target=target, config=config, **kw
    )
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v, *extra_grad)]
    skip = ("score_mod", "mask_mod", "mod_tensors", "block_sparse", "table")
    kw64 = {n: x for n, x in kw.items() if n not in skip}
    for name, t in zip(("sinks",), ins64[3:]):
        kw64[name] = t
    kw64.update(ref_kw or {})
    ro, rl = reference.attention(*ins64[:3], **kw64)
    dt = q.dtype
    close(out, ro, OUT_TOL[dt], "out")
    close_lse(lse, rl)
    if not q.requires_grad:
        return out
    do = rand(*out.shape, g=gen(seed + 100), dtype=dt)
    ins = [q, k, v, *extra_grad]
    grads = torch.autograd.grad(out, ins, do)
    rgrads = torch.autograd.grad(ro, ins64, do.double())
    for n, a, r in zip(("dq", "dk", "dv", "dextra"), grads, rgrads):
        close(a, r, GRAD_TOL[dt], n)
    return out


# -- the reference itself ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"causal": True},
        {"window_size": (3, 5)},
        {"causal": True, "alibi_slopes": "alibi"},
        {"sinks": "sinks", "window_size": (4, 0)},
    ],
)
@pytest.mark.parametrize("sq, sk", [(7, 13), (13, 7), (9, 9)])
def test_reference_agrees_with_sdpa_math(kw, sq, sk):
    q, k, v = qkv(2, sq, sk, 4, 2, 16, seed=1)
    kw = dict(kw)
    if kw.get("alibi_slopes") == "alibi":
        kw["alibi_slopes"] = torch.rand(4, generator=gen(2))
    if kw.get("sinks") == "sinks":
        kw["sinks"] = torch.randn(4, generator=gen(3))
    out, _ = reference.attention(q, k, v, **kw)
    ref = reference.sdpa(q, k, v, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


# -- forward + backward: shapes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "b, sq, sk, h, hk, d, dv, causal",
    [
        (2, 1, 1, 2, 1, 64, 64, False),  # seqlen 1
        (1, 1, 17, 2, 1, 64, 64, True),  # one query, bottom-right causal: sees every key
        (1, 17, 33, 2, 2, 64, 64, True),  # sq < sk
        (2, 33, 17, 2, 1, 64, 64, True),  # sq > sk: the first rows see no key
        (1, 17, 33, 2, 2, 64, 64, False),
        (1, 17, 17, 8, 1, 64, 64, True),  # GQA 8:1
        (1, 19, 23, 2, 2, 256, 256, True),  # head dim 256
        (1, 21, 21, 2, 1, 192, 128, False),  # 192 q/k with 128 v
        (1, 9, 14, 2, 2, 72, 40, True),  # head dims that are no sum of powers of two >= 16
    ],
)
def test_shapes_fwd_bwd(b, sq, sk, h, hk, d, dv, causal):
    q, k, v = qkv(b, sq, sk, h, hk, d, dv, seed=sq * 7 + sk, grad=True)
    check_fwd_bwd(q, k, v, REF, causal=causal, seed=3)


@pytest.mark.parametrize("s", [127, 128])
def test_tile_boundary_seqlens_default_config(s):
    q, k, v = qkv(1, s, s, 2, 1, 128, seed=s, grad=True)
    check_fwd_bwd(q, k, v, REF, config=None, causal=True)


def test_seqlen_1000_default_config():
    # the shipped tiles (128 x 64 forward): several full tiles plus a ragged one, both ways
    q, k, v = qkv(1, 1000, 1000, 1, 1, 64, seed=5, grad=True)
    check_fwd_bwd(q, k, v, REF, config=None, causal=True)
    q, k, v = qkv(1, 1000, 129, 1, 1, 64, seed=6)
    check_fwd_bwd(q, k, v, REF, config=None)


def test_fp16():
    q, k, v = qkv(1, 20, 35, 2, 1, 64, seed=7, dtype=FP16, grad=True)
    check_fwd_bwd(q, k, v, REF, causal=True)


@pytest.mark.parametrize("target", [REF, INTERP])
def test_fp32(target):
    # fp32 operands (flex_attention's fp32 inputs): IEEE fp32 products, fp32 tolerances
    q, k, v = qkv(1, 19, 37, 2, 1, 40, seed=8, dtype=FP32, grad=True)
    check_fwd_bwd(q, k, v, target, causal=True, window_size=(11, 3))


@pytest.mark.parametrize("target", [REF, INTERP])
def test_fp32_softcap(target):
    # softcap's logits leave out their constant c (common.softcap_r / softcap_shift): the LSE
    # gets it back, sinks are compared without it; fp32 tolerances at a Gemma-sized cap
    q, k, v = qkv(1, 19, 37, 2, 1, 40, seed=10, dtype=FP32, grad=True)
    q = (q.detach() * 8).requires_grad_()  # scores of tens: the cap bites
    sinks = rand(2, g=gen(11), dtype=FP32).requires_grad_()
    check_fwd_bwd(q, k, v, target, causal=True, softcap=30.0, sinks=sinks, extra_grad=(sinks,))
    check_fwd_bwd(q, k, v, target, softcap=30.0, window_size=(9, 2))


def test_empty_batch_and_empty_sequences():
    q, k, v = qkv(0, 5, 6, 2, 1, 32, seed=8, grad=True)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, target=REF)
    assert out.shape == (0, 5, 2, 32) and lse.shape == (0, 2, 5)
    (out.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    # no keys at all: zero output, +inf LSE (flash-attn's convention); sinks make it finite
    q, k, v = qkv(1, 5, 0, 2, 1, 32, seed=9)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, target=REF)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all() and (lse > 0).all()
    s = torch.tensor([0.5, -1.0])
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, target=REF, sinks=s)
    assert torch.equal(out, torch.zeros_like(out))
    torch.testing.assert_close(lse, s[None, :, None].expand(1, 2, 5))


def test_any_strides():
    g = gen(10)
    base = rand(2, 19, 3, 4, 64, g=g)  # q, k, v are strided slices of one packed tensor
    q, k, v = base[:, :, 0, :, :], base[:, :, 1, :2, :], base[:, :, 2, :2, :]
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) stored head-major
    for t in (q, k, v):
        t.requires_grad_()
    check_fwd_bwd(q, k, v, REF, causal=True)


# -- features -----------------------------------------------------------------------------------------------


FEATURES = {
    "window": {"window_size": (5, 3)},
    "window_left_causal": {"window_size": (6, -1), "causal": True},
    "window_right_only": {"window_size": (-1, 2)},
    "softcap": {"softcap": 1.5},
    "softcap_causal_window": {"softcap": 2.0, "causal": True, "window_size": (7, 0)},
    "alibi": {"alibi_slopes": "heads"},
    "alibi_batch_causal": {"alibi_slopes": "batch", "causal": True},
    "scale": {"softmax_scale": 0.3},
    "lse_log2": {"lse_log2": True},
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_features_fwd_bwd(name):
    kw = dict(FEATURES[name])
    sq, sk = (37, 29) if len(name) % 2 else (29, 45)  # both orientations across the features
    b, h, hk = 2, 4, 2
    if kw.get("alibi_slopes") == "heads":
        kw["alibi_slopes"] = torch.rand(h, generator=gen(11))
    elif kw.get("alibi_slopes") == "batch":
        kw["alibi_slopes"] = torch.rand(b, h, generator=gen(12))
    q, k, v = qkv(b, sq, sk, h, hk, 32, seed=13, grad=True)
    check_fwd_bwd(q, k, v, REF, **kw)


# the interpreter (numpy) warns where the padded keys' p overflows and its inf meets a zero K
# row: the point of the test, in rows that are never stored
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (5, 0)}])
def test_backward_with_scores_far_below_zero(target, kw):
    # every score about -200 (base 2: an LSE near -300): a key past sk has a score of 0, and
    # 2^(0 - LSE) overflows fp32. The backward leaves rows past sq and, in dK / dV, keys past
    # sk unmasked (their results are never stored); this holds that none of that overflow
    # reaches a stored gradient. 37 queries, 29 keys: neither a multiple of any tile
    g = gen(41)
    q = (torch.rand(1, 37, 2, 32, generator=g) + 5.0).requires_grad_()
    k = (-torch.rand(1, 29, 1, 32, generator=g) - 5.0).requires_grad_()
    v = torch.randn(1, 29, 1, 32, generator=g).requires_grad_()
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, target=target, **kw)
    assert (
        lse[lse.isfinite()].max() < -89
    )  # e^(-lse), a padded key's p, is past fp32's largest (e^88.7)
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ro, _ = reference.attention(*ins64, **kw)
    do = torch.randn(out.shape, generator=gen(42))
    grads = torch.autograd.grad(out, (q, k, v), do)
    for n, a, r in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(ro, ins64, do.double())):
        assert torch.isfinite(a).all(), n
        # fp32 logits near -200 carry ~2e-5 of absolute rounding into every exp: relative 1e-4
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-4 * r.abs().max(), msg=n)


@pytest.mark.parametrize("window", [(9, 0), (-1, -1)])
def test_sinks_with_sliding_window_and_their_gradient(window):
    q, k, v = qkv(2, 40, 40, 4, 1, 32, seed=14, grad=True)
    sinks = torch.randn(4, generator=gen(15)).requires_grad_()
    check_fwd_bwd(q, k, v, REF, window_size=window, sinks=sinks, extra_grad=(sinks,))


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize("lane_sums", [False, True])
def test_sinks_start_the_softmax_including_minus_inf_sinks(target, lane_sums):
    # the forward starts its running max and sum from the sink (forward._fwd_tile), with or
    # without lane partial sums; a -inf sink is no sink, and a row whose window sees no key
    # (sq > sk, bottom-right aligned) keeps only the sink: zeros out, the sink's LSE
    q, k, v = qkv(2, 37, 29, 4, 2, 32, seed=51)
    sinks = torch.randn(4, generator=gen(52)) * 4
    sinks[1] = float("-inf")
    cfg = {"fwd": configs.Config(32, 16, 4, lane_sums=lane_sums), "bwd_dkdv": C16, "bwd_dq": C16}
    for kw in ({"causal": True}, {"window_size": (5, 0)}):
        check_fwd_bwd(q, k, v, target, config=cfg, sinks=sinks, **kw)


def test_windows_cut_through_tiles():
    # 16 x 16 tiles; windows of 5 / 21 keys start and end inside tiles, with sq != sk
    for window, sq, sk in (((2, 2), 50, 61), ((13, 7), 61, 50), ((0, 0), 33, 33)):
        q, k, v = qkv(1, sq, sk, 2, 1, 32, seed=sq + sk, grad=True)
        check_fwd_bwd(q, k, v, REF, window_size=window)


@pytest.mark.parametrize(
    "window, sq, sk",
    [((40, 0), 70, 70), ((37, 11), 90, 75), ((25, 30), 64, 80), ((33, 0), 47, 100)],
)
def test_windows_wider_than_the_tile(window, sq, sk):
    # 16 x 16 tiles: every loop of kernels._segments runs (left-bound tiles, the unmasked
    # interior, right-bound tiles; the dK/dV query loop mirrored), with sq != sk
    q, k, v = qkv(1, sq, sk, 2, 1, 32, seed=sq + 3 * sk, grad=True)
    check_fwd_bwd(q, k, v, REF, window_size=window)
    if window == (37, 11):
        check_fwd_bwd(q, k, v, INTERP, window_size=window)


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize("lane_bits, sk_tail", [(0, False), (4, True), (12, True), (4, False)])
def test_masks_with_lane_bits_and_the_sk_tail(monkeypatch, target, lane_bits, sk_tail):
    # the forward's one-sided masks written with a lane's key-offset bits split off
    # (configs.KEY_LANE_BITS: the same test whatever the bits) and the right-bound tiles split
    # at sk (configs.SK_TAIL_TARGETS): with 32 x 16 tiles the last row tile of a causal 45 x 70
    # problem has a right-bound tile below sk and one crossing it (rows past sq too); the
    # window's left-bound tiles and the unmasked interior run as well
    monkeypatch.setitem(configs.KEY_LANE_BITS, "gfx950", {32: lane_bits})
    monkeypatch.setitem(configs.SK_TAIL_TARGETS, "gfx950", {"d64"} if sk_tail else set())
    p = plan.Problem(1, 45, 70, 2, 1, 32, 32, causal=True, window=(30, 0))
    C = plan.plan_forward(p, target, config=configs.Config(32, 16, 4)).C
    fc = (C.KEY_LANE_BITS, C.SK_TAIL)
    assert fc == (lane_bits, sk_tail), fc
    cfg = {"fwd": configs.Config(32, 16, 4), "bwd_dkdv": C16, "bwd_dq": C16}
    for kw in ({"causal": True}, {"causal": True, "window_size": (30, 0)}):
        q, k, v = qkv(1, 45, 70, 2, 1, 32, seed=41 + lane_bits)
        check_fwd_bwd(q, k, v, target, config=cfg, **kw)


def test_gpt_oss_window_backward_with_the_table_tiles():
    # the table's tiles under a 128-key window (plan.band_config: dK/dV 32 x 64 with 2 warps,
    # 32 keys per warp): 301 rows run every loop of the mirrored query walk, the last key
    # block partial; the sinks' gradient too
    p = plan.Problem(1, 301, 301, 4, 1, 64, 64, causal=True, window=(127, 0), sinks=True)
    bp = plan.plan_backward(p, REF)
    assert (bp.dkdv.BM, bp.dkdv.BN, bp.dkdv.num_warps) == (32, 64, 2)
    q, k, v = qkv(1, 301, 301, 4, 1, 64, seed=23, grad=True)
    sinks = torch.randn(4, generator=gen(24)).requires_grad_()
    check_fwd_bwd(
        q, k, v, REF, window_size=(127, 0), causal=True, sinks=sinks, extra_grad=(sinks,),
        config=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "table, d, kw, want",
    [
        # gfx942's d64 dQ (128 x 32, 2 stages), shrunk for a 24-key window to 32 x 32, 1 warp
        ("gfx942", 64, {"causal": True, "window_size": (23, 0)}, (32, 32, 1, 2)),
        ("gfx942", 256, {"causal": True}, (128, 32, 4, 1)),  # the 32x32 MFMA tile
        ("gfx1250", 128, {"causal": True}, (128, 64, 8, 2)),
    ],
)
def test_dq_tiles_of_other_tables_against_the_reference(table, d, kw, want):
    p = plan.Problem(1, 45, 45, 2, 1, d, d, causal=True, window=kw.get("window_size", (-1, -1)))
    dq = plan.plan_backward(p, REF, table=table).dq
    assert (dq.BM, dq.BN, dq.num_warps, dq.num_stages) == want
    q, k, v = qkv(1, 45, 45, 2, 1, d, seed=31, grad=True)
    check_fwd_bwd(q, k, v, REF, table=table, config=None, **kw)


# -- the interpreter (generated Triton) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "b, sq, sk, h, hk, d, dv, config, kw",
    [
        (1, 17, 33, 2, 1, 64, 64, SMALL, {"causal": True}),  # several tiles, masked + interior
        (2, 20, 13, 2, 2, 32, 32, None, {"window_size": (4, 2), "softcap": 1.5}),
        (1, 18, 18, 2, 1, 192, 128, None, {"causal": True}),
    ],
)
def test_interpret_fwd_bwd(b, sq, sk, h, hk, d, dv, config, kw):
    q, k, v = qkv(b, sq, sk, h, hk, d, dv, seed=16, grad=True)
    check_fwd_bwd(q, k, v, INTERP, config=config, **kw)


def test_interpret_alibi_sinks_lse_log2():
    q, k, v = qkv(1, 20, 20, 2, 2, 32, seed=17, grad=True)
    sinks = torch.randn(2, generator=gen(18)).requires_grad_()
    check_fwd_bwd(
        q, k, v, INTERP, alibi_slopes=torch.rand(2, generator=gen(19)), sinks=sinks,
        extra_grad=(sinks,), lse_log2=True, window_size=(6, 0), config=None,
    )  # fmt: skip


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize("scale", [0.0, -0.5, -1e-3])
def test_scale_zero_or_negative_on_every_kernel(target, scale):
    """Uniform (0) and inverted (< 0) attention are SDPA's answer, not NaN: forward with masked
    edge tiles (causal, a window, keys past a tile), backward, paged decode with packed GQA
    heads, and split-KV with its combine (the forward folds only a positive scale into exp2)."""
    q, k, v = qkv(1, 19, 37, 4, 2, 16, seed=60, grad=True)
    for kw in ({"causal": True}, {"window_size": (5, 2)}):
        check_fwd_bwd(q, k, v, target, softmax_scale=scale, **kw)
    qs, ks, vs = (t.detach().transpose(1, 2).double() for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        qs, ks, vs, scale=scale, enable_gqa=True
    )
    out = flash_attn_func(q, k, v, softmax_scale=scale, target=target, config=SMALL)
    close(out, sdpa.transpose(1, 2), OUT_TOL[BF16], "vs SDPA")
    g = gen(61)
    qd = rand(2, 1, 4, 16, g=g)
    kc, vc = rand(6, 16, 2, 16, g=g), rand(6, 16, 2, 16, g=g)
    table = torch.tensor([[4, 1, 5], [0, 3, 2]], dtype=torch.int32)
    lens = torch.tensor([45, 17], dtype=torch.int32)
    kd, vd = kc[table.long()].flatten(1, 2), vc[table.long()].flatten(1, 2)
    ref, _ = reference.attention(qd, kd, vd, softmax_scale=scale, seqused_k=lens)
    for splits in (1, 3):
        out = flash_attn_with_kvcache(
            qd, kc, vc, cache_seqlens=lens, block_table=table, softmax_scale=scale,
            num_splits=splits, target=target,
        )  # fmt: skip
        close(out, ref, OUT_TOL[BF16], f"decode splits={splits}")


# -- determinism ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [REF, INTERP])
def test_deterministic_backward_is_bitwise_reproducible(target):
    q, k, v = qkv(1, 24, 40, 4, 1, 32, seed=20, grad=True)
    do = rand(1, 24, 4, 32, g=gen(21))
    runs = []
    cfg = SMALL if target == REF else None
    for _ in range(2):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True, target=target, config=cfg)
        runs.append(torch.autograd.grad(out, (q, k, v), do))
    for a, b in zip(*runs):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


# -- varlen ---------------------------------------------------------------------------------------------------


def _packed(lens_q, lens_k, h, hk, d, *, seed, grad=True):
    g = gen(seed)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = rand(int(cu_q[-1]), h, d, g=g)
    k = rand(int(cu_k[-1]), hk, d, g=g)
    v = rand(int(cu_k[-1]), hk, d, g=g)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize(
    "target, kw",
    [(REF, {}), (REF, {"causal": True, "window_size": (5, -1)}), (INTERP, {"causal": True})],
)
def test_varlen_with_an_empty_sequence(target, kw):
    lens_q, lens_k = [5, 0, 33, 17], [9, 3, 20, 40]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 32, seed=22)
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_attn_probs=True, target=target,
        config=SMALL if target == REF else None, **kw,
    )  # fmt: skip
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ro, rl = reference.attention(*ins64, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
    close(out, ro, OUT_TOL[BF16])
    close_lse(lse, rl)
    do = rand(*out.shape, g=gen(23))
    for a, r in zip(
        torch.autograd.grad(out, (q, k, v), do), torch.autograd.grad(ro, ins64, do.double())
    ):
        close(a, r, GRAD_TOL[BF16])


def test_varlen_sinks_alibi_and_a_zero_key_sequence():
    lens_q, lens_k = [7, 12, 4], [0, 30, 11]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 2, 1, 64, seed=24)
    sinks = torch.randn(2, generator=gen(25))
    slopes = torch.rand(3, 2, generator=gen(26))
    kw = {"sinks": sinks, "alibi_slopes": slopes, "causal": True}
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 30, target=REF, config=SMALL, **kw)
    ro, _ = reference.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
    close(out, ro, OUT_TOL[BF16])


# -- decode: KV cache -----------------------------------------------------------------------------------------


def _check_decode_splits(q, kfull, vfull, kc, vc, lens, table, cfg, target, splits=(1, 3),
                         sinks=None, tol=OUT_TOL[BF16]):  # fmt: skip
    """``flash_attn_with_kvcache`` over the cache ``kc`` / ``vc`` (``table``: paged) with each of
    ``splits``, output and LSE against the float64 reference of the dense ``kfull`` / ``vfull``."""
    ro, rl = reference.attention(q, kfull, vfull, causal=True, seqused_k=lens, sinks=sinks)
    for splits_ in splits:
        out, lse = flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, num_splits=splits_,
            return_softmax_lse=True, sinks=sinks, target=target, config=cfg,
        )  # fmt: skip
        close(out, ro, tol, f"splits={splits_}")
        close_lse(lse, rl)


def _paged(kfull, vfull, page, g):
    """A paged copy of a dense ``(B, S, Hk, D)`` cache with pages in a random order."""
    B, S = kfull.shape[:2]
    npg = S // page
    perm = torch.randperm(B * npg, generator=g)
    table = perm.view(B, npg).to(torch.int32)
    kc = torch.zeros(B * npg, page, *kfull.shape[2:], dtype=kfull.dtype)
    vc = torch.zeros(B * npg, page, *vfull.shape[2:], dtype=vfull.dtype)
    for b in range(B):
        for p in range(npg):
            kc[table[b, p]] = kfull[b, p * page : (p + 1) * page]
            vc[table[b, p]] = vfull[b, p * page : (p + 1) * page]
    return kc, vc, table


@pytest.mark.parametrize("page, splits", [(0, 1), (0, 3), (16, 0), (32, 2), (64, 1), (256, 2)])
def test_kvcache_paged_out_of_order_with_append_and_splits(page, splits):
    g = gen(27 + page)
    B, Sq, H, Hk, D, S = 3, 1, 8, 2, 64, 256
    q = rand(B, Sq, H, D, g=g)
    kfull, vfull = rand(B, S, Hk, D, g=g), rand(B, S, Hk, D, g=g)
    kn, vn = rand(B, 2, Hk, D, g=g), rand(B, 2, Hk, D, g=g)
    lens = torch.tensor([37, 0, 200], dtype=torch.int32)
    sinks = torch.randn(H, generator=g)
    if page:
        kc, vc, table = _paged(kfull, vfull, page, g)
    else:
        kc, vc, table = kfull.clone(), vfull.clone(), None
    out, lse = flash_attn_with_kvcache(
        q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table, causal=True, sinks=sinks,
        num_splits=splits, return_softmax_lse=True, target=REF, config=configs.Config(16, 32, 4),
    )  # fmt: skip
    kref, vref = kfull.clone(), vfull.clone()
    for b in range(B):
        kref[b, lens[b] : lens[b] + 2] = kn[b]
        vref[b, lens[b] : lens[b] + 2] = vn[b]
    ro, rl = reference.attention(q, kref, vref, causal=True, seqused_k=lens + 2, sinks=sinks)
    close(out, ro, OUT_TOL[BF16])
    close_lse(lse, rl)
    if page:  # the new tokens landed in their pages
        for b in range(B):
            for t in range(2):
                pos = int(lens[b]) + t
                assert torch.equal(kc[table[b, pos // page], pos % page], kn[b, t])
    else:
        assert torch.equal(kc, kref) and torch.equal(vc, vref)


@pytest.mark.parametrize("target", [REF, INTERP])
def test_kvcache_gqa_packed_decode_split(target):
    # GQA 8:1 decode: the 8 query heads of the KV head share one 16-row tile; 3 splits
    g = gen(28)
    B, H, Hk, D, S = 2, 8, 1, 64, 96
    q = rand(B, 2, H, D, g=g)
    kc, vc = rand(B, S, Hk, D, g=g), rand(B, S, Hk, D, g=g)
    lens = torch.tensor([96, 41], dtype=torch.int32)
    slopes = torch.rand(H, generator=g)
    kw = {"causal": True, "window_size": (30, 0), "alibi_slopes": slopes, "softcap": 3.0}
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=3, target=target, **kw)
    ro, _ = reference.attention(q, kc, vc, seqused_k=lens, **kw)
    close(out, ro, OUT_TOL[BF16])


def test_kvcache_plans_with_another_targets_table_on_the_cpu(monkeypatch):
    # table= picks whose tiles and CU count plan the launch (split counts by table:
    # test_table_target_is_separate_from_compile_target); the kernels still run on the CPU
    g = gen(42)
    B, H, D, S = 2, 8, 64, 200
    q = rand(B, 1, H, D, g=g)
    kc, vc = rand(B, S, 1, D, g=g), rand(B, S, 1, D, g=g)
    lens = torch.tensor([200, 77], dtype=torch.int32)
    ro, _ = reference.attention(q, kc, vc, seqused_k=lens, causal=True)
    seen, real = [], plan.plan_forward
    monkeypatch.setattr(
        plan, "plan_forward", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1]
    )
    out = flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, causal=True, target=REF, table="h200"
    )
    close(out, ro, OUT_TOL[BF16])
    # the alias names sm90's table: its decode tile, not gfx950's, compiled for the CPU backend
    assert seen[0].config == configs.select("decode", D, "sm90") != configs.select("decode", D)
    want = configs.select("decode", D, "sm90").num_warps  # 2 at d64 (the H200's sweep)
    assert want != configs.select("decode", D).num_warps
    assert seen[0].options == {"num_warps": want}
    with pytest.raises(Exception, match="unknown target 'gfx9999'"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, target=REF, table="gfx9999")


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "page, d, g_, klanes",
    [(16, 64, 3, 8), (32, 80, 8, 4), (128, 64, 2, 8), (4, 32, 5, 8), (0, 48, 3, 4),
     (64, 80, 4, 8)],
)  # fmt: skip
def test_decode_k_in_lane_order_and_tiles_over_pages(target, page, d, g_, klanes):
    # Config.klanes: K loaded as (key block, dim block, lane group, key, dim) and permuted
    # back (common._load_k_lanes); with pages of 16 keys or more a 64-key tile spans pages
    # (16 and 32: 4 and 2 pages, each key block from its own page), 128-key pages slice
    # tiles, 4-key pages shrink the tile to 16 keys gathered row by row (plain load), and
    # head dims 80 / 48 mix fitting chunks with ones the plain load takes (16 past a 64 with
    # k width 8); two query positions per head (speculative decoding) in the 16x64 one
    g = gen(60 + page + d)
    B, Hk, S = 3, 2, 256
    H = Hk * g_
    sq = 2 if page == 64 else 1
    q = rand(B, sq, H, d, g=g)
    kfull, vfull = rand(B, S, Hk, d, g=g), rand(B, S, Hk, d, g=g)
    lens = torch.tensor([1, 177, 250], dtype=torch.int32)  # no length a multiple of 16
    if page:
        kc, vc, table = _paged(kfull, vfull, page, g)
    else:
        kc, vc, table = kfull, vfull, None
    cfg = configs.Config(16, 64, 1, 1, 16, klanes=klanes)
    _check_decode_splits(q, kfull, vfull, kc, vc, lens, table, cfg, target)
    p = plan.Problem(B, sq, S, H, Hk, d, d, causal=True, seqused=True, page_size=page,
                     decode=True)  # fmt: skip
    fp = plan.plan_forward(p, target, config=cfg)
    bn = 16 if 0 < page < 16 else 64
    got_klanes, got_bn = fp.C.KLANES, fp.C.BN
    assert got_klanes == klanes and got_bn == bn


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "bn, page, d, g_, lazy, dtype, sinks",
    [(64, 16, 80, 3, True, BF16, False), (32, 0, 48, 5, False, FP16, True),
     (128, 128, 64, 8, True, BF16, True), (64, 64, 128, 1, False, BF16, False),
     (64, 8, 32, 2, True, BF16, False)],
)  # fmt: skip
def test_decode_lane_sums_match_the_reference(target, bn, page, d, g_, lazy, dtype, sinks):
    # Config.lane_sums: the row sums stay per-lane partials (BM x 16) across the KV loop and
    # are summed once after it; the output and the LSE must match the float64 reference to the
    # usual tolerances (an LSE error of 1e-4 at most), split or not, with lengths of 1 and
    # lengths that end inside a tile, sinks, the eager and lazy rescale, and 8-key pages
    # (the tile shrinks to one 16-key block: a single column block per lane)
    g = gen(90 + bn + d)
    B, Hk, S = 3, 2, 384
    H = Hk * g_
    q = rand(B, 1, H, d, g=g, dtype=dtype, scale=2.0)
    kfull, vfull = rand(B, S, Hk, d, g=g, dtype=dtype), rand(B, S, Hk, d, g=g, dtype=dtype)
    lens = torch.tensor([1, 201, 383], dtype=torch.int32)
    sk = torch.randn(H, generator=g) if sinks else None
    if page:
        kc, vc, table = _paged(kfull, vfull, page, g)
    else:
        kc, vc, table = kfull, vfull, None
    cfg = configs.Config(16, bn, 1, 1, 16, lazy=lazy, klanes=8, lane_sums=True)
    _check_decode_splits(q, kfull, vfull, kc, vc, lens, table, cfg, target, sinks=sk,
                         tol=OUT_TOL[dtype])  # fmt: skip
    p = plan.Problem(B, 1, S, H, Hk, d, d, causal=True, seqused=True, page_size=page,
                     decode=True, dtype="bf16" if dtype == BF16 else "fp16")  # fmt: skip
    assert plan.plan_forward(p, target, config=cfg).C.LANE_SUMS


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "page, d, g_, sq, bn, klanes, lazy, extra, fold",
    [(0, 64, 8, 1, 64, 8, False, "sinks", 2), (128, 64, 4, 1, 64, 8, True, "softcap", 2),
     (256, 48, 2, 1, 128, 8, False, "window", 4), (0, 80, 2, 2, 64, 0, True, "sinks", 2),
     (64, 64, 3, 1, 64, 4, False, "window-sinks", 2), (0, 32, 8, 1, 64, 8, True, "scale", 2),
     (16, 64, 8, 1, 128, 8, False, "sinks", 2), (32, 48, 4, 1, 128, 8, True, "window", 4),
     (64, 64, 2, 2, 128, 8, False, "softcap", 4)],
)  # fmt: skip
def test_decode_folded_rows_match_the_reference(
    target, page, d, g_, sq, bn, klanes, lazy, extra, fold, monkeypatch
):
    # Config.fold (Fwd.FOLD): the MFMA rows the group leaves spare take the tile's other key
    # blocks, each row copy its own online softmax merged after the loop. Groups of 8, 4
    # (3 rounded up) and 2 (one or two query positions), copies of 32 and 64 keys, dense and
    # paged caches (a page holding the tile; a copy per page; a copy spanning 4 pages of 16,
    # pages in random order); lengths of 0 (the empty row: output 0, LSE +inf), 1, and ending inside a
    # copy's block; sinks (counted once, in copy 0), softcap, a sliding window (masked tiles'
    # per-copy keys), a scale below 1; split-KV on top; both rescales
    g = gen(140 + page + d + g_)
    B, Hk, S = 4, 2, 512
    H = Hk * g_
    q = rand(B, sq, H, d, g=g, scale=2.0)
    kfull, vfull = rand(B, S, Hk, d, g=g), rand(B, S, Hk, d, g=g)
    lens = torch.tensor([0, 1, 75, 509], dtype=torch.int32)
    kw = {}
    if "sinks" in extra:
        kw["sinks"] = torch.randn(H, generator=g)
    if extra == "softcap":
        kw["softcap"] = 7.5
    if "window" in extra:
        kw["window_size"] = (40, 0)
    if extra == "scale":
        kw["softmax_scale"] = 0.05
    ro, rl = reference.attention(q, kfull, vfull, causal=True, seqused_k=lens, **kw)
    kc, vc, table = _paged(kfull, vfull, page, g) if page else (kfull, vfull, None)
    cfg = configs.Config(16, bn, 1, 1, 16, lazy=lazy, klanes=klanes, lane_sums=True, fold=8)
    seen = []  # the plans the calls ran
    real = plan.plan_forward
    monkeypatch.setattr(
        plan, "plan_forward", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]
    )
    for splits in (1, 3):
        out, lse = flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, num_splits=splits,
            return_softmax_lse=True, target=target, config=cfg, **kw,
        )  # fmt: skip
        close(out, ro, OUT_TOL[BF16], f"splits={splits}")
        close_lse(lse, rl)
    assert seen and all((fp.C.FOLD, fp.C.BM * fold) == (fold, 16) for fp in seen)
    unfolded = real(seen[0].problem, target, config=replace(cfg, fold=0))
    assert unfolded.C.FOLD == 1 and unfolded.C.BM == 16


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "sq, sk, h, hk, d, kw, packed",
    [(1, 300, 16, 2, 64, {}, True), (3, 77, 8, 2, 80, {"causal": True, "window_size": (20, 0)}, True),
     (5, 129, 12, 3, 128, {"causal": True, "softcap": 10.0}, True),
     (2, 40, 8, 1, 64, {"sinks": "sinks"}, True), (1, 0, 4, 1, 64, {}, True),
     (9, 50, 8, 1, 32, {}, False), (4, 60, 4, 4, 64, {}, True), (1, 33, 3, 3, 128, {}, True),
     (65, 70, 2, 2, 64, {"causal": True}, False)],
)  # fmt: skip
def test_flash_attn_func_packs_the_group_for_few_queries(
    target, sq, sk, h, hk, d, kw, packed, monkeypatch
):
    # flash_attn_func with few queries per KV head (a decode step through SDPA) runs the
    # GQA-packed decode tile (configs.packs_heads: sq * next_pow2(group) <= 64), as
    # flash_attn_with_kvcache does; forward and backward against the reference, causal
    # (bottom-right), a window, softcap, sinks, no keys at all; MHA's few queries too (a group
    # of one); 9 x 8 rows and 65 MHA queries stay prefill
    seen = []
    real = plan.plan_forward
    monkeypatch.setattr(plan, "plan_forward", lambda p, *a, **k: seen.append(p) or real(p, *a, **k))
    q, k, v = qkv(2, sq, sk, h, hk, d, seed=170 + sq + d, grad=sk > 0)
    kw = dict(kw)
    extra = ()
    if kw.get("sinks") == "sinks":
        kw["sinks"] = torch.randn(h, generator=gen(171)).requires_grad_()
        extra = (kw["sinks"],)
    check_fwd_bwd(q, k, v, target, config=None, extra_grad=extra, **kw)
    assert seen and all(p.decode == packed for p in seen), [p.decode for p in seen]


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize("sq, g_, page, d", [(4, 8, 64, 64), (8, 8, 16, 128), (16, 4, 0, 64)])
def test_decode_with_several_query_positions_adds_warps(target, sq, g_, page, d, monkeypatch):
    # speculative decoding: sq positions x a group of g_ heads grow the decode tile past the
    # table's 16 rows (configs.decode_rows, up to 64); the tile then takes a warp per 16 rows
    # and K's plain load (plan.grown_decode): output and LSE against the reference, causal
    # bottom-right over cache lengths ending inside tiles, split-KV on top
    g = gen(200 + sq + page + d)
    B, Hk, S = 3, 2, 256
    q = rand(B, sq, Hk * g_, d, g=g)
    kfull, vfull = rand(B, S, Hk, d, g=g), rand(B, S, Hk, d, g=g)
    lens = torch.tensor([sq, 131, 250], dtype=torch.int32)
    kc, vc, table = _paged(kfull, vfull, page, g) if page else (kfull, vfull, None)
    seen = []
    real = plan.plan_forward
    monkeypatch.setattr(
        plan, "plan_forward", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]
    )
    ro, rl = reference.attention(q, kfull, vfull, causal=True, seqused_k=lens)
    for splits in (1, 2):
        out, lse = flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, num_splits=splits,
            return_softmax_lse=True, target=target,
        )  # fmt: skip
        close(out, ro, OUT_TOL[BF16], f"splits={splits}")
        close_lse(lse, rl)
    rows = sq * configs.next_pow2(g_)
    for fp in seen:
        got = (fp.C.BM, fp.C.GP, fp.C.FOLD, fp.config.num_warps, fp.C.KLANES)
        assert got == (rows, configs.next_pow2(g_), 1, rows // 16, 0)


def test_decode_fold_rule():
    # plan.decode_fold: off unless the table sets it, up to its count; copies while the real
    # rows fit and a copy keeps 32 keys (over pages too); never under ALiBi or mods
    cfg = configs.Config(16, 128, 1, 1, 16, klanes=8, fold=8)

    def fold(**kw):
        base = dict(causal=True, seqused=True, decode=True)
        args = {"sq": 1, "h": 8, "hk": 1, "page": 0, **kw}
        p = plan.Problem(3, args["sq"], 300, args["h"], args["hk"], 64, 64,
                         page_size=args["page"], **{**base, **args.get("p", {})})  # fmt: skip
        return plan.plan_forward(p, REF, config=args.get("cfg", cfg)).C.FOLD

    assert fold() == 2
    assert fold(h=4) == 4 and fold(h=2) == 4 and fold(h=16) == 1  # 2 copies of 32 keys at most
    assert fold(h=2, cfg=replace(cfg, BN=64)) == 2 and fold(cfg=replace(cfg, BN=32)) == 1
    assert fold(sq=2, h=4) == 2 and fold(sq=3, h=4) == 1
    assert fold(page=64) == 2 and fold(page=32) == 2 and fold(page=16) == 2
    assert fold(cfg=replace(cfg, fold=0)) == 1 and fold(cfg=replace(cfg, fold=1)) == 1
    assert fold(h=2, cfg=replace(cfg, fold=2)) == 2
    assert fold(p={"alibi": True}) == 1


def _strided_cache(kc, pad, step):
    """``kc``'s values in a cache whose rows are ``pad`` heads' worth of elements longer and
    whose head dim is strided by ``step`` (a view of a larger random tensor)."""
    P, page, Hk, D = kc.shape
    big = torch.randn(P, page, Hk + pad, D * step, dtype=kc.dtype)
    view = big[:, :, :Hk, ::step]
    view.copy_(kc)
    return view


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize("page, d, pad, step", [(64, 64, 1, 2), (0, 80, 3, 1), (128, 48, 0, 3)])
def test_decode_based_loads_with_awkward_strides(target, page, d, pad, step):
    # Fwd.BASED: a tile within one page (or a dense cache) loads K and V with load_at, the
    # page / key / head as the scalar base and per-element offsets from clamped row and
    # head-dim strides; rows longer than Hk * D and head dims strided by 2 or 3 must still
    # read the right elements (lengths ending inside tiles, splits)
    g = gen(120 + page + d)
    B, Hk, g_, S = 2, 2, 3, 256
    q = rand(B, 1, Hk * g_, d, g=g)
    kfull, vfull = rand(B, S, Hk, d, g=g), rand(B, S, Hk, d, g=g)
    lens = torch.tensor([255, 70], dtype=torch.int32)
    if page:
        kc, vc, table = _paged(kfull, vfull, page, g)
    else:
        kc, vc, table = kfull, vfull, None
    kc, vc = _strided_cache(kc, pad, step), _strided_cache(vc, pad, step)
    cfg = configs.Config(16, 64, 1, 1, 16, lazy=False, klanes=8, lane_sums=True)
    _check_decode_splits(q, kfull, vfull, kc, vc, lens, table, cfg, target, splits=(1, 2))
    p = plan.Problem(B, 1, S, Hk * g_, Hk, d, d, causal=True, seqused=True, page_size=page,
                     decode=True)  # fmt: skip
    fp = plan.plan_forward(p, target, config=cfg)
    kw = dict(q=q, o=q, lse=lens, seqused_k=lens, block_table=table)
    assert fp.C.BASED and fp.launches(k=kc, v=vc, **kw)[0].constexprs["C"].BASED


def _paged_decode(seed, g_, page, lens):
    """A bf16 decode over a paged cache (2 sequences, 2 KV heads of ``g_`` query heads, head
    dim 64, 192 keys of capacity, ``lens`` used): its tensors, ``plan.Problem`` and the
    launch keywords besides ``k`` and ``v``."""
    g = gen(seed)
    B, Hk, d, S = 2, 2, 64, 192
    q = rand(B, 1, Hk * g_, d, g=g)
    kfull, vfull = rand(B, S, Hk, d, g=g), rand(B, S, Hk, d, g=g)
    lens = torch.tensor(lens, dtype=torch.int32)
    kc, vc, table = _paged(kfull, vfull, page, g)
    p = plan.Problem(B, 1, S, Hk * g_, Hk, d, d, causal=True, seqused=True, page_size=page,
                     decode=True)  # fmt: skip
    kw = dict(q=q, o=q, lse=lens, seqused_k=lens, block_table=table)
    return SimpleNamespace(q=q, kfull=kfull, vfull=vfull, lens=lens, kc=kc, vc=vc,
                           table=table, p=p, kw=kw)  # fmt: skip


def _check_paged_decode(c, v, cfg, what="", **kw):
    """``flash_attn_with_kvcache`` on ``_paged_decode``'s ``c`` with V cache ``v`` (the same
    values as ``c.vc``, perhaps strided otherwise) against the float64 reference."""
    ro, rl = reference.attention(c.q, c.kfull, c.vfull, causal=True, seqused_k=c.lens)
    out, lse = flash_attn_with_kvcache(
        c.q, c.kc, v, cache_seqlens=c.lens, block_table=c.table, causal=True,
        return_softmax_lse=True, target=REF, config=cfg, **kw,
    )  # fmt: skip
    close(out, ro, OUT_TOL[BF16], what)
    close_lse(lse, rl)


def test_decode_based_loads_fall_back_for_large_strides(monkeypatch):
    # strides above common.BASED_STRIDE_MAX (here lowered to 64 elements) cannot be clamped:
    # the launch drops Fwd.BASED and the view loads read the cache, with the same results;
    # a paged prefill and tiles spanning pages never take it (a dense prefill does: below)
    c = _paged_decode(131, 4, 64, [192, 65])
    cfg = configs.Config(16, 64, 1, 1, 16, lazy=False, klanes=8, lane_sums=True)
    p, kw = c.p, c.kw
    fp = plan.plan_forward(p, REF, config=cfg)
    assert fp.launches(k=c.kc, v=c.vc, **kw)[0].constexprs["C"].BASED  # row stride 128
    monkeypatch.setattr(plan, "BASED_STRIDE_MAX", 64)
    assert not fp.launches(k=c.kc, v=c.vc, **kw)[0].constexprs["C"].BASED
    one = c.kc[:, :, :1].contiguous()  # row stride 64
    assert fp.launches(k=one, v=one, **kw)[0].constexprs["C"].BASED
    _check_paged_decode(c, c.vc, cfg)
    assert not plan.plan_forward(replace(p, page_size=16), REF, config=cfg).C.BASED
    assert not plan.plan_forward(replace(p, decode=False), REF, config=cfg).C.BASED


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "page, d, g_, sq, lazy, ls, sinks, pad, vpad, step",
    [(16, 128, 4, 1, False, True, False, 0, 0, 1), (32, 64, 3, 2, True, False, True, 1, 2, 2),
     (16, 32, 8, 1, False, True, True, 3, 3, 1), (32, 128, 1, 1, True, True, False, 0, 1, 3)],
)  # fmt: skip
def test_decode_v_head_dim_blocks_over_pages(
    target, page, d, g_, sq, lazy, ls, sinks, pad, vpad, step
):
    # Fwd.VBLK: a 64-key tile over pages of 16 / 32 keys loads V as (D / 32, 64, 32) head-dim
    # blocks from the head's scalar base and multiplies P by them as a batched dot; the
    # masked last tile reads, past the sequence's last key, that key's row (its page ids
    # clamped to the last used page) instead of masking. The cache rows past each sequence
    # are NaN and the table's entries past its pages garbage (the host checks only the used
    # ones); lengths end inside pages and tiles (1, 177, 250); caches have long rows and
    # strided head dims (V's strides K's or not: Fwd.VK_STRIDES); groups of 1 to 8, two
    # query positions, sinks, splits: all must match the reference
    g = gen(140 + page + d + g_)
    B, Hk, S = 3, 2, 256
    H = Hk * g_
    q = rand(B, sq, H, d, g=g)
    kfull, vfull = rand(B, S, Hk, d, g=g), rand(B, S, Hk, d, g=g)
    lens = torch.tensor([1, 177, 250], dtype=torch.int32)
    sk = torch.randn(H, generator=g) if sinks else None
    kc, vc, table = _paged(kfull, vfull, page, g)
    for b, n in enumerate(lens.tolist()):
        for pos in range(n, S):  # cache rows past the sequence: NaN, read by no valid load
            kc[table[b, pos // page], pos % page] = float("nan")
            vc[table[b, pos // page], pos % page] = float("nan")
        table[b, -(-n // page) :] = torch.tensor([-7, 10**6], dtype=torch.int32).repeat(S)[
            : table.shape[1] - (-(-n // page))
        ]
    kc, vc = _strided_cache(kc, pad, step), _strided_cache(vc, vpad, step)
    cfg = configs.Config(16, 64, 1, 1, 16, lazy=lazy, klanes=8, lane_sums=ls, vblk=32)
    _check_decode_splits(q, kfull, vfull, kc, vc, lens, table, cfg, target, sinks=sk)
    p = plan.Problem(B, sq, S, H, Hk, d, d, causal=True, seqused=True, page_size=page,
                     decode=True)  # fmt: skip
    fp = plan.plan_forward(p, target, config=cfg)
    kw = dict(q=q, o=q, lse=lens, seqused_k=lens, block_table=table)
    lc = fp.launches(k=kc, v=vc, **kw)[0].constexprs["C"]
    same = pad == vpad
    assert fp.C.VBLK == 32 and lc.VBLK == 32 and lc.VK_STRIDES is same


def test_decode_v_head_dim_blocks_plan_and_fallbacks(monkeypatch):
    # Fwd.VBLK only for tiles spanning pages of whole 16-key MFMA blocks, a power-of-two V
    # head dim, bf16 / fp16 (klanes) and the tables that set it (gfx950 d128); the launch
    # drops it for V strides above BASED_STRIDE_MAX or a last page past PAGE_OFFSET_MAX, and
    # the cache is then read by the plain gather, with the same results
    p = plan.Problem(64, 1, 8192, 32, 8, 128, 128, causal=True, seqused=True, page_size=16,
                     decode=True)  # fmt: skip
    for t, want in (("gfx950", 32), ("gfx942", 0), ("gfx1250", 0), ("sm90", 0)):
        got = plan.plan_forward(p, t).C.VBLK
        assert got == want, t
    for page, want in ((4, 0), (8, 0), (16, 32), (32, 32), (64, 0), (256, 0)):
        got = plan.plan_forward(replace(p, page_size=page), "gfx950").C.VBLK
        assert got == want, page
    assert plan.plan_forward(replace(p, page_size=0), "gfx950").C.VBLK == 0
    assert plan.plan_forward(replace(p, head_dim=64, head_dim_v=64), "gfx950").C.VBLK == 0
    assert plan.plan_forward(replace(p, dtype="fp32"), "gfx950").C.VBLK == 0
    assert plan.plan_forward(replace(p, decode=False), "gfx950").C.VBLK == 0
    cfg = configs.Config(16, 64, 1, 1, 16, lazy=False, klanes=8, lane_sums=True, vblk=32)
    odd = replace(p, head_dim=96, head_dim_v=96)  # V in two chunks (64 + 32): not blocks
    assert plan.plan_forward(odd, REF, config=cfg).C.VBLK == 0
    c = _paged_decode(151, 4, 16, [192, 65])
    fp = plan.plan_forward(c.p, REF, config=cfg)
    vblk = lambda v: fp.launches(k=c.kc, v=v, **c.kw)[0].constexprs["C"].VBLK  # noqa: E731
    vc = c.vc
    assert vblk(vc) == 32
    last = (vc.shape[0] - 1) * vc.stride(0)
    monkeypatch.setattr(plan, "PAGE_OFFSET_MAX", last - 1)
    assert vblk(vc) == 0
    monkeypatch.setattr(plan, "PAGE_OFFSET_MAX", last)
    assert vblk(vc) == 32
    monkeypatch.setattr(plan, "BASED_STRIDE_MAX", 64)  # V's row stride is 128
    assert vblk(vc) == 0
    _check_paged_decode(c, vc, cfg)


def test_decode_v_offsets_from_k_strides_only_where_equal():
    # Fwd.VK_STRIDES: a BASED (one page per tile) or VBLK tile takes V's offsets from K's
    # stride arguments where the launch finds the strides equal, on buffer-load tables only;
    # a V cache with other strides (a padded head, a strided head dim) reads with its own
    c = _paged_decode(157, 3, 64, [150, 64])
    cfg = configs.Config(16, 64, 1, 1, 16, lazy=False, klanes=8, lane_sums=True)
    p = c.p
    for vv, same in (
        (c.vc, True),
        (_strided_cache(c.vc, 1, 1), False),
        (_strided_cache(c.vc, 0, 2), False),
    ):
        fp = plan.plan_forward(p, REF, config=cfg)
        lc = fp.launches(k=c.kc, v=vv, **c.kw)[0].constexprs["C"]
        assert lc.BASED and lc.VK_STRIDES is same
        _check_paged_decode(c, vv, cfg, f"same={same}", num_splits=2)
    assert not plan.plan_forward(p, "sm90", config=cfg).C.VK_STRIDES
    assert plan.plan_forward(p, "gfx942", config=cfg).C.VK_STRIDES
    assert not plan.plan_forward(replace(p, decode=False), REF).C.VK_STRIDES


def test_decode_lane_sums_are_the_amd_tables():
    # gfx950 / gfx942's one-warp decode tiles keep lane sums; gfx1250 / sm90 do not
    p = plan.Problem(64, 1, 8192, 32, 8, 128, 128, causal=True, seqused=True, page_size=16,
                     decode=True)  # fmt: skip
    for t, want in (("gfx950", True), ("gfx942", True), ("gfx1250", False), ("sm90", False)):
        assert plan.plan_forward(p, t).C.LANE_SUMS is want, t
    assert plan.plan_forward(replace(p, head_dim=64, head_dim_v=64), "gfx950").C.LANE_SUMS


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "bm, bn, d, g_, lazy, dtype, kw",
    [(32, 32, 80, 3, True, BF16, {"causal": True}),
     (64, 16, 200, 2, False, FP16, {"window_size": (37, 5)}),
     (16, 64, 128, 1, True, BF16, {"causal": True, "sinks": True})],
)  # fmt: skip
def test_prefill_lane_sums_match_the_reference(target, bm, bn, d, g_, lazy, dtype, kw):
    # Config.lane_sums on a prefill tile (gfx950's fwd d128 / d256 entries): per-lane partial
    # row sums (BM x 16) across the KV loop, summed after it; 77 queries over 93 keys end
    # inside a tile, GQA groups of 3 and 2, head dims 80 and 200 (a masked chunk), a causal
    # mask, a two-sided window (masked trips on both edges), a 16-key tile (one column block
    # per lane), sinks, the eager and the lazy rescale
    kw = dict(kw)
    q, k, v = qkv(2, 77, 93, 2 * g_, 2, d, seed=70 + d, dtype=dtype)
    sinks = torch.randn(2 * g_, generator=gen(71)) if kw.pop("sinks", False) else None
    cfg = configs.Config(bm, bn, max(1, bm // 16), 1, 16, lazy=lazy, lane_sums=True)
    out, lse, _ = flash_attn_func(
        q, k, v, return_attn_probs=True, sinks=sinks, target=target, config=cfg, **kw
    )
    ro, rl = reference.attention(q, k, v, sinks=sinks, **kw)
    close(out, ro, OUT_TOL[dtype], "out")
    close_lse(lse, rl)
    p = plan.Problem(2, 77, 93, 2 * g_, 2, d, d, causal=kw.get("causal", False),
                     window=kw.get("window_size", (-1, -1)), sinks=sinks is not None,
                     dtype="bf16" if dtype == BF16 else "fp16")  # fmt: skip
    assert plan.plan_forward(p, target, config=cfg).C.LANE_SUMS


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "bm, bn, d, dtype, kw",
    [(32, 16, 80, BF16, {}),
     (16, 32, 200, FP16, {"causal": True}),
     (64, 16, 128, BF16, {"window_size": (40, 9), "softcap": 20.0})],
)  # fmt: skip
def test_prefill_k_transposed_load_matches_the_reference(target, bm, bn, d, dtype, kw):
    # Config.k_t: interior KV tiles load K as K^T (common._load_kT, head dims x keys) and
    # masked ones row-major; 77 queries over 93 keys (the last tile masked), GQA 3:1, head
    # dims 80 (64 + a 16 chunk) and 200 (a chunk masked past the head dim), no mask (every
    # full tile interior), causal, a two-sided window with softcap; dense and varlen (keys at
    # a run-time offset per sequence)
    q, k, v = qkv(2, 77, 93, 6, 2, d, seed=80 + d, dtype=dtype)
    cfg = configs.Config(bm, bn, max(1, bm // 16), 1, 16, k_t=True)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, target=target, config=cfg, **kw)
    ro, rl = reference.attention(q, k, v, **kw)
    close(out, ro, OUT_TOL[dtype], "dense")
    close_lse(lse, rl)
    lens_q, lens_k = [31, 0, 46], [45, 17, 93]
    qp, kp, vp, cu_q, cu_k = _packed(lens_q, lens_k, 6, 2, d, seed=81, grad=False)
    outv = flash_attn_varlen_func(
        qp, kp, vp, cu_q, cu_k, max(lens_q), max(lens_k), target=target, config=cfg, **kw
    )
    rov, _ = reference.attention(qp, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
    close(outv, rov, OUT_TOL[BF16], "varlen")
    p = plan.Problem(2, 77, 93, 6, 2, d, d, causal=kw.get("causal", False),
                     window=kw.get("window_size", (-1, -1)))  # fmt: skip
    assert plan.plan_forward(p, target, config=cfg).C.KT
    pg = replace(p, page_size=16, seqused=True)
    assert not plan.plan_forward(pg, target, config=cfg).C.KT  # paged K: row-major


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize("kw", [{"window_size": (40, 9)}, {"causal": True}])
def test_prefill_k_transposed_edge_tiles_match_the_reference(target, kw):
    # Config.kt_edge: the unmasked edge tiles (past the left window bound only; right-bound
    # tiles below the key length, Fwd.SK_TAIL on d64) load K^T too, the tile crossing sk
    # row-major; 77 queries over 93 keys, 16 x 16 tiles (a window wider than the tile: left,
    # interior and right trips), GQA 3:1; dense and varlen (keys at a run-time offset)
    q, k, v = qkv(2, 77, 93, 6, 2, 64, seed=86)
    cfg = configs.Config(16, 16, 1, 1, 16, k_t=True, kt_edge=True, lane_sums=True)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, target=target, config=cfg, **kw)
    ro, rl = reference.attention(q, k, v, **kw)
    close(out, ro, OUT_TOL[BF16], "dense")
    close_lse(lse, rl)
    lens_q, lens_k = [31, 0, 46], [45, 17, 93]
    qp, kp, vp, cu_q, cu_k = _packed(lens_q, lens_k, 6, 2, 64, seed=87, grad=False)
    outv = flash_attn_varlen_func(
        qp, kp, vp, cu_q, cu_k, max(lens_q), max(lens_k), target=target, config=cfg, **kw
    )
    rov, _ = reference.attention(qp, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
    close(outv, rov, OUT_TOL[BF16], "varlen")
    p = plan.Problem(2, 77, 93, 6, 2, 64, 64, causal=kw.get("causal", False),
                     window=kw.get("window_size", (-1, -1)))  # fmt: skip
    C = plan.plan_forward(p, target, config=cfg).C
    assert C.KT and C.KT_EDGE and C.SK_TAIL


def test_prefill_k_transposed_is_the_tables():
    # gfx950 every class, gfx942 d64 / d128 / d256 and gfx1250 d64 / d128 load interior K as K^T
    want = {"gfx950": ("d64", "d128", "d192", "d256"), "gfx942": ("d64", "d128", "d256"),
            "gfx1250": ("d64", "d128"), "sm90": ()}  # fmt: skip
    for t, dcls in want.items():
        for dc in ("d64", "d128", "d192", "d256"):
            assert configs.TABLES[t][("fwd", dc)].k_t is (dc in dcls), (t, dc)
    # and on the unmasked edge tiles (kt_edge): d64 on gfx950 and gfx942 (gpt-oss's window tile)
    for t in want:
        for dc in ("d64", "d128", "d192", "d256"):
            edge = dc == "d64" and t in ("gfx950", "gfx942")
            assert configs.TABLES[t][("fwd", dc)].kt_edge is edge, (t, dc)


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "d, kpad, kstep, vpad, vstep, kw",
    [(64, 0, 1, 0, 1, {"causal": True}),
     (80, 1, 2, 1, 2, {"window_size": (37, 5)}),
     (128, 2, 1, 0, 3, {"softcap": 20.0, "causal": True})],
)  # fmt: skip
def test_prefill_based_loads_with_awkward_strides(target, d, kpad, kstep, vpad, vstep, kw):
    # Fwd.BASED on the prefill forward (a dense cache, the buffer-load tables: the CPU's
    # default is gfx950's): K and V load with load_at, the batch / first key / head as the
    # scalar base kept in the offsets (Fwd.FOLD_BASE False), per-element offsets from clamped
    # row and head-dim strides, V's from K's stride arguments where they are equal
    # (Fwd.VK_STRIDES). Rows padded by 1 or 2 heads and head dims strided by 2 or 3, K's and
    # V's strides equal or not; 77 queries over 93 keys (tiles ending inside the sequence),
    # GQA 3:1, K^T interior tiles, masked trips on both window edges, softcap; dense and varlen
    q, k, v = qkv(2, 77, 93, 6, 2, d, seed=90 + d)
    ks, vs = _strided_cache(k, kpad, kstep), _strided_cache(v, vpad, vstep)
    cfg = configs.Config(32, 16, 2, 1, 16, k_t=True, lane_sums=True)
    out, lse, _ = flash_attn_func(
        q, ks, vs, return_attn_probs=True, target=target, config=cfg, **kw
    )
    ro, rl = reference.attention(q, k, v, **kw)
    close(out, ro, OUT_TOL[BF16], "dense")
    close_lse(lse, rl)
    lens_q, lens_k = [31, 0, 46], [45, 17, 93]
    qp, kp, vp, cu_q, cu_k = _packed(lens_q, lens_k, 6, 2, d, seed=91, grad=False)
    kps = _strided_cache(kp[None], kpad, kstep)[0]
    vps = _strided_cache(vp[None], vpad, vstep)[0]
    outv = flash_attn_varlen_func(
        qp, kps, vps, cu_q, cu_k, max(lens_q), max(lens_k), target=target, config=cfg, **kw
    )
    rov, _ = reference.attention(qp, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
    close(outv, rov, OUT_TOL[BF16], "varlen")
    p = plan.Problem(2, 77, 93, 6, 2, d, d, causal=kw.get("causal", False),
                     window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0))  # fmt: skip
    fp = plan.plan_forward(p, target, config=cfg)
    assert fp.C.BASED and not fp.C.FOLD_BASE
    lc = fp.launches(q=q, k=ks, v=vs, o=q, lse=lse)[0].constexprs["C"]
    assert lc.BASED and lc.VK_STRIDES is ((kpad, kstep) == (vpad, vstep))


def test_prefill_based_loads_are_the_buffer_tables_and_fall_back(monkeypatch):
    # the prefill forward loads K and V from a scalar base on the AMD (buffer-load) tables
    # only, over a dense cache (a paged one keeps its page loads), unfolded (decode folds its
    # base into the buffer descriptor); strides above common.BASED_STRIDE_MAX (lowered here)
    # drop it at the launch, with the same results
    p = plan.Problem(2, 77, 93, 6, 2, 64, 64, causal=True)
    for t, want in (("gfx950", True), ("gfx942", True), ("gfx1250", True), ("sm90", False)):
        C = plan.plan_forward(p, t).C
        assert C.BASED is want and C.VK_STRIDES is want, t
        assert C.FOLD_BASE is not want, t
    paged = replace(p, page_size=64, seqused=True)
    assert not plan.plan_forward(paged, "gfx950").C.BASED
    dec = replace(p, seqlen_q=1, page_size=64, seqused=True, decode=True)
    assert plan.plan_forward(dec, "gfx950").C.FOLD_BASE
    q, k, v = qkv(2, 77, 93, 6, 2, 64, seed=95)
    cfg = configs.Config(32, 16, 2, 1, 16, k_t=True)
    fp = plan.plan_forward(p, REF, config=cfg)
    lse = torch.empty(2, 6, 77)
    assert fp.launches(q=q, k=k, v=v, o=q, lse=lse)[0].constexprs["C"].BASED  # row stride 128
    monkeypatch.setattr(plan, "BASED_STRIDE_MAX", 64)
    assert not fp.launches(q=q, k=k, v=v, o=q, lse=lse)[0].constexprs["C"].BASED
    out, lse = flash_attn_func(q, k, v, causal=True, return_attn_probs=True, target=REF,
                               config=cfg)[:2]  # fmt: skip
    ro, rl = reference.attention(q, k, v, causal=True)
    close(out, ro, OUT_TOL[BF16], "fallback")
    close_lse(lse, rl)


@pytest.mark.parametrize("target", [REF, INTERP])
@pytest.mark.parametrize(
    "q_head_major, kpad, kstep, vpad, vstep, kw",
    [(False, 0, 1, 0, 1, {"causal": True}),
     (True, 1, 2, 1, 2, {"window_size": (37, 5)}),
     (False, 2, 1, 0, 3, {"softcap": 20.0, "causal": True})],
)  # fmt: skip
def test_backward_based_loads_with_awkward_strides(target, q_head_major, kpad, kstep, vpad, vstep,
                                                   kw):  # fmt: skip
    # Bwd.BASED (the AMD tables: the CPU's default is gfx950's): dK/dV loads Q and dO rows, dQ
    # K and V keys with load_at from a scalar base kept in the offsets, sharing them where the
    # launch finds the two tensors' strides equal (Bwd.SAME_STRIDES). Q stored head-major (not
    # dO's strides), K and V with padded rows and strided head dims, equal or not; GQA 3:1,
    # head dim 80 (a masked chunk), 77 queries over 93 keys, causal, a two-sided window, softcap
    q, k, v = qkv(2, 77, 93, 6, 2, 80, seed=96)
    if q_head_major:
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    k, v = _strided_cache(k, kpad, kstep), _strided_cache(v, vpad, vstep)
    for t in (q, k, v):
        t.requires_grad_()
    check_fwd_bwd(q, k, v, target, seed=97, **kw)
    p = plan.Problem(2, 77, 93, 6, 2, 80, 80, causal=kw.get("causal", False),
                     window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0))  # fmt: skip
    bp = plan.plan_backward(p, target, dkdv_config=C16, dq_config=C16)
    assert bp.C_dkdv.BASED and bp.C_dkdv.SAME_STRIDES and bp.C_dq.BASED and bp.C_dq.SAME_STRIDES
    do = torch.empty_like(q, memory_format=torch.contiguous_format)
    q5 = q.view(2, 77, 2, 3, 80)
    sp = dict(o=None, lse=None, ld=None, dq=None, dk=None, dv=None)
    _, dkdv, dql = bp.launches(q=q5, k=k, v=v, do=do.view(2, 77, 2, 3, 80), **sp)
    assert dkdv.constexprs["C"].BASED and dql.constexprs["C"].BASED
    assert dkdv.constexprs["C"].SAME_STRIDES is not q_head_major
    assert dql.constexprs["C"].SAME_STRIDES is ((kpad, kstep) == (vpad, vstep))


def test_backward_loads_follow_the_configs_and_tables(monkeypatch):
    # Config.bwd_loads: "shared" (the default), "own" offsets per tensor, or "view" loads; the
    # AMD tables only (sm90 never loads from a based pointer), and strides above
    # common.BASED_STRIDE_MAX (lowered here) drop it at the launch
    p = plan.Problem(2, 77, 93, 6, 2, 64, 64, causal=True)
    for bl, based, same in (("shared", True, True), ("own", True, False), ("view", False, False)):
        cfg = replace(C16, bwd_loads=bl)
        bp = plan.plan_backward(p, "gfx950", dkdv_config=cfg, dq_config=cfg)
        for C in (bp.C_dkdv, bp.C_dq):
            assert C.BASED is based and C.SAME_STRIDES is same, bl
    bp = plan.plan_backward(p, "sm90")
    assert not (bp.C_dkdv.BASED or bp.C_dq.BASED)
    d128 = replace(p, head_dim=128, head_dim_v=128)
    assert plan.plan_backward(d128, "gfx950").dkdv.bwd_loads == "own"
    assert plan.plan_backward(d128, "gfx942").dq.bwd_loads == "own"
    assert plan.plan_backward(d128, "gfx1250").dkdv.bwd_loads == "shared"
    d256 = replace(p, head_dim=256, head_dim_v=256)
    assert not plan.plan_backward(d256, "gfx942").C_dq.BASED
    q, k, v = qkv(2, 77, 93, 6, 2, 64, seed=98)
    bp = plan.plan_backward(p, REF, dkdv_config=C16, dq_config=C16)
    sp = dict(o=None, lse=None, ld=None, dq=None, dk=None, dv=None)
    q5 = q.view(2, 77, 2, 3, 64)
    assert all(lc.constexprs["C"].BASED for lc in bp.launches(q=q5, k=k, v=v, do=q5, **sp)[1:])
    monkeypatch.setattr(plan, "BASED_STRIDE_MAX", 64)
    assert not any(lc.constexprs["C"].BASED for lc in bp.launches(q=q5, k=k, v=v, do=q5, **sp)[1:])
    for t in (q, k, v):
        t.requires_grad_()
    check_fwd_bwd(q, k, v, REF, seed=99, causal=True)


def test_prefill_lane_sums_are_gfx950s_entries():
    # gfx950's fwd tiles keep per-lane row sums; the other targets' forward entries and the
    # score / mask mod tile (configs.mod_config) do not
    for dcls in ("d64", "d128", "d192", "d256"):
        assert configs.TABLES["gfx950"][("fwd", dcls)].lane_sums, dcls
        for t in ("gfx942", "gfx1250", "sm90"):
            assert not configs.TABLES[t][("fwd", dcls)].lane_sums, (t, dcls)
    assert not configs.mod_config(configs.TABLES["gfx950"][("fwd", "d128")]).lane_sums
    p = plan.Problem(4, 4096, 4096, 32, 8, 128, 128, causal=True)
    assert plan.plan_forward(p, "gfx950").C.LANE_SUMS
    assert not plan.plan_forward(p, "gfx942").C.LANE_SUMS


def test_decode_k_lane_order_is_the_tables_and_skips_fp32():
    # gfx950 / gfx942 decode tables load K in their MFMA's lane order (k width 8 / 4); fp32
    # operands (other MFMAs) and gfx1250 / sm90 keep the plain load
    p = plan.Problem(64, 1, 8192, 32, 8, 128, 128, causal=True, seqused=True, page_size=16,
                     decode=True)  # fmt: skip
    assert plan.plan_forward(p, "gfx950").C.KLANES == 8
    assert plan.plan_forward(p, "gfx950").C.BN == 64  # 4 pages of 16 per tile
    assert plan.plan_forward(p, "gfx942").C.KLANES == 4
    for t in ("gfx1250", "sm90"):
        fp = plan.plan_forward(p, t)
        assert fp.C.KLANES == 0 and fp.C.BN == 16  # a tile within a page
    assert plan.plan_forward(replace(p, dtype="fp32"), "gfx950").C.KLANES == 0


def test_kvcache_batch_idx_and_int_seqlens():
    g = gen(29)
    q = rand(2, 3, 2, 32, g=g)
    kc, vc = rand(4, 20, 2, 32, g=g), rand(4, 20, 2, 32, g=g)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=17, cache_batch_idx=idx, target=REF)
    ro, _ = reference.attention(q, kc[idx.long()], vc[idx.long()], seqused_k=torch.tensor([17, 17]))
    close(out, ro, OUT_TOL[BF16])


# -- mods --------------------------------------------------------------------------------------------------------


def _both_forms(native, modded, sq=29, sk=37, target=REF, seed=30, b=1):
    """The native flags and the same thing as mods give the same outputs and gradients."""
    q, k, v = qkv(b, sq, sk, 4, 2, 32, seed=seed, grad=True)
    do = rand(b, sq, 4, 32, g=gen(seed + 1))
    res = []
    for kw in (native, modded):
        out = flash_attn_func(q, k, v, target=target, config=SMALL if target == REF else None, **kw)
        res.append((out, *torch.autograd.grad(out, (q, k, v), do)))
    for a, b in zip(*res):
        close(a, b, 1e-2)
    return res


def test_causal_and_window_as_mask_mods_agree():
    off = 37 - 29
    _both_forms({"causal": True}, {"mask_mod": mods.causal_mask(off)})
    _both_forms({"window_size": (6, 2)}, {"mask_mod": mods.window_mask(6, 2, off)})


def test_alibi_and_softcap_as_score_mods_agree():
    off = 37 - 29
    slopes = torch.rand(1, 4, generator=gen(31))
    _both_forms(
        {"alibi_slopes": slopes},
        {"score_mod": mods.alibi_mod(off), "mod_tensors": (slopes,)},
    )
    _both_forms({"softcap": 2.5}, {"score_mod": mods.softcap_mod(2.5)})


def test_interpret_mods_agree():
    _both_forms(
        {"causal": True, "softcap": 2.0},
        {"mask_mod": mods.causal_mask(4), "score_mod": mods.softcap_mod(2.0)},
        sq=17,
        sk=21,
        target=INTERP,
    )


def test_custom_score_mod_reading_a_tensor_against_the_reference():
    # a learned relative-position bias table, read at (h, q_idx - kv_idx + 40)
    table = torch.randn(4, 81, generator=gen(32))

    def rel(score, b, h, q_idx, kv_idx, t):
        return score + t.gather(h, q_idx - kv_idx + 40).load()

    def rel_torch(s, b, h, q, kv):
        return s + table.double()[h, q - kv + 40]

    def even_heads_causal(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (h % 2 == 1)

    def mask_torch(b, h, q, kv):
        return (kv <= q) | (h % 2 == 1)

    q, k, v = qkv(2, 23, 23, 4, 2, 32, seed=33, grad=True)
    check_fwd_bwd(
        q, k, v, REF, score_mod=ScoreMod(rel, additive=True), mask_mod=MaskMod(even_heads_causal),
        mod_tensors=(table,), ref_kw={"score_mod": rel_torch, "mask_mod": mask_torch},
    )  # fmt: skip


@pytest.mark.parametrize(
    "table, d, dtype, causal, window",
    [
        # configs.TRACED_TILES, the forward's: sm90 d128 32 x 16 over 8 warps; gfx942 d256 64
        # rows over 4 warps
        ("sm90", 128, "fp32", False, (-1, -1)),
        ("gfx942", 256, "fp32", False, (-1, -1)),
        # the backward's: gfx950 dQ d128 16-row MFMAs, gfx942 dQ d64 16 keys; causal too
        ("gfx950", 128, "bf16", False, (-1, -1)),
        ("gfx942", 64, "bf16", False, (-1, -1)),
        ("gfx950", 64, "bf16", True, (-1, -1)),
        # configs.TRACED_WINDOW_TILES: the dQ's band level under a left bound
        ("gfx950", 64, "bf16", True, (15, 0)),
        ("gfx950", 128, "bf16", False, (20, -1)),
    ],
)
def test_score_mod_tiles_against_the_reference(table, d, dtype, causal, window):
    # a traced score mod's tiles take their own changes and compute the same attention
    bias = torch.randn(3, 61, generator=gen(34))

    def rel(score, b, h, q_idx, kv_idx, t):
        return score + t.gather(h, q_idx - kv_idx + 30).load()

    def rel_torch(s, b, h, q, kv):
        return s + bias.double()[h, q - kv + 30]

    sm = ScoreMod(rel, additive=True)
    p = plan.Problem(1, 31, 31, 3, 1, d, d, causal=causal, window=window, score_mod=sm, dtype=dtype)
    dcls = configs.dclass(d, d)
    if dtype == "fp32":
        want = configs.TRACED_TILES[table][("fwd", dcls, True)]
        c = plan.plan_forward(p, REF, table=table).config
    elif window[0] >= 0:
        level = plan.mod_band_tile("bwd_dq", p, table).num_warps
        want = configs.TRACED_WINDOW_TILES[table][("bwd_dq", dcls, False, level)]
        c = plan.plan_backward(p, REF, table=table).dq
    else:
        want = configs.TRACED_TILES[table][("bwd_dq", dcls, False)]
        c = plan.plan_backward(p, REF, table=table).dq
    assert {f: getattr(c, f) for f in want} == want
    dt = FP32 if dtype == "fp32" else BF16
    q, k, v = qkv(1, 31, 31, 3, 1, d, seed=35, grad=True, dtype=dt)
    check_fwd_bwd(
        q, k, v, REF, table=table, config=None, score_mod=sm, mod_tensors=(bias,),
        ref_kw={"score_mod": rel_torch}, causal=causal, window_size=window,
    )  # fmt: skip


@pytest.mark.parametrize(
    "table, d, sq, page, dtype, window",
    [
        ("gfx950", 64, 1, 16, BF16, (-1, -1)),  # decode: one query per head, a page per tile
        ("gfx950", 128, 5, 64, BF16, (-1, -1)),  # a few speculative queries
        ("gfx950", 192, 77, 256, FP32, (-1, -1)),  # a chunked prefill in fp32, wide pages
        ("sm90", 256, 77, 16, FP32, (-1, -1)),
        ("gfx942", 256, 1, 256, FP32, (-1, -1)),
        ("sm90", 128, 1, 16, BF16, (-1, -1)),
        # under a left bound: the band level's TRACED_WINDOW_PAGED_TILES changes
        ("gfx950", 192, 77, 256, FP32, (15, 0)),
        ("gfx942", 64, 1, 16, BF16, (127, 0)),
        ("gfx1250", 256, 77, 256, BF16, (62, 0)),
        ("sm90", 256, 77, 16, FP32, (15, 0)),
    ],
)
def test_traced_mods_over_a_paged_cache_against_the_reference(
    table, d, sq, page, dtype, window, monkeypatch
):
    # flash_attn_with_kvcache with a traced score mod (a captured per-head, per-key bias) and
    # mask mod over a paged cache in a random page order: the plan's tile (the mod tile with
    # its TRACED_TILES and TRACED_PAGED_TILES changes, capped at the page; under a left bound
    # the band level's TRACED_WINDOW_TILES and TRACED_WINDOW_PAGED_TILES ones) computes the
    # reference's attention and LSE
    g = gen(71 + page + d)
    B, H, Hk, S = 2, 4, 2, 256
    dv = 128 if d == 192 else d
    q = rand(B, sq, H, d, g=g, dtype=dtype)
    kfull, vfull = rand(B, S, Hk, d, g=g, dtype=dtype), rand(B, S, Hk, dv, g=g, dtype=dtype)
    bias = torch.randn(H, S, generator=g)
    lens = torch.tensor([256, 190], dtype=torch.int32)
    kc, vc, bt = _paged(kfull, vfull, page, g)

    def key_bias(score, b, h, q_idx, kv_idx, t):
        return score + t.gather(h, kv_idx).load()

    def odd_keys_even_heads(b, h, q_idx, kv_idx):
        return (kv_idx % 3 != 1) | (h % 2 == 0)

    seen, real = [], plan.plan_forward
    monkeypatch.setattr(
        plan, "plan_forward", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]
    )
    out, lse = flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, block_table=bt, causal=True, return_softmax_lse=True,
        score_mod=ScoreMod(key_bias, additive=True), mask_mod=MaskMod(odd_keys_even_heads),
        mod_tensors=(bias,), target=REF, table=table, window_size=window,
    )  # fmt: skip
    ro, rl = reference.attention(
        q, kfull, vfull, causal=True, seqused_k=lens, window_size=window,
        score_mod=lambda s, b, h, qi, ki: s + bias.double()[h, ki],
        mask_mod=lambda b, h, qi, ki: (ki % 3 != 1) | (h % 2 == 0),
    )  # fmt: skip
    close(out, ro, OUT_TOL[dtype])
    close_lse(lse, rl)
    fp = seen[0]
    assert fp.problem.page_size == page and fp.problem.dtype == attn_api._DNAME[dtype]
    keys = fp.config.BN  # plan.page_tile: the key tile capped at the page
    assert fp.config.klanes or keys <= max(page, 16)
    kind = "decode" if fp.problem.decode else "fwd"
    dcls, f32 = configs.dclass(d, dv), dtype == FP32
    want = configs.TRACED_PAGED_TILES[table].get((kind, dcls, f32), {})
    if window[0] >= 0:  # the level the tile reached before its changes
        level = plan.mod_band_tile(kind, fp.problem, table).num_warps
        want = configs.TRACED_WINDOW_PAGED_TILES[table][(kind, dcls, f32, level)]
    assert {f: getattr(fp.config, f) for f in want if f != "BN"} == {
        f: v for f, v in want.items() if f != "BN"
    }


def test_score_mod_without_gradient_is_a_clear_error():
    q, k, v = qkv(1, 8, 8, 2, 2, 32, seed=34, grad=True)
    out = flash_attn_func(q, k, v, score_mod=lambda s, b, h, qi, ki: s * 2.0, target=REF)
    with pytest.raises(NotImplementedError, match="no gradient"):
        out.sum().backward()


# -- schedules: the rules at their boundaries -------------------------------------------------------------------


def test_split_rule_boundaries():
    cus, k = 256, configs.MIN_KEYS_PER_SPLIT
    assert configs.splits_for(cus // 2, 100_000, cus) == 1  # enough programs
    assert configs.splits_for(cus // 2 - 1, 100_000, cus) == 3  # ceil(256 / 127)
    assert configs.splits_for(1, 2 * k - 1, cus) == 1  # too short to share
    assert configs.splits_for(1, 2 * k, cus) == 2
    assert configs.splits_for(1, 5 * k + 7, cus) == 5  # every split keeps >= k keys
    assert configs.splits_for(1, 10**6, cus) == configs.MAX_SPLITS
    assert configs.splits_for(8, 10**6, cus) == 16
    assert configs.splits_for(64, 10**6, cus) == 4


def test_split_count_follows_the_sequence_length_not_the_tile():
    def splits(ctx, page, window=(-1, -1)):
        p = plan.Problem(1, 1, ctx, 64, 8, 128, 128, causal=True, seqused=True,
                         page_size=page, decode=True, window=window)  # fmt: skip
        return plan.plan_forward(p, "gfx950").splits

    assert splits(2048, 16) == splits(2048, 256) == 4  # 8 programs, 2048 keys: 4 x 512
    assert splits(131072, 16) == splits(131072, 64) == configs.MAX_SPLITS
    assert splits(1000, 16) == 1
    assert splits(131072, 64, window=(127, 0)) == 1  # a row walks 128 keys, not 131072


def test_persistent_rule_boundaries():
    cus = 256
    assert configs.persistent_programs(cus - 1, cus, True) == 0
    assert configs.persistent_programs(cus, cus, True) == cus
    assert configs.persistent_programs(configs.PERSIST_WAVES * cus - 1, cus, True) == cus
    assert configs.persistent_programs(configs.PERSIST_WAVES * cus, cus, True) == 0
    assert configs.persistent_programs(2 * cus, cus, False) == 0  # uniform tiles


def test_decode_packing_rule_boundaries():
    assert configs.packs_heads(1, 1) and configs.packs_heads(64, 1)  # MHA: the decode tile
    assert not configs.packs_heads(65, 1)
    assert configs.packs_heads(1, 8)
    assert configs.packs_heads(8, 8) and not configs.packs_heads(9, 8)  # 8 * 8 = 64 rows max
    assert configs.decode_rows(16, 1, 8) == 16
    assert configs.decode_rows(16, 4, 8) == 32
    assert configs.decode_rows(16, 64, 8) == 64
    assert configs.decode_rows(16, 1, 128) == 128  # a group larger than the row cap


def test_band_config_makes_the_window_wider_than_the_tile():
    c = configs.Config(256, 64, 8, 1, 32, lazy=False)
    assert configs.band_config("fwd", c, None) is c  # no two-sided window
    assert configs.band_config("fwd", c, 4096) is c  # a wide one
    small = configs.band_config("fwd", c, 128)  # gpt-oss: 128 keys per query
    assert (small.BM, small.BN, small.num_warps) == (64, 64, 2)  # 32 rows per warp kept
    dk = configs.band_config("bwd_dkdv", configs.Config(64, 128, 8, 1, 16), 128)
    assert (dk.BM, dk.BN, dk.num_warps) == (64, 64, 4)
    # then 32 keys per warp: query rows per step traded for them, down to 16 rows
    dk = configs.band_config("bwd_dkdv", configs.Config(64, 128, 8, 1, 16), 128, 32)
    assert (dk.BM, dk.BN, dk.num_warps) == (32, 64, 2)
    dk = configs.band_config("bwd_dkdv", configs.Config(16, 128, 8, 1, 16), 128, 32)
    assert (dk.BM, dk.BN, dk.num_warps) == (16, 64, 4)
    c = configs.Config(64, 128, 8, 1, 16)
    assert configs.band_config("bwd_dkdv", c, 4096, 32) is c  # a wide window: the table's
    assert configs.band_warp_keys("gfx950", "d64") == 32
    assert configs.band_warp_keys("gfx950", "d128") == 0
    assert configs.band_warp_keys("gfx1250", "d64") == 0
    p = plan.Problem(4, 4096, 4096, 64, 8, 64, 64, causal=True, window=(127, 0), sinks=True)
    fp = plan.plan_forward(p, "gfx950")
    assert fp.C.BM + fp.C.BN <= 129 and not fp.C.NARROW  # no tile crosses both bounds
    bp = plan.plan_backward(p, "gfx950")
    assert not bp.C_dq.NARROW and not bp.C_dkdv.NARROW
    assert (bp.dkdv.BM, bp.dkdv.BN, bp.dkdv.num_warps) == (32, 64, 2)


def test_window_config_takes_its_level_changes_under_a_left_bound(monkeypatch):
    # configs.WINDOW_TILES: by (kind, dclass, the warps band_config left), only with a left
    # window bound (its edge loops are what the table's tile had no room for)
    base = configs.Config(256, 64, 8, 1, 32, lane_sums=True)
    tiles = {("fwd", "d128", 2): {"lane_sums": False}, ("fwd", "d128", 8): {"BN": 32}}
    monkeypatch.setitem(configs.WINDOW_TILES, "gfx950", tiles)
    c = configs.window_config("fwd", base, (127, 0), "d128", "gfx950")
    assert (c.BM, c.BN, c.num_warps, c.lane_sums) == (64, 64, 2, False)
    c = configs.window_config("fwd", base, (4095, 0), "d128", "gfx950")  # no shrink, level 8
    assert (c.BM, c.BN, c.num_warps, c.lane_sums) == (256, 32, 8, True)
    c = configs.window_config("fwd", base, (255, 0), "d128", "gfx950")  # a level without
    assert (c.BM, c.BN, c.num_warps, c.lane_sums) == (128, 64, 4, True)
    assert configs.window_config("fwd", base, (-1, 0), "d128", "gfx950") is base  # causal
    assert configs.window_config("fwd", base, (127, 0), "d64", "gfx950").lane_sums  # class
    assert configs.window_config("bwd_dq", base, (127, 0), "d128", "gfx950").lane_sums  # kind
    # the default table (None, the CPU backends) is gfx950's; the plan applies it (forward and
    # backward)
    assert not configs.window_config("fwd", base, (127, 0), "d128", None).lane_sums
    p = plan.Problem(2, 512, 512, 8, 2, 128, 128, causal=True, window=(127, 0))
    assert not plan.plan_forward(p, "gfx950").config.lane_sums
    assert plan.plan_forward(replace(p, window=(-1, -1)), "gfx950").config.BN == 64
    # fp32's tile (half the keys) takes configs.FP32_TILES' changes instead: these were
    # chosen for the 16-bit table's tile
    monkeypatch.setitem(configs.FP32_TILES, "gfx950", {})
    c = plan.plan_forward(replace(p, dtype="fp32"), "gfx950").config
    assert c.num_warps == 2 and c.lane_sums, c
    # a page's takes them, and configs.PAGED_TILES' on top (by score term, level and left
    # bound), its keys capped at the page after them
    paged = {("fwd", "d128", "", 2, True): {"BN": 32, "sched": ""}}
    monkeypatch.setitem(configs.PAGED_TILES, "gfx950", paged)
    c = plan.plan_forward(replace(p, page_size=16, seqused=True), "gfx950").config
    assert (c.BM, c.BN, c.num_warps, c.lane_sums, c.sched) == (64, 16, 2, False, "")
    c = plan.plan_forward(replace(p, page_size=64, seqused=True), "gfx950").config
    assert (c.BM, c.BN, c.lane_sums, c.sched) == (64, 32, False, "")
    tiles[("bwd_dq", "d128", 4)] = {"BN": 16}
    assert plan.plan_backward(replace(p, window=(255, 0)), "gfx950").dq.BN == 16


def test_fp32_tiles_take_their_level_changes(monkeypatch):
    # configs.FP32_TILES: by (kind, dclass, score term, the warps of fp32's tile after the
    # window's shrink, left bound), instead of WINDOW_TILES / MOD_TILES / PAGED_TILES; a score
    # term's changes on top of the level's plain ones
    tiles = {
        ("fwd", "d128", "", 2, True): {"BN": 16},
        ("fwd", "d128", "", 8, False): {"num_warps": 4, "sched": "coexec"},
        ("fwd", "d128", "softcap", 8, False): {"BM": 128, "sched": ""},
        ("bwd_dq", "d128", "", 8, False): {"BM": 128},
        ("bwd_dq", "d128", "alibi", 8, False): {"num_warps": 4},
        ("decode", "d128", "", 1, False): {"num_stages": 2},
    }
    monkeypatch.setitem(configs.FP32_TILES, "gfx950", tiles)
    monkeypatch.setitem(configs.WINDOW_TILES, "gfx950", {("fwd", "d128", 2): {"BN": 64}})
    monkeypatch.setitem(configs.MOD_TILES, "gfx950", {("fwd", "d128", "alibi", 8): {"BN": 64}})
    p = plan.Problem(2, 512, 512, 8, 2, 128, 128, causal=True, dtype="fp32")
    c = plan.plan_forward(p, "gfx950").config  # 256 x 32 (half the table's keys), 8 warps
    assert (c.BM, c.BN, c.num_warps, c.sched) == (256, 32, 4, "coexec"), c
    c = plan.plan_forward(replace(p, alibi=True), "gfx950").config  # not MOD_TILES'
    assert (c.BN, c.num_warps) == (32, 4), c
    c = plan.plan_forward(replace(p, softcap=5.0), "gfx950").config  # softcap's on top
    assert (c.BM, c.BN, c.num_warps, c.sched) == (128, 32, 4, ""), c
    bp = plan.plan_backward(replace(p, alibi=True), "gfx950")
    assert (bp.dq.BM, bp.dq.num_warps) == (128, 4), bp.dq
    c = plan.plan_forward(replace(p, window=(127, 0)), "gfx950").config
    assert (c.BM, c.BN, c.num_warps) == (64, 16, 2), c
    c = plan.plan_forward(replace(p, window=(4095, 0)), "gfx950").config  # level 8, left
    assert (c.BM, c.BN, c.num_warps) == (256, 32, 8), c
    assert plan.plan_forward(replace(p, dtype="bf16"), "gfx950").config.BN == 64  # 16-bit
    assert plan.plan_backward(p, "gfx950").dq.BM == 128
    assert plan.plan_backward(replace(p, dtype="bf16"), "gfx950").dq.BM == 256
    d = replace(p, seqlen_q=1, decode=True, seqused=True, causal=False)
    assert plan.plan_forward(d, "gfx950").config.num_stages == 2
    assert plan.plan_forward(replace(d, dtype="bf16"), "gfx950").config.num_stages == 1


def test_fp32_paged_tiles_go_on_top_of_the_fp32_ones(monkeypatch):
    # configs.FP32_PAGED_TILES: an fp32 prefill over a paged cache, by (kind, dclass, score
    # term, level warps, left bound), on top of FP32_TILES' (plain and the term's), not
    # PAGED_TILES' (chosen for 16-bit operands); its keys capped at the page after them
    monkeypatch.setitem(configs.FP32_TILES, "gfx950", {("fwd", "d128", "", 2, True): {"BN": 16}})
    monkeypatch.setitem(configs.PAGED_TILES, "gfx950", {("fwd", "d128", "", 2, True): {"BM": 32}})
    paged = {
        ("fwd", "d128", "", 2, True): {"BN": 32, "num_warps": 4},
        ("fwd", "d128", "alibi", 8, False): {"BM": 128},
    }
    monkeypatch.setitem(configs.FP32_PAGED_TILES, "gfx950", paged)
    p = plan.Problem(2, 512, 512, 8, 2, 128, 128, causal=True, window=(127, 0), dtype="fp32")
    c = plan.plan_forward(p, "gfx950").config  # dense: FP32_TILES' alone
    assert (c.BM, c.BN, c.num_warps) == (64, 16, 2), c
    pg = replace(p, page_size=64, seqused=True)
    c = plan.plan_forward(pg, "gfx950").config
    assert (c.BM, c.BN, c.num_warps) == (64, 32, 4), c
    c = plan.plan_forward(replace(pg, page_size=16), "gfx950").config  # capped at the page
    assert (c.BM, c.BN, c.num_warps) == (64, 16, 4), c
    c = plan.plan_forward(replace(pg, dtype="bf16"), "gfx950").config  # 16-bit: PAGED_TILES'
    assert c.BM == 32, c
    # by score term and left bound: ALiBi's without a window, not the plain level's
    c = plan.plan_forward(replace(pg, window=(-1, -1), alibi=True), "gfx950").config
    assert (c.BM, c.BN) == (128, 32), c
    assert plan.plan_forward(replace(pg, window=(-1, -1)), "gfx950").config.BM == 256


def test_mod_tiles_go_on_top_of_the_window_tiles(monkeypatch):
    # configs.MOD_TILES: by (kind, dclass, score term, warps), with or without a window, over
    # WINDOW_TILES' changes; ALiBi's key before softcap's (configs.tile_mod)
    assert configs.tile_mod(True, True) == "alibi" and configs.tile_mod(False, True) == "softcap"
    assert configs.tile_mod(False, False) == ""
    base = configs.Config(256, 64, 8, 1, 32, lane_sums=True, k_t=True)
    monkeypatch.setitem(configs.WINDOW_TILES, "gfx950", {("fwd", "d128", 2): {"k_t": False}})
    mods = {("fwd", "d128", "alibi", 8): {"BN": 32}, ("fwd", "d128", "alibi", 2): {"k_t": True}}
    monkeypatch.setitem(configs.MOD_TILES, "gfx950", mods)
    mods[("fwd", "d128", "softcap", 2)] = {"lane_sums": False}
    c = configs.window_config("fwd", base, (-1, 0), "d128", "gfx950", mod="alibi")
    assert (c.BM, c.BN, c.k_t) == (256, 32, True)  # no window: the term's changes alone
    c = configs.window_config("fwd", base, (127, 0), "d128", "gfx950", mod="alibi")
    assert (c.BM, c.BN, c.k_t) == (64, 64, True)  # the term's over the window's
    c = configs.window_config("fwd", base, (127, 0), "d128", "gfx950", mod="softcap")
    assert (c.k_t, c.lane_sums) == (False, False)  # both
    assert configs.window_config("fwd", base, (-1, 0), "d128", "gfx950", mod="softcap") is base
    p = plan.Problem(2, 512, 512, 8, 2, 128, 128, causal=True, alibi=True)
    assert plan.plan_forward(p, "gfx950").config.BN == 32
    assert plan.plan_forward(replace(p, alibi=False), "gfx950").config.BN == 64
    mods[("bwd_dq", "d128", "softcap", 8)] = {"BN": 16}
    assert plan.plan_backward(replace(p, alibi=False, softcap=5.0), "gfx950").dq.BN == 16


def _crosses_both(sq, sk, rows, keys, left, right, mirrored):
    """Brute force: does some tile hold a (query, key) pair cut by the left window bound and
    another cut by the right bound (or the sequence's end)? (forward / dQ: query tiles x key
    tiles from the key range's first tile; ``mirrored``: dK/dV's key tiles x query tiles)."""
    off = sk - sq

    def cut(i, j):
        return (j < i + off - left, j > i + off + right or j >= sk)

    row_tiles = range(0, sq, rows) if not mirrored else range(0, sk, keys)
    for t0 in row_tiles:
        if not mirrored:
            qs = range(t0, min(t0 + rows, sq))
            lo = (max(t0 + off - left, 0) // keys) * keys
            hi = min(sk, max(qs[-1] + off + right + 1, 0))
            tiles = [range(n0, n0 + keys) for n0 in range(lo, hi, keys)]
            pairs = [[(i, j) for i in qs for j in t] for t in tiles]
        else:
            ks = range(t0, t0 + keys)
            lo = (max(t0 - off - right, 0) // rows) * rows
            hi = min(sq, max(t0 + keys - off + left, 0))
            tiles = [range(m0, min(m0 + rows, sq)) for m0 in range(lo, hi, rows)]
            pairs = [[(i, j) for i in t for j in ks if j < sk] for t in tiles]
        for ps in pairs:
            cuts = [cut(i, j) for i, j in ps]
            if any(c[0] for c in cuts) and any(c[1] for c in cuts):
                return True
    return False


@pytest.mark.parametrize("mirrored", [False, True])
def test_narrow_band_proof_is_sound(mirrored):
    # wherever some tile really crosses both bounds, the plan must keep that loop
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(
        sq=st.integers(1, 90), sk=st.integers(1, 90), rows=st.sampled_from([16, 32]),
        keys=st.sampled_from([16, 32]), left=st.integers(0, 70), right=st.integers(0, 40),
    )  # fmt: skip
    def check(sq, sk, rows, keys, left, right):
        plan._both_bounds_cross.cache_clear()
        proof = plan._both_bounds_cross(sq, sk, rows, keys, left, right, mirrored)
        if _crosses_both(sq, sk, rows, keys, left, right, mirrored):
            assert proof, (sq, sk, rows, keys, left, right)

    check()


def test_plan_picks_schedules_by_shape():
    p = plan.Problem(1, 1, 65536, 32, 8, 128, 128, decode=True, seqused=True)
    fp = plan.plan_forward(p, "gfx950")
    assert fp.C.GP == 4 and fp.splits > 1 and fp.grid[2] == fp.splits
    mid = plan.Problem(1, 4096, 4096, 32, 8, 128, 128, causal=True)  # 32 heads x 16 m-blocks
    mid_sm90 = plan.Problem(1, 1024, 1024, 32, 8, 128, 128, causal=True)  # 64-row tiles: 512
    fp = plan.plan_forward(mid_sm90, "sm90")  # 132 SMs: 512 tiles are 1 to 4 waves
    assert fp.persistent == 132 and fp.C.PERSIST and fp.grid == (132, 1, 1)
    # gfx950's d128 entry leaves the persistent grid off (Config.persist: its kernel spilled)
    assert not plan.plan_forward(mid, "gfx950").persistent
    mid_gfx942 = plan.Problem(1, 4096, 4096, 32, 8, 256, 256, causal=True)
    assert plan.plan_forward(mid_gfx942, "gfx942").persistent == 304
    assert plan.plan_forward(plan.Problem(1, 4096, 4096, 32, 8, 128, 128), "sm90").persistent == 0
    assert (
        plan.plan_forward(
            plan.Problem(4, 8192, 8192, 32, 8, 128, 128, causal=True),
            "sm90",  # 4096 tiles
        ).persistent
        == 0
    )
    # one m-block per (batch, head): causal tiles cost the same, so no persistent grid (decode
    # B64 H32/8: 512 tiles, which the causal rule alone would walk persistently)
    dec = plan.Problem(64, 1, 8192, 32, 8, 128, 128, causal=True, seqused=True, page_size=16,
                       decode=True)  # fmt: skip
    fp = plan.plan_forward(dec, "gfx950")
    assert fp.persistent == 0 and not fp.C.PERSIST and fp.grid == (1, 64 * 8, 1)
    huge = plan.Problem(16, 8192, 8192, 32, 8, 128, 128, causal=True)
    fp = plan.plan_forward(huge, "gfx950")
    assert fp.persistent == 0 and fp.splits == 1 and fp.grid == (32, 16 * 32, 1)


@pytest.mark.parametrize("target", [REF, INTERP])
def test_persistent_and_split_prefill_match(target):
    b = 2 if target == REF else 1
    q, k, v = qkv(b, 40, 52, 4, 2, 32, seed=35)
    p, _ = attn_api._problem(
        "test", q, k, v, batch=b, sq=40, sk=52, causal=True, window_size=(-1, -1), softcap=0.0,
        softmax_scale=None, score_mod=None, mask_mod=None, mod_tensors=(),
    )  # fmt: skip
    ro, rl = reference.attention(q, k, v, causal=True)
    cfg = C16 if target == REF else configs.Config(32, 32, 4)
    for kw in ({"persistent": 5}, {"splits": 2}):
        o = torch.empty(b, 40, 4, 32, dtype=BF16)
        lse = torch.empty(b, 4, 40)
        fp = attn_api._forward(
            p, target, q.unflatten(2, (2, 2)), k, v, o.unflatten(2, (2, 2)), lse.view(b, 2, 2, 40),
            config=cfg, **kw,
        )  # fmt: skip
        assert fp.persistent == kw.get("persistent", 0) and fp.splits == kw.get("splits", 1)
        close(o, ro, OUT_TOL[BF16])
        close_lse(lse, rl)


# -- bad input ---------------------------------------------------------------------------------------------------


def test_errors_say_what_is_supported():
    q, k, v = qkv(1, 4, 4, 2, 1, 32, seed=36)
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(TypeError, match="bf16, fp16 and fp32"):
        flash_attn_func(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="multiple of nheads_k"):
        flash_attn_func(q, torch.cat([k, k, k], 2), torch.cat([v, v, v], 2))
    with pytest.raises(ValueError, match="head dims up to 256"):
        big = torch.zeros(1, 4, 1, 320, dtype=BF16)
        flash_attn_func(big, big, big)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_func(q, k, v, alibi_slopes=torch.zeros(3))
    with pytest.raises(ValueError, match="sinks"):
        flash_attn_func(q, k, v, sinks=torch.zeros(3))
    with pytest.raises(NotImplementedError, match="rotary"):
        flash_attn_with_kvcache(q, k, v, rotary_cos=torch.zeros(1), rotary_sin=torch.zeros(1))
    kc = torch.zeros(4, 24, 1, 32, dtype=BF16)
    with pytest.raises(ValueError, match="powers of two"):
        flash_attn_with_kvcache(q, kc, kc, block_table=torch.zeros(1, 2, dtype=torch.int32))


def test_family_lists_report_cases():
    cases = list(FAMILY.cases())
    assert cases and all(c.family == "attention" for c in cases)
    kernels = {c.kernel for c in cases}
    assert {"attn_fwd_kernel", "attn_combine_kernel", "attn_bwd_dkdv_kernel"} <= kernels
    fwd = next(c for c in cases if c.kernel == "attn_fwd_kernel" and "decode" not in c.shape)
    # each target reports its own table's config; the CPU backends report the default table's
    assert fwd.config_for("gfx942") != fwd.config_for("gfx950")
    assert fwd.config_for("cpu-interpret") == fwd.config_for("gfx950")


def test_table_target_is_separate_from_compile_target():
    # the table picks the tiles and the CU count the split rule sizes by; the compile target
    # only decides which compiler options the launch carries
    p = plan.Problem(1, 1000, 1000, 8, 8, 128, 128)
    cpu_sm90 = plan.plan_forward(p, INTERP, table="sm90")
    assert cpu_sm90.config == configs.select("fwd", 128, "sm90")
    assert cpu_sm90.options == {"num_warps": cpu_sm90.config.num_warps}
    assert plan.plan_forward(p, REF).config == configs.select("fwd", 128, "gfx950")
    assert "matrix_instr_nonkdim" in plan.plan_forward(p, "gfx950").options
    assert "matrix_instr_nonkdim" not in plan.plan_forward(p, "sm90").options
    dec = plan.Problem(4, 1, 65536, 32, 8, 128, 128, decode=True, seqused=True)  # 32 programs
    assert plan.plan_forward(dec, REF, table="sm90").splits == plan.plan_forward(dec, "sm90").splits
    assert plan.plan_forward(dec, "sm90").splits != plan.plan_forward(dec, "gfx950").splits
    bp = plan.plan_backward(p, INTERP, table="gfx942")
    assert bp.dkdv == configs.select("bwd_dkdv", 128, "gfx942")
    assert bp.dq.options(INTERP) == {"num_warps": bp.dq.num_warps}


# -- block sparsity ----------------------------------------------------------------------------------------------


def test_block_sparse_from_torch_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    def sliding(b, h, q, kv):
        return (kv <= q) & (q - kv < 40)

    bm = create_block_mask(sliding, 1, 2, 100, 100, device="cpu", BLOCK_SIZE=32, _compile=False)
    q, k, v = qkv(1, 100, 100, 2, 1, 32, seed=37, grad=True)
    check_fwd_bwd(
        q, k, v, REF, mask_mod=MaskMod(sliding), block_sparse=bm, ref_kw={"mask_mod": sliding}
    )


def _lists(per_block, n_blocks):
    """``(num (1, 1, n), idx (1, 1, n, n))`` int32 of ``{block: [listed blocks]}``."""
    num = torch.zeros(1, 1, n_blocks, dtype=torch.int32)
    idx = torch.zeros(1, 1, n_blocks, n_blocks, dtype=torch.int32)
    for blk, listed in per_block.items():
        num[0, 0, blk] = len(listed)
        idx[0, 0, blk, : len(listed)] = torch.tensor(listed, dtype=torch.int32)
    return num, idx


@pytest.mark.parametrize("target", [REF, INTERP])
def test_block_sparse_skips_unlisted_blocks_and_full_blocks_skip_the_mask_mod(target):
    # 2 x 2 blocks of 32: q block 0 visits kv block 1 (partial) and skips kv block 0, which the
    # mask mod would allow; q block 1 visits kv block 0 (partial) and kv block 1 as a full block,
    # where the mask mod (kv % 3 != 0) is not applied
    partial, full = {0: [1], 1: [0]}, {0: [], 1: [1]}
    tpartial, tfull = {0: [1], 1: [0]}, {0: [], 1: [1]}  # the transposed lists

    def every_third(b, h, q_idx, kv_idx):
        return kv_idx % 3 != 0

    dense = torch.zeros(64, 64, dtype=torch.bool)
    for qb in range(2):
        for kb in partial[qb]:
            dense[qb * 32 : qb * 32 + 32, kb * 32 : kb * 32 + 32] = (
                torch.arange(32) + kb * 32
            ) % 3 != 0
        for kb in full[qb]:
            dense[qb * 32 : qb * 32 + 32, kb * 32 : kb * 32 + 32] = True
    bs = BlockSparse(
        *_lists(partial, 2), *_lists(full, 2), *_lists(tpartial, 2), *_lists(tfull, 2), (32, 32)
    )
    q, k, v = qkv(1, 64, 64, 2, 1, 32, seed=38, grad=True)
    cfg = {"fwd": C16, "bwd_dkdv": C16, "bwd_dq": C16} if target == REF else None
    check_fwd_bwd(
        q, k, v, target, config=cfg, mask_mod=MaskMod(every_third), block_sparse=bs,
        ref_kw={"mask_mod": lambda b, h, qi, ki: dense[qi, ki]},
    )  # fmt: skip


def test_decode_group_that_is_not_a_power_of_two_and_varlen_paths():
    # G = 3 query heads per KV head: packed into 4-row head groups, the 4th masked everywhere
    g = gen(39)
    q = rand(2, 1, 6, 32, g=g)
    kc, vc = rand(2, 40, 2, 32, g=g), rand(2, 40, 2, 32, g=g)
    lens = torch.tensor([40, 9], dtype=torch.int32)
    sinks, slopes = torch.randn(6, generator=g), torch.rand(6, generator=g)
    kw = {"sinks": sinks, "alibi_slopes": slopes, "window_size": (20, 0)}
    out, lse = flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, return_softmax_lse=True, num_splits=2, target=REF, **kw
    )
    ro, rl = reference.attention(q, kc, vc, seqused_k=lens, **kw)
    close(out, ro, OUT_TOL[BF16])
    close_lse(lse, rl)
    # varlen with split-KV and with a paged cache (block_table)
    lens_q, lens_k = [3, 0, 20], [33, 5, 64]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 32, seed=40, grad=False)
    ro, rl = reference.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 20, 64, causal=True, num_splits=2, return_attn_probs=True,
        target=REF, config=C16,
    )  # fmt: skip
    close(out, ro, OUT_TOL[BF16])
    close_lse(lse, rl)
    page = 16
    dense_k = torch.zeros(3, 64, 2, 32, dtype=BF16)
    dense_v = torch.zeros(3, 64, 2, 32, dtype=BF16)
    for b in range(3):
        dense_k[b, : lens_k[b]] = k[cu_k[b] : cu_k[b + 1]]
        dense_v[b, : lens_k[b]] = v[cu_k[b] : cu_k[b + 1]]
    kc, vc, table = _paged(dense_k, dense_v, page, gen(41))
    out = flash_attn_varlen_func(
        q, kc, vc, cu_q, cu_k, 20, 64, causal=True, block_table=table, target=REF, config=C16
    )
    close(out, ro, OUT_TOL[BF16])


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_backward_from_kept_out_and_lse_equals_autograd(causal):
    # the functional backward (ATen-op style callers) runs the same kernels as autograd's
    from flydsl_kernels.attention import flash_attn_backward

    q, k, v = qkv(2, 19, 19, 4, 2, 32, seed=71, grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, target=REF)
    do = torch.randn(out.shape, generator=gen(72)).to(out.dtype)
    want = torch.autograd.grad(out, (q, k, v), do)
    got = flash_attn_backward(do, q.detach(), k.detach(), v.detach(), out.detach(), lse,
                              causal=causal, target=REF)  # fmt: skip
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("target", [REF, INTERP])
def test_backward_writes_every_gradient_row(monkeypatch, target):
    """dK / dV are allocated without a memset (``api._backward``): every key row must be stored
    by the kernels, zeros where no query reaches it. Every float ``torch.empty`` here is NaN, so
    a row left unwritten fails the comparison: no queries at all, keys no query's window
    reaches, a packed sequence with keys but no queries, and a key block no list names."""
    real_empty = torch.empty

    def nan_empty(*a, **kw):
        t = real_empty(*a, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)
    cfg = SMALL if target == REF else None
    q, k, v = qkv(1, 0, 6, 2, 1, 32, seed=60, grad=True)
    out = flash_attn_func(q, k, v, target=target, config=cfg)
    _, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert torch.equal(dk, torch.zeros_like(dk)) and torch.equal(dv, torch.zeros_like(dv))
    # keys 0..24 lie left of every query's window (bottom-right causal, 2 keys back)
    q, k, v = qkv(2, 5, 37, 2, 1, 32, seed=61, grad=True)
    check_fwd_bwd(q, k, v, target, config=cfg, causal=True, window_size=(2, 0))
    q, k, v, cu_q, cu_k = _packed([4, 0, 9], [7, 12, 5], 2, 1, 32, seed=62)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, target=target, config=cfg)
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ro, _ = reference.attention(*ins64, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    do = rand(*out.shape, g=gen(63))
    for a, r in zip(
        torch.autograd.grad(out, (q, k, v), do), torch.autograd.grad(ro, ins64, do.double())
    ):
        close(a, r, GRAD_TOL[BF16])
    # kv block 1 is in no q block's list: its dK / dV rows are zeros
    bs = BlockSparse(
        *_lists({0: [0], 1: [0]}, 2), *_lists({0: [], 1: []}, 2),
        *_lists({0: [0, 1], 1: []}, 2), *_lists({0: [], 1: []}, 2), (32, 32),
    )  # fmt: skip
    q, k, v = qkv(1, 64, 64, 2, 1, 32, seed=64, grad=True)
    dense = torch.zeros(64, 64, dtype=torch.bool)
    dense[:, :32] = True
    cfgs = {"fwd": C16, "bwd_dkdv": C16, "bwd_dq": C16} if target == REF else None
    check_fwd_bwd(
        q, k, v, target, config=cfgs, mask_mod=MaskMod(lambda b, h, qi, ki: ki >= 0),
        block_sparse=bs, ref_kw={"mask_mod": lambda b, h, qi, ki: dense[qi, ki]},
    )  # fmt: skip
