"""``torch_flydsl.flex_attention``: the translation, the fallbacks, the output layout, the
derived op table, determinism and torch.compile, on the CPU test backend.

torch's own test mods, case by case, are in ``test_flex_torch_suite.py``; misuse (bad block
lists, indices out of range, mask mods of the wrong type) in ``tests/robustness/test_flex_inputs.py``.
Forward results are compared with torch's eager flex_attention, gradients with a dense fp32
reference through torch's vmap of the same mods. bf16 inputs at awkward lengths (partial
blocks); tolerance ``max |ours - ref| / max |ref| <= 2e-2``.
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

from torch_flydsl.flex import mods, translate
from torch_flydsl.flex.program import evaluate

TOL = 2e-2
STAT = "flex_attention"


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def qkv(b, h, hk, sq, sk, d, seed, grad=True, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    mk = lambda hh, s: torch.randn(b, hh, s, d, generator=g).to(dtype)  # noqa: E731
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
    assert out.stride() == want.stride()
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


def test_document_mask_from_a_captured_id_tensor(cpu_backend):
    doc = torch.tensor([0] * 10 + [1] * 17 + [2] * 3 + [3] * 15)  # int64 ids, 45 tokens

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    bm = create_block_mask(document, None, None, 45, 45, device="cpu", BLOCK_SIZE=16)
    check(cpu_backend, *qkv(1, 2, 2, 45, 45, 32, seed=5), mask_mod=document, block_mask=bm)


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
    # (the gradient program holds in-place ops such as logical_and_)
    def mixed(s, b, h, q_idx, kv_idx):
        x = torch.sigmoid(s) * 4.0 + torch.clamp(s, min=-1.0, max=2.0) - torch.abs(s) / 3
        x = x + (q_idx % 5).to(torch.float32) * 0.1 - (kv_idx // 7) * 0.05
        return torch.where((q_idx - kv_idx) % 3 == 0, x, s * 0.5)

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

    with pytest.raises(translate.Unsupported, match="data-dependent"):
        mods.capture(branchy, None)


def test_max_scores_falls_back(cpu_backend):
    # torch's flex_attention decides (on the CPU it refuses max scores itself)
    q, k, v = qkv(1, 2, 2, 17, 17, 16, seed=11, grad=False)
    with pytest.raises(NotImplementedError, match="max scores"):
        cpu_backend.flex_attention(q, k, v, return_aux=AuxRequest(max_scores=True))
    assert cpu_backend.stats()[STAT]["fallbacks"] == {"params: max_scores": 1}


# -- output layout -----------------------------------------------------------------------------


@pytest.mark.parametrize("perm", [(0, 1, 2, 3), (0, 2, 1, 3), (1, 0, 2, 3), (2, 0, 1, 3),
                                  (0, 1, 3, 2)])  # fmt: skip
def test_output_strides_follow_torch(cpu_backend, perm):
    # torch's flex output keeps the query's stride order with the last dimension innermost
    # (``_permute_strides``): ``out.view(B, H * S, D)`` works where it works on torch's
    shape = (2, 3, 19, 16)
    inv = [perm.index(i) for i in range(4)]
    q, k, v = (torch.randn(*[shape[p] for p in perm]).bfloat16().permute(inv) for _ in range(3))
    out = cpu_backend.flex_attention(q, k, v)
    want = torch_flex(q, k, v)
    assert cpu_backend.stats()[STAT]["hits"] == 1
    assert out.stride() == want.stride()
    assert rel_err(out, want) <= TOL
    if perm == (0, 1, 2, 3):
        assert out.view(2, 3 * 19, 16).shape == (2, 57, 16)


def test_scale_zero_gives_torch_answer(cpu_backend):
    q, k, v = qkv(1, 2, 2, 19, 23, 16, seed=30, grad=False)
    for scale in (0.0, -0.5):
        cpu_backend.reset_stats()
        out = cpu_backend.flex_attention(q, k, v, scale=scale)
        assert cpu_backend.stats()[STAT]["hits"] == 1
        want = torch_flex(q, k, v, scale=scale)
        assert torch.isfinite(out.float()).all()
        assert rel_err(out, want) <= TOL


# -- the op table ------------------------------------------------------------------------------

#: pointwise ops torch's tests and common mods use, through the derived table (native by name,
#: torch's decompositions, or an identity for what FlyDSL has no function for)
OPS = {
    "tan": torch.tan, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
    "softplus": torch.nn.functional.softplus, "sign": torch.sign, "trunc": torch.trunc,
    "round": torch.round, "frac": torch.frac, "expm1": torch.expm1, "log1p": torch.log1p,
    "sinh": torch.sinh, "cosh": torch.cosh, "erfc": torch.erfc, "relu": torch.relu,
    "leaky_relu": torch.nn.functional.leaky_relu, "elu": torch.nn.functional.elu,
    "hardtanh": torch.nn.functional.hardtanh, "mish": torch.nn.functional.mish,
    "reciprocal": lambda x: torch.reciprocal(x + 3.0), "square": torch.square,
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 1), "log10": lambda x: torch.log10(x.abs() + 1),
    "sigmoid": torch.sigmoid, "hardsigmoid": torch.nn.functional.hardsigmoid,
    "clamp": lambda x: x.clamp(-0.5, 0.7), "fmod": lambda x: torch.fmod(x, 0.3),
    "remainder": lambda x: torch.remainder(x, 0.3), "nan_to_num": torch.nan_to_num,
    "logit": lambda x: torch.logit(torch.sigmoid(x), eps=1e-3), "lerp": lambda x: torch.lerp(
        x, x * x, 0.25),
    "xlogy": lambda x: torch.xlogy(x.abs(), x.abs() + 1), "exp2": torch.exp2,
}  # fmt: skip


@pytest.mark.parametrize("name", list(OPS))
def test_derived_op_table_translates_with_torch_semantics(name):
    # each op in a score mod: translated, and the program run on torch tensors gives the
    # mod's value (the kernels run the same instructions)
    f = OPS[name]

    def mod(score, b, h, q, kv):
        return f(score) + (q - kv) * 0.01

    m = mods.capture(mod, None)
    s = torch.linspace(-3, 3, 97)
    q = torch.arange(97, dtype=torch.int32) % 13
    kv = torch.arange(97, dtype=torch.int32) % 7
    zero = torch.zeros((), dtype=torch.int32)
    (got,) = evaluate(m.score, {"score": s, "b": zero, "h": zero, "q_idx": q, "kv_idx": kv}, [])
    torch.testing.assert_close(got, mod(s, zero, zero, q, kv), rtol=1e-5, atol=1e-5,
                               equal_nan=True)  # fmt: skip


def test_derived_op_table_on_the_kernels(cpu_backend):
    # one kernel with many derived ops in its mod, against torch, forward and backward
    def mod(s, b, h, q, kv):
        x = s * 0.5
        return (torch.tan(x * 0.3) + torch.nn.functional.silu(x) + torch.trunc(x) * 0.1
                + torch.nn.functional.softplus(x) - torch.sign(x) * torch.expm1(x * 0.1))  # fmt: skip

    check(cpu_backend, *qkv(1, 2, 2, 23, 29, 16, seed=31), score_mod=mod)


def test_selects_and_reductions_on_computed_values(cpu_backend):
    # a captured row per position (trailing dim 3): selected statically and by a computed
    # index, reduced, stacked and unbound; forward and backward on the kernels
    means = torch.randn(29, 3)

    def mod(s, b, h, q, kv):
        d = means[q] - means[kv]
        pick = d[h % 3]  # select by a computed index
        parts = torch.stack([d[0], d.amax(-1), d.mean()])
        a, bb, c = parts.unbind(0)
        return s + 0.1 * (pick + a * bb - c + d.square().sum(-1).sqrt())

    check(cpu_backend, *qkv(1, 3, 3, 23, 29, 16, seed=33), score_mod=mod)


# -- determinism ---------------------------------------------------------------------------------


def test_captured_tensor_gradients_are_deterministic(cpu_backend):
    bias = torch.randn(2, 2 * 37, requires_grad=True)
    gate = torch.randn(2, requires_grad=True)

    def mod(s, b, h, q, kv):
        return s * torch.sigmoid(gate[h]) + bias[h, q - kv + 37]

    q, k, v = qkv(2, 2, 2, 37, 37, 16, seed=32)
    runs = []
    for _ in range(2):
        out = cpu_backend.flex_attention(q, k, v, score_mod=mod)
        runs.append(torch.autograd.grad(out.float().square().sum(), (q, k, v, bias, gate)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_segment_sum_is_the_sorted_reduction():
    from flydsl_kernels.attention.mod_grads import segment_sum

    g = torch.Generator().manual_seed(3)
    vals = torch.randn(1000, generator=g)
    idx = torch.randint(0, 37, (1000,), generator=g)
    got = segment_sum(vals, idx, 40, target="cpu-reference")
    want = torch.zeros(40, dtype=torch.float64).index_add_(0, idx, vals.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert got[37:].abs().sum() == 0


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


def test_backend_flydsl_training_with_a_learned_bias_and_the_lse(cpu_backend, monkeypatch,
                                                                 no_fx_cache):  # fmt: skip
    # torch refuses flex_attention backward on CPU in its Python front (its kernels are GPU
    # ones); with that check lifted the compiled graph has both HOPs, which we rewrite: the
    # gradients to q, k, v, the learned bias and through the LSE match our eager autograd
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_validate_device", lambda *a: None)
    bias = torch.randn(2 * 37, requires_grad=True)

    def rel(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / 4.0) * 4.0 + bias[q_idx - kv_idx + 37]

    bm = create_block_mask(causal, None, None, 37, 37, device="cpu", BLOCK_SIZE=16)
    q, k, v = qkv(1, 4, 2, 37, 37, 32, seed=15)

    def f(q, k, v):
        return fa.flex_attention(q, k, v, score_mod=rel, block_mask=bm, enable_gqa=True,
                                 return_lse=True)  # fmt: skip

    torch._dynamo.reset()
    cpu_backend.reset_stats()
    out, lse = torch.compile(f, backend="flydsl", options={"device": "cpu"})(q, k, v)
    do = torch.randn_like(out)
    dl = torch.randn_like(lse)
    loss = lambda o, lse: (o.float() * do.float()).sum() + (lse * dl).sum()  # noqa: E731
    grads = torch.autograd.grad(loss(out, lse), (q, k, v, bias))
    assert cpu_backend.stats()["compile:flex_attention"] == {"calls": 2, "hits": 2,
                                                             "fallbacks": {}}  # fmt: skip
    w_out, w_lse = cpu_backend.flex_attention(q, k, v, score_mod=rel, block_mask=bm,
                                              enable_gqa=True, return_lse=True)  # fmt: skip
    wgrads = torch.autograd.grad(loss(w_out, w_lse), (q, k, v, bias))
    assert rel_err(out, w_out) <= TOL
    for a, b in zip(grads, wgrads):
        assert rel_err(a, b) <= TOL
