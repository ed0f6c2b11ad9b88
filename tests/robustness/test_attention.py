"""The attention API under random index inputs and misuse (``cpu-reference``, tiny shapes).

Properties (hypothesis, few examples: each draws shapes from short lists so the kernels compile a
handful of times): random ``cu_seqlens`` (empty sequences included), paged caches with pages in
random order and unused pool pages, random cache lengths and appended ``k``/``v``, against a
float64 reference written here that masks by hand; random *hostile* index values, where the only
outcomes allowed are that reference's answer or the documented error naming the argument; and
the device-side form of the checks (what a GPU runs: flags, no host sync) agreeing with the host
form on the same hostile values. Then one test per misuse class (type and argument named).

Tolerance: bf16 outputs ``atol = rtol = 1e-2`` against float64 (one rounding of the output and
of P before P @ V, as flash-attn).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from flydsl_kernels.attention import (
    configs,
    flash_attn_backward,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    validate,
)

from .conftest import ROBUST

pytestmark = pytest.mark.cpu

T = "cpu-reference"
BF16 = torch.bfloat16
TOL = 1e-2
PAGE = 16
C16 = configs.Config(16, 16, 4)
#: (H, Hk, D): MHA and GQA, a head dim that is not a power of two
HEADS = [(2, 2, 16), (4, 2, 24)]


def rand(*shape, g):
    return torch.randn(*shape, generator=g).to(BF16)


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def cumsum(lens):
    return i32([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()])


# -- the reference: one sequence at a time, masked by hand ----------------------------------------


def ref_one(q, k, v, scale, causal, window):
    """q ``(sq, H, D)``, k/v ``(sk, Hk, D)`` -> ``(sq, H, Dv)`` float64; a row that sees no key
    is zero (flash-attn's convention)."""
    sq, H, D = q.shape
    sk, Hk, _ = k.shape
    G = H // Hk
    scale = D**-0.5 if scale is None else scale
    out = torch.zeros(sq, H, v.shape[-1], dtype=torch.float64)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    for i in range(sq):
        keys = [
            j
            for j in range(sk)
            if (right < 0 or j <= i + sk - sq + right) and (left < 0 or j >= i + sk - sq - left)
        ]
        if not keys:
            continue
        for h in range(H):
            kk, vv = k[keys, h // G].double(), v[keys, h // G].double()
            p = torch.softmax(kk @ q[i, h].double() * scale, 0)
            out[i, h] = p @ vv
    return out


def close(out, ref):
    torch.testing.assert_close(out.double(), ref, rtol=TOL, atol=TOL)


# -- varlen: random cu_seqlens, dense and paged ----------------------------------------------------


@st.composite
def varlen_problem(draw):
    b = draw(st.integers(0, 3))
    lq = draw(st.lists(st.integers(0, 9), min_size=b, max_size=b))
    lk = draw(st.lists(st.integers(0, 40), min_size=b, max_size=b))
    return {
        "lq": lq,
        "lk": lk,
        "heads": draw(st.sampled_from(HEADS)),
        "causal": draw(st.booleans()),
        "window": draw(st.sampled_from([(-1, -1), (3, 1), (2**31, 0)])),
        "scale": draw(st.sampled_from([None, 0.0, -0.5])),
        "paged": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def paged_pool(ks, vs, g, spare=2):
    """``(k_pool, v_pool, block_table)``: every sequence's keys in pages of a pool in random
    order, with ``spare`` pool pages no sequence uses; a row's unused columns hold -1."""
    need = [-(-k.shape[0] // PAGE) for k in ks]
    n = sum(need) + spare
    order = torch.randperm(n, generator=g).tolist()
    Hk, D, Dv = ks[0].shape[1], ks[0].shape[2], vs[0].shape[2]
    kp, vp = rand(n, PAGE, Hk, D, g=g), rand(n, PAGE, Hk, Dv, g=g)
    cols = max([*need, 1]) + 1
    table = torch.full((len(ks), cols), -1, dtype=torch.int32)
    for b, (k, v) in enumerate(zip(ks, vs)):
        for c in range(need[b]):
            pid = order.pop()
            table[b, c] = pid
            rows = k[c * PAGE : (c + 1) * PAGE]
            kp[pid, : rows.shape[0]] = rows
            vp[pid, : rows.shape[0]] = v[c * PAGE : (c + 1) * PAGE]
    return kp, vp, table


@ROBUST
@given(pr=varlen_problem())
def test_varlen_random_cu_seqlens_dense_and_paged(pr):
    g = torch.Generator().manual_seed(pr["seed"])
    H, Hk, D = pr["heads"]
    lq, lk = pr["lq"], pr["lk"]
    q = rand(sum(lq), H, D, g=g)
    k, v = rand(sum(lk), Hk, D, g=g), rand(sum(lk), Hk, D, g=g)
    cu_q, cu_k = cumsum(lq), cumsum(lk)
    kw = dict(causal=pr["causal"], window_size=pr["window"], softmax_scale=pr["scale"])
    event(f"paged={pr['paged']} batch={len(lq)}")
    if pr["paged"] and lq:
        ks, vs = list(k.split(lk)), list(v.split(lk))
        kp, vp, table = paged_pool(ks, vs, g)
        out = flash_attn_varlen_func(
            q, kp, vp, cu_q, cu_k, max(lq), max(lk), block_table=table, target=T, **kw
        )
    else:
        out = flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lq, default=0), max(lk, default=0), target=T,
            config={"fwd": C16}, **kw,
        )  # fmt: skip
    assert out.shape == (sum(lq), H, D)
    win = (-1 if pr["window"][0] > 2**30 else pr["window"][0], pr["window"][1])
    for b in range(len(lq)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        close(out[qs], ref_one(q[qs], k[ks], v[ks], pr["scale"], pr["causal"], win))


# -- flash_attn_with_kvcache: random lengths, appends, paged or dense ------------------------------


@st.composite
def kvcache_problem(draw):
    b = draw(st.integers(1, 3))
    snew = draw(st.sampled_from([0, 0, 1, 3]))
    cap = draw(st.sampled_from([32, 48]))
    lens = draw(st.lists(st.integers(0, cap - snew), min_size=b, max_size=b))
    return {
        "lens": lens,
        "snew": snew,
        "cap": cap,
        "sq": draw(st.sampled_from([1, 3])),
        "heads": draw(st.sampled_from(HEADS)),
        "causal": draw(st.booleans()),
        "paged": draw(st.booleans()),
        "batch_idx": draw(st.booleans()),
        "splits": draw(st.sampled_from([0, 1, 3])),
        "int_lens": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@ROBUST
@given(pr=kvcache_problem())
def test_kvcache_random_lengths_appends_and_page_tables(pr):
    g = torch.Generator().manual_seed(pr["seed"])
    H, Hk, D = pr["heads"]
    lens, snew, cap, B = pr["lens"], pr["snew"], pr["cap"], len(pr["lens"])
    if pr["int_lens"]:
        lens = [lens[0]] * B
    q = rand(B, pr["sq"], H, D, g=g)
    full_k = [rand(cap, Hk, D, g=g) for _ in range(B)]  # each sequence's whole cache row
    full_v = [rand(cap, Hk, D, g=g) for _ in range(B)]
    kn, vn = (rand(B, snew, Hk, D, g=g), rand(B, snew, Hk, D, g=g)) if snew else (None, None)
    kw = dict(causal=pr["causal"], num_splits=pr["splits"], target=T)
    kw["cache_seqlens"] = lens[0] if pr["int_lens"] else i32(lens)
    event(f"paged={pr['paged']} snew={snew} splits={pr['splits']}")
    if pr["paged"]:
        kp, vp, table = paged_pool(full_k, full_v, g)
        kc, vc = kp, vp
        kw["block_table"] = table[:, : cap // PAGE]  # exactly the capacity: no -1 column
        out = flash_attn_with_kvcache(q, kc, vc, kn, vn, **kw)
        rows_k = [kp[table[b, : cap // PAGE].long()].flatten(0, 1) for b in range(B)]
        rows_v = [vp[table[b, : cap // PAGE].long()].flatten(0, 1) for b in range(B)]
    else:
        perm = torch.randperm(B + 1, generator=g)[:B] if pr["batch_idx"] else torch.arange(B)
        kc = rand(B + 1, cap, Hk, D, g=g)
        vc = rand(B + 1, cap, Hk, D, g=g)
        for b in range(B):
            kc[perm[b]], vc[perm[b]] = full_k[b], full_v[b]
        if pr["batch_idx"]:
            kw["cache_batch_idx"] = perm.to(torch.int32)
        out = flash_attn_with_kvcache(q, kc, vc, kn, vn, **kw)
        rows_k = [kc[perm[b]] for b in range(B)]
        rows_v = [vc[perm[b]] for b in range(B)]
    for b in range(B):
        n = lens[b]
        if snew:  # written in place at cache_seqlens[b], exactly
            assert torch.equal(rows_k[b][n : n + snew], kn[b])
            assert torch.equal(rows_v[b][n : n + snew], vn[b])
            assert torch.equal(rows_k[b][:n], full_k[b][:n])  # nothing before it moved
        ks, vs = rows_k[b][: n + snew], rows_v[b][: n + snew]
        close(out[b], ref_one(q[b], ks, vs, None, pr["causal"], (-1, -1)))


# -- hostile index values: the reference's answer or the documented error -------------------------

#: (error type, the argument its message names) per broken rule
ERRORS = (ValueError, IndexError, RuntimeError, TypeError)
NAMES = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "block_table",
         "cache_seqlens", "cache_batch_idx")  # fmt: skip


def _names_an_index_argument(err):
    assert isinstance(err, ERRORS), repr(err)
    assert any(n in str(err) for n in NAMES), str(err)


@st.composite
def offsets(draw, batch=None, total=12):
    """``batch + 1`` cumulative offsets over ``total`` tokens, then (a third of the time) one
    entry broken."""
    b = draw(st.integers(1, 3)) if batch is None else batch
    cu = [0, *sorted(draw(st.lists(st.integers(0, total), min_size=b - 1, max_size=b - 1))), total]
    if draw(st.sampled_from([False, False, True])):
        cu[draw(st.integers(0, b))] = draw(st.integers(-3, total + 3))
    return cu


MAXLEN = st.one_of(st.just(12), st.just(12), st.integers(-1, 12))


@ROBUST
@given(batch=st.integers(1, 3), data=st.data(), mq=MAXLEN, mk=MAXLEN)
def test_varlen_hostile_cu_seqlens(batch, data, mq, mk):
    cq, ck = data.draw(offsets(batch), "cu_seqlens_q"), data.draw(offsets(batch), "cu_seqlens_k")
    n = batch + 1
    g = torch.Generator().manual_seed(n)
    q, k, v = rand(12, 2, 16, g=g), rand(12, 2, 16, g=g), rand(12, 2, 16, g=g)
    lq = [b - a for a, b in itertools.pairwise(cq)]
    lk = [b - a for a, b in itertools.pairwise(ck)]
    valid = (
        cq[0] == ck[0] == 0
        and cq[-1] == ck[-1] == 12
        and min(lq + lk, default=0) >= 0
        and max(lq, default=0) <= mq
        and max(lk, default=0) <= mk
    )
    event("valid" if valid else "hostile")
    try:
        out = flash_attn_varlen_func(q, k, v, i32(cq), i32(ck), mq, mk, target=T)
    except ERRORS as e:
        assert not valid, e
        _names_an_index_argument(e)
        return
    assert valid
    for b in range(n - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        close(out[qs], ref_one(q[qs], k[ks], v[ks], None, False, (-1, -1)))


#: page ids: mostly in the pool of 5, sometimes not
PAGE_IDS = st.one_of(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4), st.integers(-2, 6))
TABLES = st.lists(st.lists(PAGE_IDS, min_size=3, max_size=3), min_size=2, max_size=2)
LENS = st.lists(st.one_of(st.integers(0, 46), st.integers(-2, 50)), min_size=2, max_size=2)


@ROBUST
@given(table=TABLES, lens=LENS, snew=st.sampled_from([0, 2]))
def test_kvcache_hostile_page_tables_and_lengths(table, lens, snew):
    g = torch.Generator().manual_seed(sum(lens) % 97)
    pool = 5
    q = rand(2, 1, 2, 16, g=g)
    kp, vp = rand(pool, PAGE, 2, 16, g=g), rand(pool, PAGE, 2, 16, g=g)
    kn, vn = (rand(2, snew, 2, 16, g=g), rand(2, snew, 2, 16, g=g)) if snew else (None, None)
    need = [-(-(n + snew) // PAGE) for n in lens]
    valid = min(lens) >= 0 and max(lens) + snew <= 3 * PAGE
    valid = valid and all(0 <= p < pool for b in range(2) for p in table[b][: need[b]])
    event("valid" if valid else "hostile")
    k0, v0 = kp.clone(), vp.clone()
    try:
        out = flash_attn_with_kvcache(
            q, kp, vp, kn, vn, cache_seqlens=i32(lens), block_table=i32(table), target=T
        )
    except ERRORS as e:
        assert not valid, e
        _names_an_index_argument(e)
        assert torch.equal(kp, k0) and torch.equal(vp, v0)  # nothing appended before the error
        return
    assert valid
    for b in range(2):
        pages = i32(table[b][: need[b]]).long()
        ks = kp[pages].flatten(0, 1)[: lens[b] + snew]
        vs = vp[pages].flatten(0, 1)[: lens[b] + snew]
        close(out[b], ref_one(q[b], ks, vs, None, False, (-1, -1)))


@ROBUST
@given(
    cq=offsets(),
    lens=LENS,
    table=TABLES,
    bidx=st.lists(st.one_of(st.integers(0, 2), st.integers(-1, 3)), min_size=2, max_size=2),
    snew=st.sampled_from([0, 2]),
)
def test_device_checks_agree_with_host_checks(monkeypatch, cq, lens, table, bidx, snew):
    """What a GPU runs (flags on the device; no host sync except the paged kvcache, which syncs
    as flash-attn does) rejects exactly what the host checks reject: run here by treating the
    CPU as a device. The no-sync form is ``torch._assert_async``, which on the CPU raises its
    message as a RuntimeError."""

    def host_then_device(fn):
        monkeypatch.setattr(validate, "HOST_VALUES", True)
        try:
            fn()
            host = None
        except ERRORS as e:
            host = e
        monkeypatch.setattr(validate, "HOST_VALUES", False)
        try:
            fn()
            dev = None
        except ERRORS as e:
            dev = e
        return host, dev

    total = max(cq[-1], 0)
    cu = i32(cq)
    mq = 9

    def varlen():
        validate.varlen(cu, cu, mq, mq, total, total, "f")

    host, dev = host_then_device(varlen)
    assert (host is None) == (dev is None), (host, dev)
    if dev is not None:
        assert isinstance(dev, RuntimeError) and "cu_seqlens" in str(dev)

    def paged():
        validate.kvcache(i32(lens), snew, 48, "f", block_table=i32(table), page=PAGE, pool=5)

    host, dev = host_then_device(paged)
    assert type(host) is type(dev) and str(host) == str(dev)  # the sync path: the same error

    def dense():
        validate.kvcache(i32(lens), snew, 48, "f", batch_idx=i32(bidx), batch_cache=3)

    host, dev = host_then_device(dense)
    assert (host is None) == (dev is None), (host, dev)
    if dev is not None:
        assert isinstance(dev, RuntimeError) and "cache_seqlens" in str(dev)


# -- a scale of zero or below: SDPA's answer on every kernel --------------------------------------


@pytest.mark.parametrize("scale", [0.0, -0.5, -1e-3])
def test_scale_zero_or_negative_is_sdpa(scale):
    g = torch.Generator().manual_seed(3)
    q, k, v = rand(2, 9, 4, 16, g=g), rand(2, 21, 2, 16, g=g), rand(2, 21, 2, 16, g=g)
    for t in (q, k, v):
        t.requires_grad_()
    out = flash_attn_func(q, k, v, softmax_scale=scale, target=T, config={"fwd": C16})
    qh, kh, vh = (t.detach().double().transpose(1, 2).requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, scale=scale, enable_gqa=True)
    close(out, ref.transpose(1, 2))
    do = rand(*out.shape, g=g)
    grads = torch.autograd.grad(out, (q, k, v), do)
    rgrads = torch.autograd.grad(ref, (qh, kh, vh), do.double().transpose(1, 2))
    for a, r in zip(grads, rgrads):
        torch.testing.assert_close(a.double(), r.transpose(1, 2), rtol=2e-2, atol=2e-2)
    # decode (packed GQA heads), split-KV and its combine
    qd = rand(2, 1, 4, 16, g=g)
    for splits in (1, 3):
        o = flash_attn_with_kvcache(qd, k.detach(), v.detach(), softmax_scale=scale,
                                    num_splits=splits, target=T)  # fmt: skip
        for b in range(2):
            close(o[b], ref_one(qd[b], k[b].detach(), v[b].detach(), scale, False, (-1, -1)))


# -- misuse: the type, and the message names the argument -----------------------------------------


def _qkv(g=None):
    g = g or torch.Generator().manual_seed(0)
    return rand(2, 5, 2, 16, g=g), rand(2, 7, 2, 16, g=g), rand(2, 7, 2, 16, g=g)


def _varlen(**kw):
    g = torch.Generator().manual_seed(1)
    q, k, v = rand(12, 2, 16, g=g), rand(12, 2, 16, g=g), rand(12, 2, 16, g=g)
    a = dict(cu_seqlens_q=i32([0, 5, 12]), cu_seqlens_k=i32([0, 5, 12]), max_seqlen_q=7,
             max_seqlen_k=7)  # fmt: skip
    a.update(kw)
    return lambda: flash_attn_varlen_func(q, k, v, target=T, **a)


def _paged_varlen(table):
    g = torch.Generator().manual_seed(3)
    q = rand(12, 2, 16, g=g)
    kp, vp = rand(6, PAGE, 2, 16, g=g), rand(6, PAGE, 2, 16, g=g)
    cu_q, cu_k = i32([0, 5, 12]), i32([0, 20, 40])
    return lambda: flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 7, 20, block_table=table, target=T)


def _kv(paged=True, **kw):
    g = torch.Generator().manual_seed(2)
    q = rand(2, 1, 2, 16, g=g)
    if paged:
        kc, vc = rand(6, PAGE, 2, 16, g=g), rand(6, PAGE, 2, 16, g=g)
        a = dict(block_table=i32([[0, 1, 2], [3, 4, 5]]), cache_seqlens=i32([20, 40]))
    else:
        kc, vc = rand(3, 30, 2, 16, g=g), rand(3, 30, 2, 16, g=g)
        a = dict(cache_seqlens=4)
    a.update(kw)
    return lambda: flash_attn_with_kvcache(q, kc, vc, target=T, **a)


def _new(n):
    g = torch.Generator().manual_seed(4)
    return {"k": rand(2, n, 2, 16, g=g), "v": rand(2, n, 2, 16, g=g)}


MISUSE = {
    "softcap nan": (lambda: flash_attn_func(*_qkv(), softcap=float("nan")), ValueError, "softcap"),
    "softcap inf": (lambda: flash_attn_func(*_qkv(), softcap=float("inf")), ValueError, "softcap"),
    "softcap str": (lambda: flash_attn_func(*_qkv(), softcap="5"), TypeError, "softcap"),
    "softcap list": (lambda: flash_attn_func(*_qkv(), softcap=[1.0]), TypeError, "softcap"),
    "scale str": (lambda: flash_attn_func(*_qkv(), softmax_scale="5"), TypeError, "softmax_scale"),
    "scale nan": (
        lambda: flash_attn_func(*_qkv(), softmax_scale=float("nan")),
        ValueError,
        "softmax_scale",
    ),
    "window float": (lambda: flash_attn_func(*_qkv(), window_size=(2.5, 0)), TypeError, "window"),
    "window -2": (lambda: flash_attn_func(*_qkv(), window_size=(-2, 0)), ValueError, "window"),
    "window one": (lambda: flash_attn_func(*_qkv(), window_size=(3,)), TypeError, "window_size"),
    "config str": (lambda: flash_attn_func(*_qkv(), config="fast"), TypeError, "config"),
    "config key": (lambda: flash_attn_func(*_qkv(), config={"fast": C16}), TypeError, "config"),
    "num_splits str": (lambda: flash_attn_func(*_qkv(), num_splits="2"), TypeError, "num_splits"),
    "cu int64": (_varlen(cu_seqlens_q=torch.tensor([0, 5, 12])), TypeError, "cu_seqlens_q"),
    "cu list": (_varlen(cu_seqlens_k=[0, 5, 12]), TypeError, "cu_seqlens_k"),
    "cu 2-D": (_varlen(cu_seqlens_q=i32([[0, 5, 12]])), ValueError, "cu_seqlens_q"),
    "cu lengths": (_varlen(cu_seqlens_k=i32([0, 12])), ValueError, "cu_seqlens_k"),
    "cu start": (_varlen(cu_seqlens_q=i32([1, 5, 12])), ValueError, "cu_seqlens_q"),
    "cu decreasing": (_varlen(cu_seqlens_k=i32([0, 9, 5])), ValueError, "cu_seqlens_k"),
    "cu last short": (_varlen(cu_seqlens_q=i32([0, 5, 10])), ValueError, "cu_seqlens_q"),
    "cu last past": (_varlen(cu_seqlens_k=i32([0, 5, 13])), ValueError, "cu_seqlens_k"),
    "max_seqlen short": (_varlen(max_seqlen_q=6), ValueError, "max_seqlen_q"),
    "max_seqlen float": (_varlen(max_seqlen_k=7.0), TypeError, "max_seqlen_k"),
    "max_seqlen negative": (_varlen(max_seqlen_k=-1), ValueError, "max_seqlen_k"),
    "varlen page past the pool": (_paged_varlen(i32([[0, 9], [2, 3]])), IndexError, "block_table"),
    "varlen pages past the table": (
        _paged_varlen(i32([[0], [2]])),
        RuntimeError,
        "block_table",
    ),
    "page id past the pool": (
        _kv(block_table=i32([[0, 9, 2], [3, 4, 5]])),
        IndexError,
        "block_table",
    ),
    "page id negative": (_kv(block_table=i32([[0, 1, 2], [3, -1, 5]])), IndexError, "block_table"),
    "block_table int64": (
        _kv(block_table=torch.tensor([[0, 1, 2], [3, 4, 5]])),
        TypeError,
        "block_table",
    ),
    "block_table batch": (_kv(block_table=i32([[0, 1, 2]])), ValueError, "block_table"),
    "cache_seqlens negative": (_kv(cache_seqlens=i32([-1, 4])), ValueError, "cache_seqlens"),
    "cache_seqlens past capacity": (
        _kv(cache_seqlens=i32([20, 49])),
        RuntimeError,
        "block_table",
    ),
    "appended past capacity": (
        _kv(cache_seqlens=i32([47, 3]), **_new(2)),
        RuntimeError,
        "block_table",
    ),
    "dense past capacity": (_kv(False, cache_seqlens=29, **_new(2)), RuntimeError, "k_cache"),
    "append without cache_seqlens": (
        _kv(False, cache_seqlens=None, **_new(1)),
        RuntimeError,
        "cache_seqlens",
    ),
    "cache_seqlens int64": (
        _kv(cache_seqlens=torch.tensor([1, 2])),
        TypeError,
        "cache_seqlens",
    ),
    "cache_seqlens float": (_kv(False, cache_seqlens=3.0), TypeError, "cache_seqlens"),
    "cache_batch_idx past": (
        _kv(False, cache_batch_idx=i32([0, 3])),
        IndexError,
        "cache_batch_idx",
    ),
    "cache_batch_idx negative": (
        _kv(False, cache_batch_idx=i32([-1, 0])),
        IndexError,
        "cache_batch_idx",
    ),
    "kvcache config str": (_kv(config="fast"), TypeError, "config"),
    "kvcache config dict of str": (_kv(config={"fwd": "fast"}), TypeError, "config"),
    "kvcache window 2.0": (_kv(window_size=(2.0, 0)), TypeError, "window"),
}


@pytest.mark.parametrize("name", list(MISUSE))
def test_misuse_names_the_argument(name):
    fn, exc, arg = MISUSE[name]
    with pytest.raises(exc) as e:
        fn()
    assert arg in str(e.value), str(e.value)
    assert "out-of-bounds" not in str(e.value)  # never the reference backend's first


def test_config_forms_and_window_beyond_int32_work():
    q, k, v = _qkv()
    want = flash_attn_func(q, k, v, window_size=(-1, 0), target=T)
    for w in ((2**31, 0), (2**40, 0), (6, 0)):  # 6 = sk - 1: hides no key either
        assert torch.equal(flash_attn_func(q, k, v, window_size=w, target=T), want)
    out = _kv(config={"fwd": C16, "bwd_dq": None})()
    assert torch.equal(out, _kv(config=C16)())


def test_unused_page_table_columns_may_hold_anything():
    """flash-attn reads only the pages a sequence covers: padding (-1, or stale ids) past them
    is fine."""
    ok = _kv(block_table=i32([[0, 1, -1], [3, 4, 5]]), cache_seqlens=i32([20, 40]))()
    want = _kv(block_table=i32([[0, 1, 2], [3, 4, 5]]), cache_seqlens=i32([20, 40]))()
    assert torch.equal(ok, want)


def test_paged_varlen_returns_the_forward_and_raises_on_backward():
    g = torch.Generator().manual_seed(5)
    q = rand(12, 2, 16, g=g).requires_grad_()
    kp, vp = rand(6, PAGE, 2, 16, g=g), rand(6, PAGE, 2, 16, g=g)
    args = (i32([0, 5, 12]), i32([0, 20, 40]), 7, 20)
    table = i32([[5, 1, 2], [3, 4, 0]])
    out = flash_attn_varlen_func(q, kp, vp, *args, block_table=table, target=T)
    assert out.requires_grad
    with torch.no_grad():
        want = flash_attn_varlen_func(q, kp, vp, *args, block_table=table, target=T)
    assert torch.equal(out.detach(), want)
    with pytest.raises(NotImplementedError, match="block_table"):
        out.sum().backward()


def test_meta_tensors_give_meta_outputs_of_the_right_shape():
    q, k, v = (t.to("meta").requires_grad_() for t in _qkv())
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.is_meta and out.shape == (2, 5, 2, 16) and lse.shape == (2, 2, 5)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert dq.is_meta and dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    dq, dk, dv = flash_attn_backward(out, q, k, v, out, lse)
    assert dq.is_meta and dk.shape == k.shape
    m = torch.device("meta")
    qv = torch.empty(12, 2, 16, dtype=BF16, device=m)
    cu = torch.empty(3, dtype=torch.int32, device=m)
    o = flash_attn_varlen_func(qv, qv, qv, cu, cu, 7, 7)
    assert o.is_meta and o.shape == (12, 2, 16)
    qd = torch.empty(2, 1, 4, 16, dtype=BF16, device=m)
    kc = torch.empty(6, PAGE, 2, 16, dtype=BF16, device=m)
    bt = torch.empty(2, 3, dtype=torch.int32, device=m)
    o, lse = flash_attn_with_kvcache(
        qd, kc, kc, cache_seqlens=cu[:2], block_table=bt, return_softmax_lse=True
    )
    assert o.is_meta and o.shape == (2, 1, 4, 16) and lse.shape == (2, 4, 1)


@pytest.mark.parametrize("rows", [4, 64])  # a small table (Python) and a big one (tensor ops)
def test_padded_page_tables_are_checked_entry_by_entry(rows):
    """A table padded with -1 past each row's pages fails the whole-table range test and takes
    the exact check: only the entries a sequence reads count, and the first bad one is named."""
    cols, pool = 100, 5000
    g = torch.Generator().manual_seed(rows)
    lens = torch.randint(1, 40 * PAGE, (rows,), generator=g).to(torch.int32)
    need = (lens + PAGE - 1) // PAGE
    table = torch.randint(0, pool, (rows, cols), generator=g).to(torch.int32)
    table[torch.arange(cols)[None, :] >= need[:, None]] = -1
    validate.kvcache(lens, 0, cols * PAGE, "f", block_table=table, page=PAGE, pool=pool)
    b = rows // 2
    table[b, int(need[b]) - 1] = pool
    with pytest.raises(IndexError, match=rf"block_table\[{b}, {int(need[b]) - 1}\] = {pool}"):
        validate.kvcache(lens, 0, cols * PAGE, "f", block_table=table, page=PAGE, pool=pool)
