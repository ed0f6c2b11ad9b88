"""TopK family vs PyTorch on the CPU: the reference backend and Triton's interpreter.

Every kernel runs on fresh random data (seeded per case) with awkward shapes,
ties, NaN/Inf/-0.0, every dtype, largest/smallest, sorted/unsorted and dims
other than the last. Deterministic results must equal a stable sort's
(values descending, or ascending for smallest, ties by index ascending);
every result must satisfy ``x.gather(dim, idx) == values``.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from flydsl_kernels.topk import FAMILY, Config, moe_router, select, topk, topk_rows
from flydsl_kernels.topk import reference as ref

pytestmark = pytest.mark.cpu

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
METHODS = ("small", "sort", "radix", "radix_split")


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _data(shape, dtype, kind, g):
    """Fresh inputs: ``randn``, ``ties`` (a few distinct values) or ``special`` (NaN/Inf/-0)."""
    if kind == "ties":
        return torch.randint(-3, 4, shape, generator=g).to(dtype)
    x = torch.randn(shape, generator=g).mul(4).to(dtype)
    if kind == "special" and x.numel():
        flat = x.view(-1)
        n = flat.numel()
        pick = torch.randperm(n, generator=g)
        specials = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, float("nan")]
        for j, s in zip(pick[: min(n, 3 * len(specials))].tolist(), specials * 3):
            flat[j] = s
    return x


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN (bits of NaN may differ: torch's gather canonicalizes)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def check(
    x,
    k,
    dim=-1,
    largest=True,
    sorted=True,
    *,
    deterministic=True,
    method=None,
    target=None,
    config=None,
    twice=True,
):
    """Run topk (or one config through topk_rows) and check it against torch; returns (v, i)."""

    def run():
        if config is None:
            return topk(
                x,
                k,
                dim,
                largest,
                sorted,
                deterministic=deterministic,
                method=method,
                target=target,
            )
        xt = x.movedim(dim, -1)
        v, i = topk_rows(
            xt.reshape(-1, xt.shape[-1]), k, largest, sorted, config=config, target=target
        )
        shape = (*xt.shape[:-1], k)
        return v.reshape(shape).movedim(-1, dim), i.reshape(shape).movedim(-1, dim)

    v, i = run()
    rv, ri = ref.topk_stable(x, k, dim, largest)
    tv, _ = torch.topk(x, k, dim, largest, True)
    assert v.dtype == x.dtype and i.dtype == torch.int64 and v.shape == rv.shape == i.shape
    assert _same(x.gather(dim, i), v), "gather invariant"
    det = config.deterministic if config is not None else deterministic
    if sorted:
        assert _same(v, rv) and _same(v, tv), "values (sorted)"
        if det:
            assert torch.equal(i, ri), "indices under the tie rule"
    else:
        assert _same(torch.sort(v, dim=dim, descending=largest, stable=True).values, rv), (
            "value set"
        )
        if det:
            assert torch.equal(i.sort(dim).values, ri.sort(dim).values), "index set"
    if det and twice:
        v2, i2 = run()
        assert torch.equal(i, i2) and torch.equal(_bits(v), _bits(v2)), "bitwise reproducible"
    return v, i


# -- the reference backend: every kernel, broad coverage -------------------------------------------

SHAPES = [  # (shape, k, dim)
    ((1, 1), 1, -1),
    ((1, 97), 13, -1),  # N prime
    ((3, 257), 16, -1),  # N = 2^8 + 1
    ((2, 1025), 9, 1),
    ((4, 33, 5), 7, 1),  # a middle dim
    ((37, 6), 6, 0),  # k = N along dim 0
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["randn", "ties", "special"])
def test_kernels_reference(method, dtype, kind):
    for shape, k, dim in SHAPES:
        for largest in (True, False):
            g = _gen(method, dtype, kind, shape, largest)
            x = _data(shape, dtype, kind, g)
            check(x, k, dim, largest, True, method=method, twice=kind == "ties")
            check(x, k, dim, largest, False, method=method, deterministic=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_selection_rule_end_to_end(dtype):
    # problems on both sides of each switch of the rule, through the default path
    assert select("topk", 300, 9000, 100, dtype).kernel == "radix"  # many rows: one program per row
    assert select("topk", 4, 9000, 100, dtype).kernel == "radix_split"
    for m, n, k in [(2, 100, 16), (2, 100, 17), (3, 8192, 64), (2, 8193, 17), (1, 20011, 5)]:
        g = _gen("rule", dtype, m, n, k)
        x = _data((m, n), dtype, "ties" if n % 2 else "randn", g)
        plan = select("topk", m, n, k, dtype)
        check(x, k)
        check(x, k, largest=False, sorted=False)
        assert plan.kernel in METHODS


def test_large_rows_reference():
    # radix select at N = 262144 (both layouts), merge-sorted survivors, k up to N
    g = _gen("large")
    x = _data((2, 262144), torch.float32, "special", g)
    check(x, 1024)  # the rule: few rows -> radix_split
    check(x[:1], 1024, method="radix", largest=False, twice=False)
    check(x[1:], 5000, method="radix", twice=False)  # merge sort of 5000 survivors
    xb = _data((1, 65537), torch.bfloat16, "ties", g)
    check(xb, 4099, method="radix_split", sorted=False)
    check(xb, 4099, method="radix_split", deterministic=False)
    xs = _data((1, 3001), torch.float16, "special", g)
    check(xs, 3001, method="radix")  # k == N: a full stable sort


def test_split_and_merge_plans_reference():
    # small chunks so rows split over many programs and survivors merge over several passes
    g = _gen("plans")
    for dtype in DTYPES:
        x = _data((2, 3001), dtype, "ties", g)
        for det in (True, False):
            p = Config(
                "radix_split", BLOCK=256, split=5, deterministic=det, sorter="merge", MERGE_B=64
            )
            check(x, 777, largest=det, config=p)
        check(x, 1, config=Config("radix_split", BLOCK=128, split=40), twice=False)
        check(x, 11, config=Config("small", KP=16, BLOCK=512, CHUNKED=True), twice=False)


def test_deterministic_default_follows_torch():
    x = _data((1, 9000), torch.float32, "ties", _gen("det"))
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        v1, i1 = topk(x, 300)
        assert select("topk", 1, 9000, 300, torch.float32, deterministic=True).deterministic
        v2, i2 = topk(x, 300)
        assert torch.equal(i1, i2) and torch.equal(v1, v2)
        assert torch.equal(i1, ref.topk_stable(x, 300)[1])
    finally:
        torch.use_deterministic_algorithms(prev)


def test_empty_and_degenerate():
    for shape, k, dim in [((0, 5), 3, -1), ((4, 0), 0, -1), ((3, 5), 0, 1), ((2, 0, 3), 2, 2)]:
        x = torch.randn(shape)
        v, i = topk(x, k, dim)
        tv, ti = torch.topk(x, k, dim)
        assert v.shape == tv.shape and i.shape == ti.shape and i.dtype == torch.int64
    s = torch.tensor(2.5)
    v, i = topk(s, 1)
    assert v.shape == () and float(v) == 2.5 and int(i) == 0
    with pytest.raises(RuntimeError, match="out of range"):
        topk(torch.randn(3, 4), 5)
    with pytest.raises(IndexError):
        topk(torch.randn(3, 4), 1, dim=2)
    with pytest.raises(TypeError, match="supports"):
        topk(torch.arange(5), 2)
    # a non-contiguous input and a row stride
    x = torch.randn(6, 64)[:, 3:40]
    check(x, 5)
    check(torch.randn(40, 7).t(), 4)


# -- Triton's interpreter: every kernel, small grids ------------------------------------------------

INTERP = "cpu-interpret"


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_and_sort_interpreter(dtype):
    g = _gen("interp-a", dtype)
    x = _data((2, 600), dtype, "special", g)
    t = _data((2, 257), dtype, "ties", g)
    check(x, 8, target=INTERP, method="small")
    check(t, 5, largest=False, target=INTERP, method="small", twice=False)
    check(t.t().contiguous(), 2, dim=0, target=INTERP, method="sort", twice=False)
    if dtype == torch.float32:
        check(
            x, 3, target=INTERP, config=Config("small", KP=4, BLOCK=256, CHUNKED=True), twice=False
        )
        check(x, 40, largest=False, target=INTERP, method="sort", twice=False)
        check(_data((1, 1), dtype, "randn", g), 1, target=INTERP, method="sort", twice=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_radix_interpreter(dtype):
    g = _gen("interp-b", dtype)
    x = _data((2, 601), dtype, "special", g)
    t = _data((2, 500), dtype, "ties", g)
    p = Config("radix", BLOCK=256, sorter="tile", SORT_KP=64)
    check(x, 50, target=INTERP, config=p)
    split = Config("radix_split", BLOCK=128, split=4, deterministic=True, sorter="tile", SORT_KP=64)
    check(t, 37, largest=False, target=INTERP, config=split, twice=False)
    if dtype == torch.float32:
        check(t, 300, sorted=False, target=INTERP, config=Config("radix", BLOCK=512), twice=False)
        for det in (True, False):
            unsorted = Config("radix_split", BLOCK=128, split=4, deterministic=det)
            check(x, 37, largest=False, sorted=False, target=INTERP, config=unsorted, twice=False)
        nd = Config(
            "radix_split", BLOCK=128, split=4, deterministic=False, sorter="tile", SORT_KP=64
        )
        check(t, 37, target=INTERP, config=nd)


def test_merge_sort_interpreter():
    g = _gen("interp-c")
    x = _data((1, 200), torch.float32, "ties", g)
    check(x, 100, target=INTERP, config=Config("radix", BLOCK=128, sorter="merge", MERGE_B=16))
    xb = _data((1, 40), torch.bfloat16, "special", g)
    cfg = Config("radix_split", BLOCK=16, split=3, deterministic=False, sorter="merge", MERGE_B=16)
    check(xb, 40, largest=False, target=INTERP, config=cfg)


# -- the MoE router ------------------------------------------------------------------------------------


def _router_check(w, ids, rw, rids, atol, rtol):
    # same experts in the same order (both sorted best first); weights within tolerance
    assert ids.shape == rids.shape and w.dtype == torch.float32
    assert torch.equal(ids.long(), rids.long())
    torch.testing.assert_close(w, rw.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("target", ["cpu-reference", INTERP])
def test_router_qwen3(target):
    g = _gen("qwen3", target)
    logits = torch.randn(9, 128, generator=g).to(torch.bfloat16)  # bf16 logits tie often
    for renorm in (False, True):
        w, ids = moe_router(logits, 8, scoring="softmax", renormalize=renorm, target=target)
        rw, rids = ref.qwen3_moe_router(logits, 8, renorm)
        # torch.topk orders tied probabilities its own way; ours: ties by expert id
        _router_check(w, ids, *ref.in_kernel_order(rw, rids, logits.float()), 1e-6, 1e-5)
    # 60 experts (not a power of two), fp32 logits, int32 ids
    l60 = torch.randn(5, 60, generator=g)
    w, ids = moe_router(l60, 4, scoring="softmax", ids_dtype=torch.int32, target=target)
    assert ids.dtype == torch.int32
    _router_check(w, ids, *ref.qwen3_moe_router(l60, 4, False), 1e-6, 1e-5)


@pytest.mark.parametrize("target", ["cpu-reference", INTERP])
def test_router_deepseek_v3(target):
    g = _gen("dsv3", target)
    logits = torch.randn(7, 256, generator=g)
    bias = torch.randn(256, generator=g) * 0.1
    w, ids = moe_router(
        logits,
        8,
        scoring="sigmoid",
        renormalize=True,
        bias=bias,
        n_group=8,
        topk_group=4,
        routed_scaling_factor=2.5,
        target=target,
    )
    rw, rids = ref.deepseek_v3_router(logits, bias, 8, 8, 4, True, 2.5)
    # the reference selects with sorted=False: compare in our order (biased score descending)
    _router_check(w, ids, *ref.in_kernel_order(rw, rids, logits.sigmoid() + bias), 1e-6, 1e-5)
    # ungrouped, no bias, not renormalized
    w, ids = moe_router(logits[:, :100], 6, scoring="sigmoid", target=target)
    rw, rids = ref.deepseek_v3_router(logits[:, :100], torch.zeros(100), 6, 1, 1, False, 1.0)
    _router_check(w, ids, *ref.in_kernel_order(rw, rids, logits[:, :100]), 1e-6, 1e-5)


@pytest.mark.parametrize("target", ["cpu-reference", INTERP])
def test_router_gpt_oss(target):
    g = _gen("gptoss", target)
    logits = (torch.randint(-8, 8, (11, 128), generator=g) / 4).to(torch.bfloat16)  # many ties
    w, ids = moe_router(logits, 4, scoring="topk_softmax", target=target)
    rw, rids = ref.gpt_oss_router(logits, 4)
    # same chosen logits as transformers (whichever of the tied experts torch.topk took) ...
    assert torch.equal(torch.gather(logits, 1, ids), torch.gather(logits, 1, rids))
    torch.testing.assert_close(w, rw.float(), atol=4e-3, rtol=1e-2)  # reference softmax is bf16
    # ... and exactly the stable choice, with fp32 softmax weights
    sv, si = ref.topk_stable(logits, 4)
    _router_check(w, ids, torch.softmax(sv.float(), 1), si, 1e-6, 1e-5)


def test_router_validation():
    l = torch.randn(3, 16)
    with pytest.raises(ValueError, match="scoring"):
        moe_router(l, 2, scoring="relu")
    with pytest.raises(ValueError, match="top_k"):
        moe_router(l, 17)
    with pytest.raises(ValueError, match="sigmoid"):
        moe_router(l, 2, bias=torch.zeros(16))
    w, ids = moe_router(torch.randn(0, 16), 2)
    assert w.shape == (0, 2) and ids.shape == (0, 2)


# -- the family's report cases on the CPU ------------------------------------------------------------


def test_family_cases_check_on_cpu():
    cases = list(FAMILY.cases())
    assert {c.kernel for c in cases} >= {"topk_small", "topk_sort", "topk_radix"}
    for c in cases:
        assert c.check("cpu") <= 1.0, (c.kernel, c.shape)
