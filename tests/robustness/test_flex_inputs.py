"""flex_attention misuse: the same errors as torch's, before any launch, never a silent zero.

* a captured tensor indexed out of range (``bias[kv_idx]`` with ``bias`` shorter than the
  sequence, a too-short document-id table, through chains of lookups): torch's ``IndexError``;
* ``BlockMask.from_kv_blocks`` with a block listed twice, indices past the key length, counts
  below zero or above the list: a ``ValueError`` naming the field (torch's kernels would visit
  them, its CPU path ignores them);
* a mask mod that returns an int / float tensor (torch: ``RuntimeError``) or a Python bool
  (torch: ``ValueError``);
* random block lists (hypothesis) against a dense reference of the lists' meaning.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import torch_flydsl

S = 37


@pytest.fixture
def tf(monkeypatch, tmp_path):
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(tmp_path / "none.json"))
    torch_flydsl.disable()
    torch_flydsl.enable(device="cpu")
    torch_flydsl.reset_stats()
    yield torch_flydsl
    torch_flydsl.disable()


def qkv(sq=S, sk=S, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, s, 16, generator=g).bfloat16() for s in (sq, sk, sk))


def _torch_error(fn):
    try:
        fn()
    except Exception as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize(
    "mod",
    [
        pytest.param(lambda bias: lambda s, b, h, q, kv: s + bias[kv], id="bias_kv"),
        pytest.param(lambda bias: lambda s, b, h, q, kv: s + bias[q - kv + 20], id="rel"),
        pytest.param(
            lambda bias: lambda s, b, h, q, kv: s + bias[torch.abs(q - kv) * 2], id="abs_times_two"
        ),
        pytest.param(lambda bias: lambda s, b, h, q, kv: s + bias[(q * q) % 40], id="exact"),
    ],
)
def test_captured_tensor_index_out_of_range_raises_torchs_index_error(tf, mod):
    bias = torch.randn(33)  # shorter than what the index reaches
    q, k, v = qkv()
    m = mod(bias)
    want = _torch_error(lambda: torch_flex(q, k, v, score_mod=m))
    assert want is not None and want[0] is IndexError
    with pytest.raises(IndexError, match="out of bounds") as e:
        tf.flex_attention(q, k, v, score_mod=m)
    assert str(e.value) == want[1]
    assert tf.stats()["flex_attention"]["calls"] == 0  # raised before any launch


def test_index_in_range_only_by_evaluation_is_served(tf):
    # the interval of (q * q) % 40 is [0, 39]; only evaluating it shows it stays below 37
    q, k, v = qkv()
    vals = {(i * i) % 40 for i in range(S)}
    assert max(vals) < 37 < 39
    bias = torch.randn(37)

    def m(s, b, h, qi, kv):
        return s + bias[(qi * qi) % 40]

    out = tf.flex_attention(q, k, v, score_mod=m)
    assert tf.stats()["flex_attention"]["hits"] == 1
    torch.testing.assert_close(out, torch_flex(q, k, v, score_mod=m), rtol=2e-2, atol=2e-2)


def test_too_short_document_table_in_a_mask_raises(tf):
    doc = torch.zeros(30, dtype=torch.int64)
    q, k, v = qkv()
    nb = torch.full((1, 1, 3), 3, dtype=torch.int32)
    idx = torch.arange(3, dtype=torch.int32).expand(1, 1, 3, 3).contiguous()
    bm = BlockMask.from_kv_blocks(nb, idx, BLOCK_SIZE=16, mask_mod=lambda b, h, q, kv:
                                  doc[q] == doc[kv], seq_lengths=(S, S))  # fmt: skip
    with pytest.raises(IndexError, match="index 30 is out of bounds for dimension 0 with size 30"):
        tf.flex_attention(q, k, v, block_mask=bm)


def test_chained_lookup_out_of_range_raises(tf):
    offsets = torch.tensor([0, 10, 50])  # offsets[doc[q]] reaches 50 > 36
    doc = torch.tensor([0] * 10 + [1] * 20 + [2] * 7)
    table = torch.randn(S)
    q, k, v = qkv()
    with pytest.raises(IndexError):
        tf.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + table[offsets[doc[qi]]])


def _from_kv(nb, idx, full_nb=None, full_idx=None):
    return BlockMask.from_kv_blocks(nb, idx, full_nb, full_idx, BLOCK_SIZE=16,
                                    seq_lengths=(S, S))  # fmt: skip


@pytest.mark.parametrize(
    "lists, field",
    [
        ((torch.tensor([[[2, 1, 1]]]), torch.tensor([[[[0, 0, 0], [1, 0, 0], [2, 0, 0]]]])),
         "twice"),
        ((torch.tensor([[[1, 1, 1]]]), torch.tensor([[[[0, 0, 0], [3, 0, 0], [2, 0, 0]]]])),
         "kv_indices lists kv block 3"),
        ((torch.tensor([[[1, -1, 1]]]), torch.tensor([[[[0, 0, 0], [1, 0, 0], [2, 0, 0]]]])),
         "negative"),
        ((torch.tensor([[[4, 1, 1]]]), torch.tensor([[[[0, 1, 2], [1, 0, 0], [2, 0, 0]]]])),
         "count above"),
        ((torch.tensor([[[1, 1, 1]]]), torch.tensor([[[[0, 0, 0], [1, 0, 0], [2, 0, 0]]]]),
          torch.tensor([[[1, 0, 0]]]), torch.tensor([[[[2, 0, 0], [0, 0, 0], [0, 0, 0]]]]),
          (0, 0, 0, 0), 5),
         "full_kv_indices lists kv block 5"),
        ((torch.tensor([[[1, 1, 1]]]), torch.tensor([[[[0, 0, 0], [1, 0, 0], [2, 0, 0]]]]),
          torch.tensor([[[1, 0, 0]]]), torch.tensor([[[[0, 0, 0], [0, 0, 0], [0, 0, 0]]]])),
         "twice"),
    ],
    ids=["duplicate", "kv_out_of_range", "negative_count", "count_past_list",
         "full_out_of_range", "partial_and_full"],
)  # fmt: skip
def test_bad_block_lists_raise_a_value_error(tf, lists, field):
    poke = None
    if len(lists) == 6:  # an index torch's constructor itself would refuse: set afterwards
        *lists, at, value = lists
        poke = (at, value)
    lists = [t.to(torch.int32) for t in lists]
    bm = _from_kv(*lists)
    if poke is not None:
        bm.full_kv_indices[poke[0]] = poke[1]
    q, k, v = qkv()
    with pytest.raises(ValueError, match=field):
        tf.flex_attention(q, k, v, block_mask=bm)


@pytest.mark.parametrize(
    "mask, exc, text",
    [
        (lambda b, h, q, kv: (q >= kv).int(), RuntimeError, "dtype Int"),
        (lambda b, h, q, kv: (q >= kv).float(), RuntimeError, "dtype Float"),
        (lambda b, h, q, kv: True, ValueError, "must only return Tensors"),
        (lambda b, h, q, kv: 1, ValueError, "must only return Tensors"),
    ],
    ids=["int", "float", "python_bool", "python_int"],
)
def test_mask_mod_of_the_wrong_type_raises_as_torch(tf, mask, exc, text):
    nb = torch.full((1, 1, 3), 3, dtype=torch.int32)
    idx = torch.arange(3, dtype=torch.int32).expand(1, 1, 3, 3).contiguous()
    bm = BlockMask.from_kv_blocks(nb, idx, BLOCK_SIZE=16, mask_mod=mask, seq_lengths=(S, S))
    q, k, v = qkv()
    want = _torch_error(lambda: torch_flex(q, k, v, block_mask=bm))
    assert want is not None and want[0] is exc
    with pytest.raises(exc, match=text):
        tf.flex_attention(q, k, v, block_mask=bm)


def test_block_mask_for_other_lengths_raises_torchs_error(tf):
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 48, 48, device="cpu",
                           BLOCK_SIZE=16)  # fmt: skip
    q, k, v = qkv()
    want = _torch_error(lambda: torch_flex(q, k, v, block_mask=bm))
    with pytest.raises(want[0]) as e:
        tf.flex_attention(q, k, v, block_mask=bm)
    assert str(e.value) == want[1]


@settings(max_examples=12, deadline=None)
@given(
    bq=st.sampled_from([8, 16, 24, 32]),
    bkv=st.sampled_from([8, 16, 40]),
    seed=st.integers(0, 2**16),
    density=st.floats(0.2, 0.9),
)
def test_random_block_lists_match_their_dense_meaning(bq, bkv, seed, density):
    # full and partial blocks at random (any BLOCK_SIZE torch accepts), a mask mod for the
    # partial ones: ours equals dense attention masked by what the lists mean
    torch_flydsl.enable(device="cpu")
    try:
        g = torch.Generator().manual_seed(seed)
        nq, nk = math.ceil(S / bq), math.ceil(S / bkv)
        state = (torch.rand(1, 1, nq, nk, generator=g) < density).int() * torch.randint(
            1, 3, (1, 1, nq, nk), generator=g, dtype=torch.int32)  # fmt: skip

        def lists(which):
            m = (state == which).int()
            return m.sum(-1).int(), torch.argsort(m, dim=-1, descending=True, stable=True).int()

        def stripes(b, h, q, kv):
            return (q + kv) % 3 != 0

        (pn, pi), (fn, fi) = lists(1), lists(2)
        bm = BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=(bq, bkv), mask_mod=stripes,
                                      seq_lengths=(S, S))  # fmt: skip
        q, k, v = qkv(seed=seed)
        out = torch_flydsl.flex_attention(q, k, v, block_mask=bm)
        qi = torch.arange(S)[:, None]
        ki = torch.arange(S)[None, :]
        st_el = state[0, 0][qi // bq, ki // bkv]
        vis = (st_el == 2) | ((st_el == 1) & stripes(0, 0, qi, ki))
        s = (q.float() @ k.float().transpose(-1, -2)) / 4.0
        s = s.masked_fill(~vis, -math.inf)
        ref = torch.softmax(s, -1).nan_to_num(0.0) @ v.float()
        err = (out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)
        assert err <= 2e-2
    finally:
        torch_flydsl.disable()
