"""PyTorch's own flex_attention test mods, served by ``torch_flydsl.flex_attention``.

The table ``CASES`` follows ``test/inductor/test_flex_attention.py`` of the PyTorch repository
(its score mods, mask mods, block masks, captured buffers, learnable biases and LSE cases),
rewritten here at tiny shapes for the CPU backend: sequence lengths 37 / 19 (partial blocks),
head dim 16, batch 2, 2 heads. Each case asserts:

* the FlyDSL path ran (a hit, no fallback recorded);
* the forward equals torch's eager flex_attention (torch's math path on the CPU);
* the gradients (q, k, v, the captured tensors that require grad, and through the LSE where the
  case returns it) equal an fp64 dense reference with autograd (torch has no flex backward on
  the CPU; the dense formulation with the same mods gives them).

``test_served_fraction`` plans every case (translation, BlockMask normalization, index checks,
gradient programs; no launch) and asserts at least 95% are served, printing the rest with
their reasons. Tolerances: ``max |ours - ref| / max |ref|`` <= 2e-2 for bf16 (bf16 inputs and
outputs), 2e-4 for fp32.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import pytest
import torch
from torch.nn.attention.flex_attention import (
    BlockMask,
    _vmap_for_bhqkv,
    and_masks,
    create_block_mask,
    noop_mask,
)
from torch.nn.attention.flex_attention import flex_attention as torch_flex

STAT = "flex_attention"
S = 37
D = 16
TOL = {torch.bfloat16: 2e-2, torch.float32: 2e-4}


# -- torch's score and mask mods (test_flex_attention.py) ---------------------------------------


def _identity(score, b, h, m, n):
    return score


def _times_two(score, b, h, m, n):
    return score * 2


def _squared(score, b, h, m, n):
    return score * score


def _causal(score, b, h, q, kv):
    return torch.where(q >= kv, score, float("-inf"))


def _inverse_causal(score, b, h, m, n):
    return torch.where(m <= n, score, float("-inf"))


def _rel_bias(score, b, h, q, kv):
    return score + (q - kv)


def _rel_causal(score, b, h, q, kv):
    return torch.where(q >= kv, score + (q - kv), float("-inf"))


def _generate_alibi_bias(num_heads: int):
    def _alibi_bias(score, b, h, q, kv):
        scale = torch.exp2(-((h + 1) * 8.0 / num_heads))
        return score + (kv - q) * scale

    return _alibi_bias


def _trig(score, b, h, m, n):
    return torch.sin(torch.cos(score)) + torch.tan(b)


def _trig2(score, b, h, m, n):
    cos_score = torch.cos(score)
    sin_score = torch.sin(score)
    return cos_score * sin_score + torch.tan(b)


def _causal_mask(b, h, q, kv):
    return q >= kv


def _inverse_causal_mask(b, h, q, kv):
    return q <= kv


SCORE_MODS = {
    "identity": _identity,
    "times_two": _times_two,
    "squared": _squared,
    "causal": _causal,
    "inverse_causal": _inverse_causal,
    "rel_bias": _rel_bias,
    "rel_causal": _rel_causal,
    "alibi": _generate_alibi_bias(8),
}


# -- the table --------------------------------------------------------------------------------------


@dataclass
class Call:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    score_mod: object = None
    block_mask: object = None
    enable_gqa: bool = False
    learn: list = field(default_factory=list)  # captured tensors that require grad
    lse: bool = False
    grad_qkv: bool = True
    scale: float | None = None


@dataclass
class Case:
    name: str
    make: object  # (generator) -> Call
    compiled: bool = False  # in the torch.compile subset


def _rand(g, *shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=g).to(dtype)


def qkv(g, B=2, H=2, Sq=S, Sk=S, Dq=D, Dv=D, Bk=None, Hk=None, dtype=torch.bfloat16):
    Bk = B if Bk is None else Bk
    Hk = H if Hk is None else Hk
    return (_rand(g, B, H, Sq, Dq, dtype=dtype), _rand(g, Bk, Hk, Sk, Dq, dtype=dtype),
            _rand(g, Bk, Hk, Sk, Dv, dtype=dtype))  # fmt: skip


def bmask(mod, B=None, H=None, Sq=S, Sk=S, block=16):
    return create_block_mask(mod, B, H, Sq, Sk, device="cpu", BLOCK_SIZE=block)


CASES: list[Case] = []


def case(name, compiled=False):
    def deco(fn):
        CASES.append(Case(name, fn, compiled))
        return fn

    return deco


def _builtin(name, mod, dtype, **kw):
    def make(g):
        q, k, v = qkv(g, dtype=dtype, **kw)
        gqa = q.shape[1] != k.shape[1]
        bm = None
        if k.shape[0] != q.shape[0]:
            bm = bmask(noop_mask, q.shape[0], 1, q.shape[2], k.shape[2])
        return Call(q, k, v, mod, bm, enable_gqa=gqa)

    CASES.append(Case(name, make, compiled=name in ("builtin[causal-bf16]", "builtin[alibi-fp32]")))


_SIZES = (16, 32, (16, 32), (32, 16))
for _i, (_n, _m) in enumerate(SCORE_MODS.items()):
    for _dt, _dn in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        _builtin(f"builtin[{_n}-{_dn}]", _m, _dt)
    _builtin(f"different_seqlen[{_n}]", _m, torch.bfloat16, Sq=19)
    _builtin(f"GQA[{_n}]", _m, torch.bfloat16, H=4, Hk=2, Sq=19)
    _builtin(f"head_dims[{_n}-16-32]", _m, torch.bfloat16, Dq=16, Dv=32)
    _bh = (2, 1)[_i % 2]
    _builtin(f"kv_batch_broadcast[{_n}-3x1-4x{_bh}]", _m, torch.bfloat16, B=3, Bk=1, H=4, Hk=_bh)
    # torch's file crosses every mod with every block size; here each mod takes one of them
    _bs = _SIZES[_i % 4]

    def _make(g, _m=_m, _bs=_bs):
        q, k, v = qkv(g)
        return Call(q, k, v, _m, bmask(noop_mask, 2, 2, block=_bs))

    CASES.append(Case(f"block_size[{_n}-{_bs}]", _make))

for _bq, _hq, _hk in ((3, 4, 2), (4, 4, 1), (5, 4, 2)):

    def _make(g, _bq=_bq, _hq=_hq, _hk=_hk):
        q, k, v = qkv(g, B=_bq, Bk=1, H=_hq, Hk=_hk)
        return Call(q, k, v, None, bmask(_causal_mask, _bq, 1), enable_gqa=True)

    CASES.append(Case(f"kv_batch_broadcast_causal_mask[{_bq}-{_hq}x{_hk}]", _make))


@case("doc_mask_sparse", compiled=True)
def _(g):
    doc = torch.arange(S) // 10

    def document_masking_causal(score, b, h, q_idx, kv_idx):
        return torch.where((q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx]), score, -float("inf"))

    return Call(*qkv(g), document_masking_causal)


@case("index_multiple")
def _(g):
    bias = torch.randn(2, S, generator=g)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[b][q])


@case("index_weird1")
def _(g):
    bias = torch.randn(4, 2, 2, S, generator=g)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[0][b, h][q])


@case("index_weird2")
def _(g):
    bias = torch.randn(2, 2, 4, S, generator=g)
    which = torch.tensor(0)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[b][h][which, q])


for _dt, _dn in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):

    @case(f"skip_odd_keys[{_dn}]")
    def _(g, _dt=_dt):
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: torch.where(kv % 2 == 0, s,
                                                                           float("-inf")))  # fmt: skip

    @case(f"function_composition[{_dn}]")
    def _(g, _dt=_dt):
        def score_mod_1(score, b, h, m, n):
            return score + (m - n)

        def score_mod_2(score, b, h, m, n):
            return torch.where(m <= n, score, float("-inf"))

        def composed(score, b, h, m, n):
            return score_mod_2(score_mod_1(score, b, h, m, n), b, h, m, n)

        return Call(*qkv(g, dtype=_dt), composed)

    @case(f"captured_buffers_all_dims[{_dn}]")
    def _(g, _dt=_dt):
        head_scale, batch_scale, tok_scale = (torch.randn(n, generator=g) for n in (2, 2, S))

        def all_bias(score, batch, head, token_q, token_kv):
            score = score + tok_scale[token_q]
            score = score + batch_scale[batch]
            return score + head_scale[head]

        return Call(*qkv(g, dtype=_dt), all_bias)


@case("seq_masking")
def _(g):
    seq_idx = torch.zeros(S, dtype=torch.bool)
    seq_idx[S // 2 :] = 1
    return Call(*qkv(g), lambda s, b, h, q, kv: torch.where(seq_idx[q] == seq_idx[kv], s,
                                                            float("-inf")))  # fmt: skip


@case("load_from_bias_seq_only")
def _(g):
    bias = _rand(g, S, S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[q, kv])


@case("load_from_bias_seq_batch")
def _(g):
    bias = _rand(g, 2, S, S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[b, q, kv])


@case("load_from_bias_head_seq_batch")
def _(g):
    bias = _rand(g, 2, 2, S, S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[b, h, q, kv])


@case("load_from_view_buffer")
def _(g):
    W = 8
    rel_h = torch.randn(2, 2, S, S // W + 1, generator=g).view(2, 2, S, -1)
    return Call(*qkv(g), lambda s, batch, head, q_idx, k_idx: s + rel_h[batch, head, q_idx,
                                                                        k_idx // W])  # fmt: skip


@case("load_rel_bias")
def _(g):
    rel_bias = _rand(g, 2 * S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + rel_bias[(q - kv) + S])


@case("dependent_causal_bidirectional")
def _(g):
    num_bidirectional = torch.randint(0, S, (2,), generator=g, dtype=torch.int32)

    def bias_mod(score, b, h, q, kv):
        cur = num_bidirectional[b]
        video = (q <= cur) & (kv <= cur)
        return torch.where(video | (q >= kv), score, -float("inf"))

    return Call(*qkv(g), bias_mod)


@case("natten_2d")
def _(g):
    W, WINDOW = 6, 1

    def natten_mask(score, b, h, q, kv):
        q_x, q_y = q / W, q % W
        kv_x, kv_y = kv / W, kv % W
        return torch.where(((q_x - kv_x).abs() <= WINDOW) | ((q_y - kv_y).abs() <= WINDOW),
                           score, float("-inf"))  # fmt: skip

    return Call(*qkv(g), natten_mask)


@case("subgraph_respect_decomposition")
def _(g):
    return Call(*qkv(g), lambda score, b, h, q, kv: score - q // (1 + kv))


@case("silu_on_score")
def _(g):
    return Call(*qkv(g), lambda score, b, h, q, kv: torch.nn.functional.silu(score))


@case("padded_dense_causal")
def _(g):
    seq_len = torch.arange(2, dtype=torch.int32) + 1

    def njt(qk, b, h, q, kv):
        return torch.where(qk <= seq_len[b], _causal(qk, b, h, q, kv), -float("inf"))

    return Call(*qkv(g), njt)


@case("captured_scale")
def _(g):
    scale = torch.ones((), dtype=torch.int32)
    return Call(*qkv(g), lambda qk, b, h, q, kv: qk + scale)


for _add in (True, False):

    @case(f"recompile_changed_score_mod[{'add' if _add else 'mul'}]")
    def _(g, _add=_add):
        scale = torch.ones((), dtype=torch.int32) * 2

        def score_mod_scale(qk, b, h, q, kv):
            return qk + scale if _add else qk * scale

        return Call(*qkv(g), score_mod_scale)


@case("captured_reduction")
def _(g):
    scale = torch.randn(2, 8, generator=g)
    return Call(*qkv(g), lambda qk, b, h, q, kv: qk + scale[b].sum(dim=-1))


@case("reduction_unrolled")
def _(g):
    means = torch.randn(S, 3, generator=g)
    length_scales = torch.logspace(0.001, 0.1, 2)

    def euclidean_dist_pos_embed(score, b, h, q_idx, k_idx):
        dist = (means[q_idx] - means[k_idx]).pow(2).sum(-1).sqrt()
        return torch.exp(-dist / length_scales[h]) * score

    return Call(*qkv(g), euclidean_dist_pos_embed)


@case("multiple_score_mod_calls", compiled=True)
def _(g):
    def scoremod_1(qk, b, h, q, kv):
        return torch.where(q >= kv, qk + (q - kv), -float("inf"))

    return Call(*qkv(g, dtype=torch.float32), scoremod_1)


@case("inputs_are_realized")
def _(g):
    x = torch.randn(S, generator=g) * 2
    return Call(*qkv(g, dtype=torch.float32), lambda qk, b, h, q, kv: qk + x[q])


@case("mask_mod_combiners")
def _(g):
    def sliding_window(b, h, q, kv):
        return (q - kv) <= 9

    return Call(*qkv(g), None, bmask(and_masks(_causal_mask, sliding_window)))


@case("njt_causal")
def _(g):
    offsets = torch.tensor([0, 12, 20, S], dtype=torch.int32)
    seq_idx = torch.zeros(S, dtype=torch.int32)
    for i in range(3):
        seq_idx[offsets[i] : offsets[i + 1]] = i

    def njt_score_mod(qk, b, h, q, kv):
        return _causal(qk, b, h, q - offsets[seq_idx[q]], kv - offsets[seq_idx[kv]])

    return Call(*qkv(g), njt_score_mod)


@case("causal_block", compiled=True)
def _(g):
    return Call(*qkv(g), None, bmask(_causal_mask))


@case("GQA_causal_mask")
def _(g):
    return Call(*qkv(g, H=4, Hk=2), None, bmask(_causal_mask, 2, 1), enable_gqa=True)


@case("custom_block_mask_generator")
def _(g):
    nb = (torch.arange(3, dtype=torch.int32) + 1)[None, None]
    idx = torch.arange(3, dtype=torch.int32).expand(3, 3)[None, None].contiguous()
    bm = BlockMask.from_kv_blocks(nb, idx, BLOCK_SIZE=16, mask_mod=_causal_mask,
                                  seq_lengths=(S, S))  # fmt: skip
    return Call(*qkv(g), None, bm)


for _n in ("identity", "causal"):
    for _dt, _dn in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):

        @case(f"logsumexp_correctness[{_n}-{_dn}]", compiled=(_n, _dn) == ("causal", "fp32"))
        def _(g, _n=_n, _dt=_dt):
            return Call(*qkv(g, dtype=_dt), SCORE_MODS[_n], lse=True)


for _n, _m in (("identity", _identity), ("causal", _causal), ("times_two", _times_two),
               ("squared", _squared), ("trig", _trig), ("trig2", _trig2)):  # fmt: skip

    @case(f"aot_eager_gradcheck[{_n}]")
    def _(g, _m=_m):
        return Call(*qkv(g, Sq=11, Sk=11, dtype=torch.float32), _m)


@case("captured_score_mod_gradcheck[head_offset]")
def _(g):
    head_offset = torch.rand(2, generator=g)
    return Call(*qkv(g, Sq=11, Sk=11, dtype=torch.float32), lambda s, b, h, m, n: s *
                head_offset[h])  # fmt: skip


@case("differentiable_logsumexp")
def _(g):
    return Call(*qkv(g, dtype=torch.float32), None, lse=True)


@case("fully_masked_out_rows")
def _(g):
    M = S // 2
    return Call(*qkv(g, dtype=torch.float32), lambda s, b, h, q, kv: s,
                bmask(lambda b, h, q, kv: q < M, 2, 1), lse=True)  # fmt: skip


@case("block_mask_non_divisible")
def _(g):
    seq = torch.arange(S) // 16
    return Call(*qkv(g), None, bmask(lambda b, h, q, kv: seq[q] == seq[kv]))


@case("causal_block_non_divisible_with_captured_buffer")
def _(g):
    offset_q, offset_kv = _rand(g, S), _rand(g, S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + offset_q[q] + offset_kv[kv],
                bmask(_causal_mask, 2, 1))  # fmt: skip


@case("non_divisible_with_captured_buffer")
def _(g):
    multiplier = _rand(g, S)
    return Call(*qkv(g), lambda s, b, h, q_idx, kv_idx: s * multiplier[q_idx])


@case("free_symbol")
def _(g):
    def batch_flip_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (b % 2 == 0)

    return Call(*qkv(g), None, bmask(batch_flip_causal, 2, None))


@case("symbol_closure_in_score_mod")
def _(g):
    B = 4
    return Call(*qkv(g), lambda s, b, h, q, k: s + B)


@case("new_empty_mask_mod")
def _(g):
    attn_mask = torch.ones(2, 1, S, S, dtype=torch.bool).tril()

    def score_mod(score, b, h, q_idx, kv_idx):
        h_ = h.new_zeros(h.shape)
        return score + attn_mask[b, h_, q_idx, kv_idx]

    def causal(b, h, q_idx, kv_idx):
        h_ = h.new_zeros(h.shape)
        return attn_mask[b, h_, q_idx, kv_idx]

    return Call(*qkv(g), score_mod, bmask(causal, 2, None))


@case("document_masking_edge_case")
def _(g):
    document_masks = torch.zeros((2, S), dtype=torch.int32)
    document_masks[:, 20:] = 1
    return Call(*qkv(g, dtype=torch.float32), None,
                bmask(lambda b, h, q, kv: document_masks[b, q] == document_masks[b, kv], 2,
                      1))  # fmt: skip


@case("lse_masked_output")
def _(g):
    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= 9)

    return Call(*qkv(g, dtype=torch.float32), None, bmask(sliding), lse=True)


for _perm in ((0, 1, 2, 3), (1, 0, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3)):

    @case(f"stride_ordering[{''.join(map(str, _perm))}]")
    def _(g, _perm=_perm):
        # (2, 2, S, D) tensors laid out in memory in ``_perm``'s dimension order
        shape = (2, 2, S, D)
        inv = [_perm.index(i) for i in range(4)]
        ts = [torch.randn(*[shape[p] for p in _perm], generator=g).permute(inv) for _ in range(3)]
        return Call(*ts, _rel_causal)


@case("small_q_kv_len")
def _(g):
    return Call(*qkv(g, B=1, H=1, Sq=1, Sk=1, dtype=torch.float32), None, lse=True)


@case("no_q_info")
def _(g):
    bm = bmask(_causal_mask, 1, 1)
    bm.q_num_blocks = bm.q_indices = bm.full_q_num_blocks = bm.full_q_indices = None
    return Call(*qkv(g), None, bm)


@case("sliced_block_mask")
def _(g):
    base = bmask(_causal_mask, 1, 1, Sq=64, Sk=S)
    sliced = base[:, :, 1:2]  # the query block 16..31

    def offset(b, h, q, kv):
        return base.mask_mod(b, h, q + 16, kv)

    sliced.mask_mod = offset
    return Call(*qkv(g, Sq=16), None, sliced)


@case("block_size_8")
def _(g):
    return Call(*qkv(g), None, bmask(_causal_mask, block=(8, 8)))


@case("block_size_24_40")
def _(g):
    return Call(*qkv(g), _rel_bias, bmask(lambda b, h, q, kv: (q - kv) % 3 != 1, block=(24, 40)))


@case("float32_matmul_precision")
def _(g):
    q, k, v = (torch.full((2, 2, 32, 16), x) for x in (0.2, 0.3, 0.4))
    return Call(q, k, v, _times_two)


@case("strided_inputs")
def _(g):
    base = [torch.randn(4 * 2 * 2 * S * D, generator=g).bfloat16() for _ in range(3)]
    q = torch.as_strided(base[0], (2, 2, 19, D), (2 * S * D, D, 2 * D, 1), 97)
    k = torch.as_strided(base[1], (2, 2, S, D), (2 * D, D, 4 * D, 1), 499)
    v = torch.as_strided(base[2], (2, 2, S, D), (S * (D + 1), 2 * S * (D + 1), D + 1, 1), 293)
    return Call(q, k, v, _generate_alibi_bias(8))


@case("sdpa_scale")
def _(g):
    return Call(*qkv(g), _rel_causal, scale=0.3)


def _paged(g, mod, dtype=torch.bfloat16, page=16, Sq=S):
    """torch's paged-attention conversion (``PagedAttention``: a KV cache of pages, the
    BlockMask and score mod rewritten to physical positions), inference as in torch's tests."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention

    B, H = 2, 2
    n_pages = -(-S // page) * (B + 1)
    pa = PagedAttention(n_pages, page, B + 1, device="cpu")
    for b in range(B):  # scattered pages: batch 1's first page follows batch 0's pages
        pa.reserve(torch.tensor(b), torch.tensor(S))
    q, k, v = qkv(g, B=B, H=H, Sq=Sq, dtype=dtype)
    kc = torch.zeros(1, H, n_pages * page, D, dtype=dtype)
    vc = torch.zeros_like(kc)
    pa.assign(torch.arange(B, dtype=torch.int32), torch.arange(S, dtype=torch.int32).expand(B, S),
              k, v, kc, vc)  # fmt: skip
    bm = pa.convert_logical_block_mask(bmask(_causal_mask, B, 1, Sq, S, block=page))
    return Call(q, kc, vc, pa.get_score_mod(mod), bm, grad_qkv=False)


for _n in ("identity", "rel_bias", "alibi", "times_two"):
    CASES.append(Case(f"paged_attention[{_n}]",
                      lambda g, _n=_n: _paged(g, SCORE_MODS[_n])))  # fmt: skip


# -- TestLearnableBiases ---------------------------------------------------------------------------


def _learn(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(True)


for _dt, _dn in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):

    @case(f"relative_1d_bias[{_dn}]", compiled=_dn == "fp32")
    def _(g, _dt=_dt):
        bias = _learn(g, 2 * S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[torch.abs(q - kv)],
                    learn=[bias])  # fmt: skip

    @case(f"absolute_2d_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, S, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[q, kv], learn=[bias])

    @case(f"head_specific_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, 2, S, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[h, q, kv], learn=[bias])

    @case(f"batch_head_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, 2, 2, S, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[b, h, q, kv],
                    learn=[bias])  # fmt: skip

    @case(f"multiplicative_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s * bias[q], learn=[bias])

    @case(f"local_window_bias[{_dn}]")
    def _(g, _dt=_dt):
        w = 8
        bias = _learn(g, 2 * w + 1, dtype=_dt)

        def bias_func(score, b, h, q_idx, kv_idx):
            return score + bias[torch.clamp(q_idx - kv_idx + w, 0, 2 * w)]

        return Call(*qkv(g, dtype=_dt), bias_func, learn=[bias])

    @case(f"global_tokens_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[kv], learn=[bias])

    @case(f"weird_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, 2, 2, 4, S, dtype=_dt)
        which = torch.tensor(0)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[b, h, which, q],
                    learn=[bias])  # fmt: skip

    @case(f"indirect_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, S, dtype=_dt)
        offset = torch.randint(0, S, (S,), generator=g)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[offset[q]], learn=[bias])

    @case(f"symmetric_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[q] + bias[kv],
                    learn=[bias])  # fmt: skip

    @case(f"flipped_indexed_bias[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, S, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[kv, q], learn=[bias])

    @case(f"head_specific_gate[{_dn}]", compiled=_dn == "bf16")
    def _(g, _dt=_dt):
        gate = _learn(g, 2, dtype=_dt)

        def bias_func(score, b, h, q_idx, kv_idx):
            return score * torch.sigmoid(gate[h].to(torch.float32))

        return Call(*qkv(g, dtype=_dt), bias_func, learn=[gate])

    @case(f"distinct_biases[{_dn}]")
    def _(g, _dt=_dt):
        b1, b2 = _learn(g, S, dtype=_dt), _learn(g, S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + b1[q] + b2[kv], learn=[b1, b2])

    @case(f"relative_1d_bias_only_grad[{_dn}]")
    def _(g, _dt=_dt):
        bias = _learn(g, 2 * S, dtype=_dt)
        return Call(*qkv(g, dtype=_dt), lambda s, b, h, q, kv: s + bias[torch.abs(q - kv)],
                    learn=[bias], grad_qkv=False)  # fmt: skip


@case("head_bias_req_grad")
def _(g):
    bias = _learn(g, 2)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[h], learn=[bias])


@case("learnable_rel_pos_1d")
def _(g):
    bias = _learn(g, 2 * S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[q + kv], learn=[bias])


@case("learnable_rel_pos_2d_index_multiple")
def _(g):
    bias = _learn(g, S, S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[q][kv], learn=[bias])


@case("learnable_rel_pos_3d_transposed")
def _(g):
    bias = _learn(g, 2, S, S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[h, kv, q], learn=[bias])


@case("learnable_alibi_slopes", compiled=True)
def _(g):
    slopes = _learn(g, 2)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + slopes[h] * (kv - q), learn=[slopes],
                lse=True)  # fmt: skip


@case("learnable_temperature_0d")
def _(g):
    t = torch.tensor(0.7, requires_grad=True)
    return Call(*qkv(g), lambda s, b, h, q, kv: s / t, learn=[t])


@case("learnable_bias_with_block_mask")
def _(g):
    bias = _learn(g, 2 * S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[q - kv + S], bmask(_causal_mask),
                learn=[bias])  # fmt: skip


@case("learnable_bias_block_size_8")
def _(g):
    bias = _learn(g, 2, S)
    return Call(*qkv(g), lambda s, b, h, q, kv: s + bias[h, kv],
                bmask(lambda b, h, q, kv: (q - kv) % 4 != 3, block=8), learn=[bias])  # fmt: skip


@case("many_captured_tensors")
def _(g):
    ts = [torch.randn(S, generator=g) * 0.1 for _ in range(6)]
    doc = torch.arange(S, dtype=torch.int32) // 10

    def many(s, b, h, q, kv):
        return s + ts[0][q] + ts[1][kv] + ts[2][q] * ts[3][kv] + ts[4][(q + kv) % S] - ts[5][q]

    return Call(*qkv(g), many, bmask(lambda b, h, q, kv: doc[q] >= doc[kv]))


# -- running a case ------------------------------------------------------------------------------------


def _dense_mask(bm, B, H, Sq, Sk):
    """Elementwise visibility of a BlockMask: listed full blocks, and listed partial blocks
    where its mask_mod holds."""
    bq, bkv = bm.BLOCK_SIZE
    nq, nk = -(-Sq // bq), -(-Sk // bkv)

    def dense(num, idx):
        num, idx = num[:, :, :nq].long(), idx[:, :, :nq].long()
        d = torch.zeros(*num.shape, nk + 1, dtype=torch.bool)
        live = torch.arange(idx.shape[-1]) < num[..., None]
        d.scatter_(3, torch.where(live, idx, nk), True)
        return d[..., :nk]

    part = dense(bm.kv_num_blocks, bm.kv_indices)
    full = (dense(bm.full_kv_num_blocks, bm.full_kv_indices)
            if bm.full_kv_num_blocks is not None else torch.zeros_like(part))  # fmt: skip
    expand = lambda x: x.repeat_interleave(bq, 2)[:, :, :Sq].repeat_interleave(bkv, 3)[  # noqa: E731
        :, :, :, :Sk
    ]  # fmt: skip
    part, full = expand(part), expand(full)
    idx = [torch.arange(n) for n in (B, H, Sq, Sk)]
    mm = _vmap_for_bhqkv(bm.mask_mod, prefix=())(*idx)
    return (full | (part & mm)).expand(B, H, Sq, Sk)


class _RoundedDelta(torch.autograd.Function):
    """``softmax(s) @ v`` whose backward takes the row term ``delta = sum(dO * O)`` from ``o``, the
    kernel's output as returned (rounded to its dtype), as every flash backward does. A
    gradient that sums ``dS`` against a score-sized factor (a 0-d temperature: ``sum dS * s /
    t^2``) cancels to a small difference of large terms, and bf16's rounding of ``O`` alone
    moves it by about 1% there (fp64 vs rounded ``O`` in this reference); so the gradients are
    checked against the exact backward of the output the kernel produced."""

    @staticmethod
    def forward(ctx, s, v, o):
        p = torch.softmax(s, -1).nan_to_num(0.0)
        ctx.save_for_backward(p, v, o)
        return p @ v

    @staticmethod
    def backward(ctx, g):
        p, v, o = ctx.saved_tensors
        dp = g @ v.transpose(-1, -2)
        delta = (g * o).sum(-1, keepdim=True)
        return p * (dp - delta), p.transpose(-1, -2) @ g, None


def reference(c: Call, q, k, v, out=None):
    """Dense fp64 attention with torch's vmap of the mods: ``(out, lse)``, differentiable;
    with ``out`` (the kernel's output) the backward's row term comes from it
    (``_RoundedDelta``)."""
    B, H, Sq, Dq = q.shape
    G = H // k.shape[1]
    k = k.double().repeat_interleave(G, 1).expand(B, -1, -1, -1)
    v = v.double().repeat_interleave(G, 1).expand(B, -1, -1, -1)
    scale = c.scale if c.scale is not None else 1.0 / math.sqrt(Dq)
    s = q.double() @ k.transpose(-1, -2) * scale
    idx = [torch.arange(n) for n in (B, H, Sq, k.shape[2])]
    if c.score_mod is not None:
        s = _vmap_for_bhqkv(c.score_mod, prefix=(0,))(s, *idx).double()
    if c.block_mask is not None:
        s = s.masked_fill(~_dense_mask(c.block_mask, B, H, Sq, k.shape[2]), -math.inf)
    lse = s.logsumexp(-1)
    if out is not None:
        o = out.detach().double().expand((*s.shape[:-1], v.shape[-1]))
        return _RoundedDelta.apply(s, v, o), lse
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v, lse


def rel_err(a, b, floor=1e-6):
    """``max |a - b| / max |b|`` (``max |b|`` at least ``floor``)."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(floor)).item()


def _gen(name):
    return torch.Generator().manual_seed(sum(map(ord, name)))


def run_case(tf, c: Case, compiled=False):
    call = c.make(_gen(c.name))
    tol = TOL[call.q.dtype]
    q, k, v = (t.detach().requires_grad_(call.grad_qkv) for t in (call.q, call.k, call.v))
    kw = dict(score_mod=call.score_mod, block_mask=call.block_mask, scale=call.scale,
              enable_gqa=call.enable_gqa)  # fmt: skip
    tf.reset_stats()
    if compiled:
        import torch.nn.attention.flex_attention as fa

        fn = functools.partial(fa.flex_attention, return_lse=call.lse, **kw)
        torch._dynamo.reset()
        res = torch.compile(fn, backend="flydsl", options={"device": "cpu"})(q, k, v)
    else:
        res = tf.flex_attention(q, k, v, return_lse=call.lse, **kw)
    out, lse = res if call.lse else (res, None)
    if compiled:
        st = tf.stats()["compile:flex_attention"]
        assert st["fallbacks"] == {} and st["hits"] >= 1, st
    else:
        assert tf.stats()[STAT] == {"calls": 1, "hits": 1, "fallbacks": {}}, tf.stats()[STAT]
    # forward: torch's eager flex_attention (no autograd on the CPU)
    with torch.no_grad():
        want = torch_flex(call.q, call.k, call.v, return_lse=call.lse, **kw)
    w_out, w_lse = want if call.lse else (want, None)
    assert out.shape == w_out.shape and out.dtype == w_out.dtype
    assert rel_err(out.detach(), w_out) <= tol, ("out", rel_err(out.detach(), w_out))
    if lse is not None:
        assert torch.equal(torch.isinf(lse), torch.isinf(w_lse))
        live = ~torch.isinf(w_lse)
        assert rel_err(lse.detach()[live], w_lse[live]) <= tol
    # gradients: fp64 dense reference, given the kernel's rounded output
    wrt = [t for t in (q, k, v) if t.requires_grad] + list(call.learn)
    if not wrt:
        return
    g = _gen(c.name + "grad")
    do = torch.randn(out.shape, generator=g).to(out.dtype)
    loss = (out.float() * do.float()).sum()
    dl = None
    if lse is not None:
        dl = torch.randn(lse.shape, generator=g)
        loss = loss + (torch.where(torch.isinf(lse), 0.0, lse) * dl).sum()
    grads = torch.autograd.grad(loss, wrt)
    rq, rk, rv = (t.detach().requires_grad_(t.requires_grad) for t in (q, k, v))
    r_out, r_lse = reference(call, rq, rk, rv, out)
    assert rel_err(out.detach(), r_out) <= tol
    rloss = (r_out * do.double()).sum()
    if dl is not None:
        rloss = rloss + (torch.where(torch.isinf(r_lse), 0.0, r_lse) * dl.double()).sum()
    rwrt = [t for t in (rq, rk, rv) if t.requires_grad] + list(call.learn)
    rgrads = torch.autograd.grad(rloss, rwrt)
    # a gradient that cancels to ~0 (an additive bias constant along a softmax row: shifting a
    # row changes nothing) is compared at the scale of the case's other gradients
    scale = max(b.abs().max().item() for b in rgrads)
    for i, (a, b) in enumerate(zip(grads, rgrads)):
        assert a.shape == b.shape
        assert rel_err(a, b, scale) <= tol, (i, rel_err(a, b), rel_err(a, b, scale))


_BY_NAME = {c.name: c for c in CASES}
#: the table's cases that run natively (``test_served_fraction`` names the others)
SERVED_MIN = 0.95


@pytest.fixture
def eager_torch_flex(monkeypatch):
    """torch's eager flex_attention without its dynamo wrapping (the same math path, run
    directly: it traced every new mod, a third of this file's time)."""
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)


@pytest.mark.parametrize("name", list(_BY_NAME))
def test_case(cpu_backend, eager_torch_flex, name):
    run_case(cpu_backend, _BY_NAME[name])


@pytest.mark.parametrize("name", [c.name for c in CASES if c.compiled])
def test_case_compiled(cpu_backend, name, monkeypatch):
    # torch refuses flex_attention backward on the CPU in its Python front (its kernels are
    # GPU ones); lifted, the compiled graph holds both HOPs, which the pass rewrites
    import torch.nn.attention.flex_attention as fa
    from torch._inductor import config

    monkeypatch.setattr(fa, "_validate_device", lambda *a: None)
    with config.patch(fx_graph_cache=False):
        run_case(cpu_backend, _BY_NAME[name], compiled=True)


def test_served_fraction(cpu_backend):
    from torch_flydsl.flex import call as fc

    served, missed = 0, []
    for c in CASES:
        x = c.make(_gen(c.name))
        q, k, v = (t.detach().requires_grad_(x.grad_qkv) for t in (x.q, x.k, x.v))
        plan = fc.plan_call(q, k, v, x.score_mod, x.block_mask, x.scale, x.enable_gqa, None)
        if isinstance(plan, str):
            missed.append((c.name, plan))
        else:
            served += 1
    frac = served / len(CASES)
    print(f"\nflex_attention: {served} of {len(CASES)} of torch's test cases served natively "
          f"({frac:.1%})")  # fmt: skip
    for name, why in missed:
        print(f"  falls back: {name}: {why}")
    assert frac >= SERVED_MIN, missed
