"""The attention family's varlen and paged paths with guard buffers, on the CPU and (marker
``gpu``) on the GPU: every output and workspace the API allocates is guarded (``call``), and
so are the inputs (``guard_inputs``): a KV-cache append that writes past its cache, or a store
past a packed output, fails the test; a load past an input reads the guard's random bytes and
fails the comparison. Pages are out of order, the pool has pages no sequence uses, and
sequences are empty, one token long, or end mid-page.

Tolerance: bf16 outputs and gradients against the float64 reference, ``atol = rtol = 1e-2``
(outputs) and ``2e-2`` (gradients: P and dS are rounded to bf16 before their matmuls).
"""

from __future__ import annotations

import pytest
import torch

from flydsl_kernels.attention import (
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    reference,
)

BF16 = torch.bfloat16


def rand(*shape, g):
    return torch.randn(*shape, generator=g).to(BF16)


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def close(out, ref, tol=1e-2):
    torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=tol)


def cumsum(lens):
    return i32([0, *torch.tensor(lens).cumsum(0).tolist()])


def varlen_reference(q, k, v, cu_q, cu_k, **kw):
    """``reference.attention`` sequence by sequence; a sequence with no key gives zeros
    (flash-attn's convention; the reference needs a key)."""
    outs = []
    for b in range(cu_q.numel() - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if cu_k[b + 1] == cu_k[b]:
            outs.append(q.new_zeros(q[qs].shape[:2] + v.shape[-1:], dtype=torch.float64))
            continue
        outs.append(reference.attention(q[qs][None], k[ks][None], v[ks][None], **kw)[0][0])
    return torch.cat(outs)


def pool_of(lens, page, hk, d, g, spare=3):
    """``(k_pool, v_pool, block_table, dense k rows, dense v rows)``: sequence ``b``'s
    ``lens[b]`` keys in pages of a pool in random order, ``spare`` pages unused, -1 in a row's
    unused columns."""
    need = [-(-n // page) for n in lens]
    n = sum(need) + spare
    order = torch.randperm(n, generator=g).tolist()
    kp, vp = rand(n, page, hk, d, g=g), rand(n, page, hk, d, g=g)
    table = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    for b, m in enumerate(need):
        table[b, :m] = i32(order[:m])
        order = order[m:]
    kd = [kp[table[b, : need[b]].long()].flatten(0, 1)[: lens[b]] for b in range(len(lens))]
    vd = [vp[table[b, : need[b]].long()].flatten(0, 1)[: lens[b]] for b in range(len(lens))]
    return kp, vp, table, kd, vd


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_backward_guarded(call, big, causal):
    g = torch.Generator().manual_seed(1)
    lq = big([0, 17, 1, 0, 33], [0, 1000, 1, 0, 513])
    lk = big([5, 17, 40, 0, 3], [9, 1000, 2049, 0, 300])
    H, Hk, D = 4, 2, 64
    q, k, v = rand(sum(lq), H, D, g=g), rand(sum(lk), Hk, D, g=g), rand(sum(lk), Hk, D, g=g)
    do = rand(sum(lq), H, D, g=g)
    cu_q, cu_k = cumsum(lq), cumsum(lk)

    def fwd_bwd(q, k, v, cu_q, cu_k, do, target):
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, target=target
        )
        return out, *torch.autograd.grad(out, (q, k, v), do)

    (out, dq, dk, dv), _, _ = call(fwd_bwd, q, k, v, cu_q, cu_k, do, guard_inputs=True)
    ins = [t.double().requires_grad_() for t in (q, k, v)]
    ref = varlen_reference(*ins, cu_q, cu_k, causal=causal)
    close(out, ref)
    for a, r in zip((dq, dk, dv), torch.autograd.grad(ref, ins, do.double())):
        close(a, r, 2e-2)


@pytest.mark.parametrize("page", [16, 64])
def test_paged_varlen_guarded(call, big, page):
    g = torch.Generator().manual_seed(2)
    lq = big([3, 0, 9], [300, 0, 1, 129])
    lk = big([40, 7, 16], [3000, 5, 1, 1029])
    H, Hk, D = 8, 2, 128
    kp, vp, table, kd, vd = pool_of(lk, page, Hk, D, g)
    q = rand(sum(lq), H, D, g=g)
    cu_q, cu_k = cumsum(lq), cumsum(lk)
    out, (_, kp2, vp2, *_), _ = call(
        flash_attn_varlen_func, q, kp, vp, cu_q, cu_k, max(lq), max(lk), causal=True,
        block_table=table, guard_inputs=True,
    )  # fmt: skip
    assert torch.equal(kp2, kp) and torch.equal(vp2, vp)  # read only
    close(out, varlen_reference(q, torch.cat(kd), torch.cat(vd), cu_q, cu_k, causal=True))


@pytest.mark.parametrize("splits", [0, 1, 4])
def test_paged_kvcache_append_guarded(call, big, splits):
    """Decode with packed GQA heads, appended tokens that cross a page boundary, split-KV and its
    combine: the cache rows after the append are exactly the old ones plus the new tokens."""
    g = torch.Generator().manual_seed(3)
    page, snew = 16, 3
    lens = big([0, 14, 29], [0, 14, 4093, 1000, 7])
    B, H, Hk, D = len(lens), 8, 2, 128
    kp, vp, table, _, _ = pool_of([n + snew for n in lens], page, Hk, D, g)
    q, kn, vn = rand(B, 1, H, D, g=g), rand(B, snew, Hk, D, g=g), rand(B, snew, Hk, D, g=g)
    out, (_, kp2, vp2, *_), _ = call(
        flash_attn_with_kvcache, q, kp, vp, kn, vn, cache_seqlens=i32(lens), block_table=table,
        causal=True, num_splits=splits, guard_inputs=True,
    )  # fmt: skip
    for b, n in enumerate(lens):
        rows = table[b, : -(-(n + snew) // page)].long()
        ks, vs = kp2[rows].flatten(0, 1), vp2[rows].flatten(0, 1)
        assert torch.equal(ks[:n], kp[rows].flatten(0, 1)[:n])
        assert torch.equal(ks[n : n + snew], kn[b]) and torch.equal(vs[n : n + snew], vn[b])
        ref, _ = reference.attention(q[b : b + 1], ks[None, : n + snew], vs[None, : n + snew])
        close(out[b : b + 1], ref)
    untouched = torch.ones(kp.shape[0], dtype=torch.bool)
    untouched[table[table >= 0].long()] = False
    assert torch.equal(kp2[untouched], kp[untouched])  # pages no sequence owns


def test_dense_kvcache_batch_idx_append_guarded(call, big):
    g = torch.Generator().manual_seed(4)
    cap, snew = big(40, 4096), 2
    lens = big([0, 38, 11], [0, 4094, 1000])
    B, H, Hk, D = len(lens), 4, 4, 64
    kc, vc = rand(B + 2, cap, Hk, D, g=g), rand(B + 2, cap, Hk, D, g=g)
    bidx = i32([3, 0, 4])
    q, kn, vn = rand(B, 2, H, D, g=g), rand(B, snew, Hk, D, g=g), rand(B, snew, Hk, D, g=g)
    out, (_, kc2, vc2, *_), _ = call(
        flash_attn_with_kvcache, q, kc, vc, kn, vn, cache_seqlens=i32(lens),
        cache_batch_idx=bidx, causal=True, guard_inputs=True,
    )  # fmt: skip
    for b, n in enumerate(lens):
        r = int(bidx[b])
        assert torch.equal(kc2[r, n : n + snew], kn[b]) and torch.equal(kc2[r, :n], kc[r, :n])
        assert torch.equal(kc2[r, n + snew :], kc[r, n + snew :])
        ref, _ = reference.attention(
            q[b : b + 1], kc2[r : r + 1, : n + snew], vc2[r : r + 1, : n + snew], causal=True
        )
        close(out[b : b + 1], ref)
    assert torch.equal(kc2[[1, 2]], kc[[1, 2]])  # rows no sequence maps to


@pytest.mark.parametrize(
    "what, kw, exc",
    [
        ("page past the pool", {"block_table": [[0, 9], [1, 2]]}, IndexError),
        ("negative page", {"block_table": [[0, -1], [1, 2]]}, IndexError),
        ("past the table", {"cache_seqlens": [32, 5]}, RuntimeError),
        ("negative length", {"cache_seqlens": [-4, 5]}, ValueError),
    ],
)
def test_paged_kvcache_hostile_indices_raise_before_any_write(call, what, kw, exc):
    """flash-attn's one sync on this path (``max(cache_seqlens)``) checks every index on a GPU
    too: the error is raised on the host before the append writes anything."""
    g = torch.Generator().manual_seed(5)
    kp, vp = rand(4, 16, 2, 64, g=g), rand(4, 16, 2, 64, g=g)
    a = {"block_table": [[0, 3], [1, 2]], "cache_seqlens": [20, 5]}
    a.update(kw)
    q, kn, vn = rand(2, 1, 4, 64, g=g), rand(2, 1, 2, 64, g=g), rand(2, 1, 2, 64, g=g)
    with pytest.raises(exc, match=r"block_table|cache_seqlens"):
        call(
            flash_attn_with_kvcache, q, kp, vp, kn, vn, cache_seqlens=i32(a["cache_seqlens"]),
            block_table=i32(a["block_table"]), guard_inputs=True,
        )  # fmt: skip


def test_big_padded_block_table_is_checked_on_its_device(call):
    """A table of more than 4096 entries, padded with -1 past each row's pages, takes the
    validation's tensor path (not a Python loop); on a GPU it runs where the table lives."""
    g = torch.Generator().manual_seed(6)
    kp, vp = rand(4, 16, 2, 64, g=g), rand(4, 16, 2, 64, g=g)
    table = torch.full((2, 2100), -1, dtype=torch.int32)
    table[0, :2], table[1, :1] = i32([3, 0]), i32([2])
    lens = [20, 5]
    q = rand(2, 1, 4, 64, g=g)
    out = call(flash_attn_with_kvcache, q, kp, vp, cache_seqlens=i32(lens), block_table=table)
    for b, n in enumerate(lens):
        rows = table[b, : -(-n // 16)].long()
        ks, vs = kp[rows].flatten(0, 1)[None, :n], vp[rows].flatten(0, 1)[None, :n]
        close(out[b : b + 1], reference.attention(q[b : b + 1], ks, vs)[0])
    table[1, 0] = 9  # past the pool of 4 pages
    with pytest.raises(IndexError, match=r"block_table\[1, 0\] = 9 is not a page"):
        call(flash_attn_with_kvcache, q, kp, vp, cache_seqlens=i32(lens), block_table=table)
