"""``torch_flydsl.flex_attention`` on the CPU test backend against torch's own flex_attention
(forward: torch's runs on CPU without autograd) and, for gradients, autograd through a dense
fp32 reference that applies the same mods with torch's vmap (``_vmap_for_bhqkv``).

bf16 inputs (the kernels take bf16 / fp16), awkward lengths (37, 45: partial blocks), fresh
random data; tolerance: max error / max |reference| <= 2e-2 (bf16 inputs and outputs).
"""

import math

import pytest
import torch
from torch.nn.attention.flex_attention import (
    AuxRequest,
    BlockMask,
    _vmap_for_bhqkv,
    create_block_mask,
)
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from torch_flydsl.flex import _fx

TOL = 2e-2
STAT = "flex_attention"


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def qkv(b, h, hk, sq, sk, d, seed, grad=True):
    g = torch.Generator().manual_seed(seed)
    mk = lambda hh, s: torch.randn(b, hh, s, d, generator=g).bfloat16()  # noqa: E731
    q, k, v = mk(h, sq), mk(hk, sk), mk(hk, sk)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def reference(q, k, v, score_mod=None, mask_mod=None):
    """Dense fp32 attention with torch's vmap of the mods (differentiable)."""
    B, H, Sq, D = q.shape
    G = H // k.shape[1]
    k, v = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(D)
    idx = [torch.arange(n, dtype=torch.int32) for n in (B, H, Sq, k.shape[2])]
    if score_mod is not None:
        s = _vmap_for_bhqkv(score_mod, prefix=(0,))(s, *idx)
    if mask_mod is not None:
        s = s.masked_fill(~_vmap_for_bhqkv(mask_mod, prefix=())(*idx), -math.inf)
    return s.softmax(-1) @ v


def check(tf, q, k, v, score_mod=None, mask_mod=None, block_mask=None, gqa=False, grad=True):
    """Ours against torch's flex_attention (forward) and the reference's gradients."""
    tf.reset_stats()
    out = tf.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)
    assert tf.stats()[STAT] == {"calls": 1, "hits": 1, "fallbacks": {}}
    want = torch_flex(q.detach(), k.detach(), v.detach(), score_mod=score_mod,
                      block_mask=block_mask, enable_gqa=gqa)  # fmt: skip
    assert out.shape == want.shape and out.dtype == want.dtype
    assert rel_err(out, want) <= TOL
    if not grad:
        return
    do = torch.randn_like(out)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), do)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = reference(qf, kf, vf, score_mod, mask_mod)
    assert rel_err(out, ref) <= TOL
    rq, rk, rv = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    for name, a, b in (("dq", gq, rq), ("dk", gk, rk), ("dv", gv, rv)):
        assert rel_err(a, b) <= TOL, name


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def test_causal_block_mask_with_full_blocks(cpu_backend):
    q, k, v = qkv(2, 3, 3, 45, 45, 32, seed=1)
    bm = create_block_mask(causal, None, None, 45, 45, device="cpu", BLOCK_SIZE=16)
    assert bm.full_kv_num_blocks is not None and int(bm.full_kv_num_blocks.sum()) > 0
    check(cpu_backend, q, k, v, mask_mod=causal, block_mask=bm)


def test_sliding_window_and_gqa(cpu_backend):
    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 11)

    q, k, v = qkv(1, 4, 2, 37, 37, 16, seed=2)
    bm = create_block_mask(window, 1, 4, 37, 37, device="cpu", BLOCK_SIZE=16)
    check(cpu_backend, q, k, v, mask_mod=window, block_mask=bm, gqa=True)


def test_alibi_from_a_captured_slope_tensor_with_gqa(cpu_backend):
    slopes = torch.rand(4) * 0.5

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    check(cpu_backend, *qkv(2, 4, 2, 37, 29, 32, seed=3), score_mod=alibi, gqa=True)


def test_tanh_softcap_has_its_gradient(cpu_backend):
    def softcap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / 2.0) * 2.0

    check(cpu_backend, *qkv(1, 2, 2, 33, 40, 64, seed=4), score_mod=softcap)


def test_document_mask_from_a_captured_id_tensor(cpu_backend):
    doc = torch.tensor([0] * 10 + [1] * 17 + [2] * 3 + [3] * 15)  # int64 ids, 45 tokens

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    bm = create_block_mask(document, None, None, 45, 45, device="cpu", BLOCK_SIZE=16)
    check(cpu_backend, *qkv(1, 2, 2, 45, 45, 32, seed=5), mask_mod=document, block_mask=bm)


def test_prefix_lm_with_a_per_batch_prefix_length(cpu_backend):
    prefix = torch.tensor([7, 20], dtype=torch.int32)

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < prefix[b]) | (q_idx >= kv_idx)

    bm = create_block_mask(prefix_lm, 2, None, 37, 37, device="cpu", BLOCK_SIZE=16)
    check(cpu_backend, *qkv(2, 2, 2, 37, 37, 32, seed=6), mask_mod=prefix_lm, block_mask=bm)


def test_relative_position_bias_table(cpu_backend):
    S = 29
    table = torch.randn(3, 2 * S - 1) * 0.5

    def rel_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + (S - 1)]

    check(cpu_backend, *qkv(1, 3, 3, S, S, 32, seed=7), score_mod=rel_bias)


def test_one_query_row_gqa_and_mods_sharing_a_captured_tensor(cpu_backend):
    # a decode-like single query row; the score and mask mods both read ``doc`` (one slot)
    doc = torch.tensor([0] * 20 + [1] * 25, dtype=torch.int32)
    bias = torch.randn(2) * 0.5

    def score(s, b, h, q_idx, kv_idx):
        return s + torch.where(doc[kv_idx] == 1, bias[h // 2], 0.0)

    def mask(b, h, q_idx, kv_idx):
        return doc[kv_idx] <= doc[q_idx + 44]

    bm = create_block_mask(mask, None, None, 1, 45, device="cpu", BLOCK_SIZE=16)
    check(cpu_backend, *qkv(2, 4, 2, 1, 45, 32, seed=14), score_mod=score, mask_mod=mask,
          block_mask=bm, gqa=True)  # fmt: skip


def test_masking_in_the_score_mod_and_a_mix_of_ops(cpu_backend):
    # -inf from the score mod; sigmoid / clamp / abs / % / // / casts and their gradients
    # (the joint graph holds in-place ops such as logical_and_)
    def causal_score(s, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, s, -float("inf"))

    def mixed(s, b, h, q_idx, kv_idx):
        x = torch.sigmoid(s) * 4.0 + torch.clamp(s, min=-1.0, max=2.0) - torch.abs(s) / 3
        x = x + (q_idx % 5).to(torch.float32) * 0.1 - (kv_idx // 7) * 0.05
        return torch.where((q_idx - kv_idx) % 3 == 0, x, s * 0.5)

    check(cpu_backend, *qkv(1, 2, 2, 29, 29, 32, seed=20), score_mod=causal_score,
          mask_mod=causal)  # fmt: skip
    check(cpu_backend, *qkv(1, 2, 2, 29, 31, 32, seed=21), score_mod=mixed)


def test_block_mask_without_full_blocks_and_torch_floor_semantics(cpu_backend):
    # every block partial (no full lists): the mask mod decides everywhere; its floor division
    # and remainder of negative numbers follow torch (not C's truncation)
    def stripes(b, h, q_idx, kv_idx):
        return ((q_idx - kv_idx) // 3) % 2 == 0

    n = 3  # 45 / 16 -> 3 blocks each way, all listed
    nb = torch.full((1, 1, n), n, dtype=torch.int32)
    idx = torch.arange(n, dtype=torch.int32).expand(1, 1, n, n).contiguous()
    bm = BlockMask.from_kv_blocks(nb, idx, BLOCK_SIZE=16, mask_mod=stripes, seq_lengths=(45, 45))
    assert bm.full_kv_num_blocks is None
    check(cpu_backend, *qkv(1, 2, 2, 45, 45, 32, seed=8), mask_mod=stripes, block_mask=bm)


def test_lse_matches_torch_including_rows_with_no_key(cpu_backend):
    def late(b, h, q_idx, kv_idx):
        return kv_idx < q_idx - 20  # queries 0..20 see nothing

    q, k, v = qkv(1, 2, 2, 37, 37, 32, seed=9, grad=False)
    bm = create_block_mask(late, None, None, 37, 37, device="cpu", BLOCK_SIZE=16)
    out, aux = cpu_backend.flex_attention(q, k, v, block_mask=bm, return_aux=AuxRequest(lse=True))
    want, waux = torch_flex(q, k, v, block_mask=bm, return_aux=AuxRequest(lse=True))
    assert cpu_backend.stats()[STAT]["hits"] == 1
    assert rel_err(out, want) <= TOL
    assert torch.equal(out[:, :, :21].float(), torch.zeros_like(out[:, :, :21]).float())
    assert torch.equal(torch.isinf(aux.lse), torch.isinf(waux.lse))
    live = ~torch.isinf(waux.lse)
    torch.testing.assert_close(aux.lse[live], waux.lse[live], rtol=1e-2, atol=1e-2)


def test_unsupported_mod_falls_back_with_the_reason(cpu_backend):
    def atan_mod(score, b, h, q_idx, kv_idx):
        return torch.atan(score)

    q, k, v = qkv(1, 2, 2, 21, 21, 16, seed=10, grad=False)
    out = cpu_backend.flex_attention(q, k, v, score_mod=atan_mod)
    st = cpu_backend.stats()[STAT]
    assert st["hits"] == 0 and st["calls"] == 1
    (reason,) = st["fallbacks"]
    assert reason.startswith("mod:") and "atan" in reason
    torch.testing.assert_close(out, torch_flex(q, k, v, score_mod=atan_mod))


def test_data_dependent_branch_is_unsupported():
    def branchy(score, b, h, q_idx, kv_idx):
        return score if q_idx > 3 else score * 2

    with pytest.raises(_fx.Unsupported, match="data-dependent"):
        _fx.capture(branchy, "score", _fx.Slots())


def test_captured_tensor_requiring_grad_falls_back(cpu_backend):
    bias = torch.randn(2, requires_grad=True)

    def learned(score, b, h, q_idx, kv_idx):
        return score + bias[h]

    q, k, v = qkv(1, 2, 2, 17, 17, 16, seed=11, grad=False)
    out = cpu_backend.flex_attention(q, k, v, score_mod=learned)
    (reason,) = cpu_backend.stats()[STAT]["fallbacks"]
    assert reason.startswith("grad: a captured tensor requires grad")
    assert out.requires_grad  # torch's flex_attention carries the bias gradient
    with torch.no_grad():  # no gradient wanted: ours runs
        cpu_backend.reset_stats()
        ours = cpu_backend.flex_attention(q, k, v, score_mod=learned)
        assert cpu_backend.stats()[STAT]["hits"] == 1
        assert rel_err(ours, out.detach()) <= TOL


def test_fp32_falls_back_to_torch(cpu_backend):
    q, k, v = (t.float() for t in qkv(1, 2, 2, 9, 9, 16, seed=12, grad=False))
    out = cpu_backend.flex_attention(q, k, v)
    assert cpu_backend.stats()[STAT]["fallbacks"] == {"dtype": 1}
    torch.testing.assert_close(out, torch_flex(q, k, v))


# -- torch.compile -------------------------------------------------------------------------------


def _compile_case():
    slopes = torch.rand(4) * 0.5

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    bm = create_block_mask(causal, None, None, 37, 37, device="cpu", BLOCK_SIZE=16)
    q, k, v = qkv(1, 4, 2, 37, 37, 32, seed=13, grad=False)
    return alibi, bm, q, k, v


def test_compiling_a_call_has_no_graph_break(cpu_backend):
    from torch._dynamo.testing import CompileCounterWithBackend

    alibi, bm, q, k, v = _compile_case()

    def f(q, k, v):
        return cpu_backend.flex_attention(q, k, v, score_mod=alibi, block_mask=bm,
                                          enable_gqa=True) * 2  # fmt: skip

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("eager")
    out = torch.compile(f, backend=cnt, fullgraph=True)(q, k, v)
    assert cnt.frame_count == 1
    hops = [n for n in cnt.graphs[0].graph.nodes if "FlexAttentionHOP" in str(type(n.target))]
    assert len(hops) == 1  # torch's HOP: what backend="flydsl" rewrites
    assert rel_err(out, f(q, k, v)) <= TOL


@pytest.fixture
def no_fx_cache():
    """Inductor compiles (and runs our pass) every time: a cached graph would skip the pass
    and its counters."""
    from torch._inductor import config

    with config.patch(fx_graph_cache=False):
        yield


def test_backend_flydsl_rewrites_the_hop_with_captured_buffers(cpu_backend, no_fx_cache):
    alibi, bm, q, k, v = _compile_case()

    def f(q, k, v):
        return torch_flex(q, k, v, score_mod=alibi, block_mask=bm, enable_gqa=True) * 2

    torch._dynamo.reset()
    cpu_backend.reset_stats()
    out = torch.compile(f, backend="flydsl", options={"device": "cpu"}, fullgraph=True)(q, k, v)
    assert cpu_backend.stats()["compile:flex_attention"] == {"calls": 1, "hits": 1,
                                                             "fallbacks": {}}  # fmt: skip
    want = cpu_backend.flex_attention(q, k, v, score_mod=alibi, block_mask=bm, enable_gqa=True)
    assert rel_err(out, want * 2) <= 1e-2
    assert (
        rel_err(out, torch_flex(q, k, v, score_mod=alibi, block_mask=bm, enable_gqa=True) * 2)
        <= TOL
    )


def test_backend_flydsl_rewrites_forward_and_backward_for_training(
    cpu_backend, monkeypatch, no_fx_cache
):
    # torch refuses flex_attention backward on CPU in its Python front (its kernels are GPU
    # ones); with that check lifted the compiled graph has both HOPs, which we rewrite, and
    # the gradients match our eager autograd (itself checked against the reference above; the
    # compiled mod graph may round differently: same tolerance)
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_validate_device", lambda *a: None)

    def softcap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / 4.0) * 4.0

    bm = create_block_mask(causal, None, None, 37, 37, device="cpu", BLOCK_SIZE=16)
    q, k, v = qkv(1, 4, 2, 37, 37, 32, seed=15)

    def f(q, k, v):
        return fa.flex_attention(q, k, v, score_mod=softcap, block_mask=bm, enable_gqa=True)

    torch._dynamo.reset()
    cpu_backend.reset_stats()
    out = torch.compile(f, backend="flydsl", options={"device": "cpu"})(q, k, v)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert cpu_backend.stats()["compile:flex_attention"] == {"calls": 2, "hits": 2,
                                                             "fallbacks": {}}  # fmt: skip
    want = cpu_backend.flex_attention(q, k, v, score_mod=softcap, block_mask=bm, enable_gqa=True)
    wgrads = torch.autograd.grad(want, (q, k, v), do)
    assert rel_err(out, want) <= TOL
    for a, b in zip(grads, wgrads):
        assert rel_err(a, b) <= TOL
