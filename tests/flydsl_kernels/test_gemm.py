"""GEMM family on the CPU: dense and grouped GEMM on cpu-reference and Triton's interpreter.

References: ``reference.gemm`` (torch.matmul in fp32 of the 16-bit inputs,
epilogue in fp32, one rounding) and ``reference.grouped_mm`` (one matmul per
group), itself checked against ``torch._grouped_mm`` on the CPU. Inputs are
fresh random data, seeded per test.

Tolerances (rtol, atol), stated: fp32 output 1e-4 / 1e-4 against the fp32
reference of the same bf16-rounded inputs (only the summation order
differs); bf16 output 1e-2 / 1e-2 and fp16 2e-3 / 2e-3 (one rounding of an
fp32-exact value: about one ulp of the output). Triton 3.9's interpreter
computes bf16 ``tl.dot`` wrongly; flydsl_core's cpu-interpret lowering
upcasts around it, which the fp32-output checks here verify. Sizes stay
small: the reference backend runs one program per Python iteration.
"""

from __future__ import annotations

import pytest
import torch

from flydsl_kernels.gemm import FAMILY, api, configs, reference
from flydsl_kernels.gemm import plan as gemm_plan
from flydsl_kernels.gemm.configs import Config

pytestmark = pytest.mark.cpu

TARGETS = ["cpu-reference", "cpu-interpret"]
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
TOL = {FP32: (1e-4, 1e-4), BF16: (1e-2, 1e-2), FP16: (2e-3, 2e-3)}
#: a small tile so that the shapes below span several tiles in M, N and K
SMALL = Config(16, 32, 32, 2, 4, 2, 16, 1)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rand(*shape, g, dtype=BF16):
    return torch.randn(*shape, generator=g).to(dtype)


def close(out, ref, dtype=None):
    rtol, atol = TOL[dtype or out.dtype]
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref.double(), rtol=rtol, atol=atol)


def operand(m, n, transposed, g, dtype=BF16):
    """An ``(m, n)`` operand, stored as given or as the transpose of an ``(n, m)`` tensor."""
    return rand(n, m, g=g, dtype=dtype).t() if transposed else rand(m, n, g=g, dtype=dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("mnk", [(1, 53, 71), (37, 53, 71), (16, 64, 64)])
def test_layouts_and_shapes(target, layout, mnk):
    m, n, k = mnk
    g = gen(hash((layout, mnk)) % 1000)
    a = operand(m, k, layout[0] == "T", g)
    b = operand(k, n, layout[1] == "T", g)
    for odt in (FP32, BF16):
        out = api.gemm(a, b, out_dtype=odt, target=target, config=SMALL, split_k=1)
        close(out, reference.gemm(a, b, out_dtype=odt))


@pytest.mark.parametrize("target", TARGETS)
def test_fp16_and_batched(target):
    g = gen(1)
    a, b = rand(3, 20, 40, g=g, dtype=FP16), rand(3, 40, 24, g=g, dtype=FP16)
    close(api.gemm(a, b, target=target, config=SMALL), reference.gemm(a, b))
    w = rand(24, 40, g=g).t()  # a 2-D weight broadcast over the batch, transposed (NT)
    x = rand(2, 9, 40, g=g)
    close(
        api.gemm(x, w, out_dtype=FP32, target=target, config=SMALL),
        reference.gemm(x, w, out_dtype=FP32),
    )


EPILOGUES = [
    dict(activation="relu"),
    dict(activation="gelu"),
    dict(activation="gelu_tanh"),
    dict(activation="silu"),
    dict(bias="col"),
    dict(bias="row"),
    dict(alpha=0.5, beta=2.0, c="full"),
    dict(alpha=1.0, beta=-1.0, c="row"),  # addmm's broadcast bias-like C
    dict(bias="col", activation="silu", residual=True),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "-".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("split_k", [1, 3])
def test_epilogues(target, epi, split_k):
    m, n, k = 21, 45, 100
    g = gen(7)
    a, b = rand(m, k, g=g), rand(n, k, g=g).t()
    kw = dict(epi)
    if kw.get("bias") == "col":
        kw["bias"] = rand(n, g=g)
    elif kw.get("bias") == "row":
        kw["bias"] = rand(m, 1, g=g)
    if kw.get("c") == "full":
        kw["c"] = rand(m, n, g=g)
    elif kw.get("c") == "row":
        kw["c"] = rand(n, g=g)
    if kw.pop("residual", False):
        kw["residual"] = rand(m, n, g=g, dtype=FP32)
    out = api.gemm(a, b, out_dtype=FP32, target=target, config=SMALL, split_k=split_k, **kw)
    close(out, reference.gemm(a, b, out_dtype=FP32, **kw))


@pytest.mark.parametrize("target", TARGETS)
def test_split_k_rule_and_determinism(target):
    """Decode shape: the rule splits K; fixed-order reduction gives bit-identical results."""
    g = gen(3)
    a, b = rand(2, 2048, g=g), rand(64, 2048, g=g).t()
    cfg = Config(16, 64, 64, 1, 4, 2, 16, 1)
    assert configs.split_k(cfg, 2, 64, 2048) > 1
    o1 = api.gemm(a, b, out_dtype=FP32, target=target, config=cfg)
    o2 = api.gemm(a, b, out_dtype=FP32, target=target, config=cfg)
    assert torch.equal(o1, o2)
    close(o1, reference.gemm(a, b, out_dtype=FP32))


def test_shipped_configs_reference():
    """Every shipped config at a shape that is not a tile multiple (reference backend)."""
    g = gen(5)
    for cfg in configs.TABLES["gfx950"].values():
        a, b = rand(cfg.BM + 3, 200, g=g), rand(cfg.BN - 5, 200, g=g).t()
        close(api.gemm(a, b, config=cfg, split_k=1), reference.gemm(a, b))
        close(
            api.gemm(a, b, config=cfg, split_k=2, out_dtype=FP32),
            reference.gemm(a, b, out_dtype=FP32),
        )


def test_empty_and_k0():
    a, b = torch.zeros(0, 8, dtype=BF16), torch.zeros(8, 5, dtype=BF16)
    assert api.gemm(a, b).shape == (0, 5)
    a, b = torch.zeros(3, 0, dtype=BF16), torch.zeros(0, 5, dtype=BF16)
    assert torch.equal(api.gemm(a, b, config=SMALL), torch.zeros(3, 5, dtype=BF16))


def test_validation():
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    with pytest.raises(TypeError, match="bf16 and fp16"):
        api.gemm(a, b)
    a, b = a.to(BF16), b.to(FP16)
    with pytest.raises(TypeError, match="one dtype"):
        api.gemm(a, b)
    b = b.to(BF16)
    with pytest.raises(ValueError, match="K differs"):
        api.gemm(a, b.t())
    with pytest.raises(ValueError, match="activation"):
        api.gemm(a, b, activation="tanh")
    with pytest.raises(ValueError, match="bias"):
        api.gemm(a, b, bias=torch.zeros(5, dtype=BF16))
    with pytest.raises(TypeError, match="outputs"):
        api.gemm(a, b, out_dtype=torch.int32)
    with pytest.raises(TypeError, match="int32"):
        api.grouped_mm(a, b, torch.tensor([4], dtype=torch.int64))
    with pytest.raises(ValueError, match="offs"):
        api.grouped_mm(a, b)


# -- grouped ---------------------------------------------------------------------------------------


def offsets(sizes):
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)


# empty groups (first, middle, last), groups smaller than a tile, one larger than several tiles
RAGGED = [0, 3, 0, 1, 40, 7, 0]


@pytest.mark.parametrize("target", TARGETS)
def test_grouped_2d_3d_ragged_m(target):
    g = gen(11)
    offs = offsets(RAGGED)
    a, b = rand(int(offs[-1]), 72, g=g), rand(len(RAGGED), 48, 72, g=g).transpose(1, 2)
    ref = reference.grouped_mm(a, b, offs)
    close(ref, torch._grouped_mm(a, b, offs))
    close(api.grouped_mm(a, b, offs, target=target, config=SMALL), ref)
    bias = rand(len(RAGGED), 48, g=g)
    out = api.grouped_mm(a, b, offs, bias=bias, target=target, config=SMALL)
    close(out, reference.grouped_mm(a, b, offs, bias=bias))


@pytest.mark.parametrize("target", TARGETS)
def test_grouped_3d_3d(target):
    g = gen(12)
    a, b = rand(3, 19, 64, g=g), rand(3, 64, 40, g=g)
    ref = reference.grouped_mm(a, b)
    close(ref, torch._grouped_mm(a, b))
    close(api.grouped_mm(a, b, target=target, config=SMALL), ref)


@pytest.mark.parametrize("target", TARGETS)
def test_grouped_2d_2d_ragged_k(target):
    g = gen(13)
    offs = offsets([0, 8, 33, 0, 5])
    kt = int(offs[-1])
    a, b = rand(kt, 24, g=g).t(), rand(kt, 40, g=g)  # dW = X^T @ dY per expert
    ref = reference.grouped_mm(a, b, offs)
    close(ref, torch._grouped_mm(a, b, offs))
    close(api.grouped_mm(a, b, offs, target=target, config=SMALL), ref)


@pytest.mark.parametrize("target", TARGETS)
def test_grouped_3d_2d_ragged_n(target):
    g = gen(14)
    offs = offsets([16, 0, 3, 45])
    a, b = rand(4, 18, 64, g=g), rand(int(offs[-1]), 64, g=g).t()
    ref = reference.grouped_mm(a, b, offs)
    close(ref, torch._grouped_mm(a, b, offs))
    close(api.grouped_mm(a, b, offs, target=target, config=SMALL), ref)


def test_grouped_fp32_out_and_shipped():
    g = gen(15)
    offs = offsets([5, 0, 70, 2])
    a, b = rand(int(offs[-1]), 128, g=g), rand(4, 128, 96, g=g)
    ref = reference.grouped_mm(a, b, offs, out_dtype=FP32)
    close(api.grouped_mm(a, b, offs, out_dtype=FP32, config=SMALL), ref)
    close(api.grouped_mm(a, b, offs, out_dtype=FP32), ref)  # the shipped config for the shape


def test_family_checks():
    cases = list(FAMILY.cases())
    assert cases and all(c.family == "gemm" for c in cases)
    for case in cases:
        assert case.check("cpu") <= 1, case.shape


def test_select_shape_classes_and_grid_fill():
    S = configs.TABLES["gfx950"]
    assert configs.select("dense", 1, 4096, 4096) == S["decode"]
    assert configs.select("dense", 64, 4096, 4096) == S["small"]
    assert configs.select("dense", 128, 6144, 4096) == S["medium"]
    assert configs.select("dense", 4096, 4096, 4096) == S["large"]  # 16 x 16 tiles of 256: every CU
    assert (
        configs.select("dense", 4096, 1024, 4096) == S["medium"]
    )  # 16 x 4 large tiles would idle CUs
    assert configs.select("dense", 1024, 1024, 4096, batch=16) == S["large"]


@pytest.mark.parametrize("programs", [5, 11, 16])
def test_grouped_xcd_remapped_persistent_schedule_covers_every_tile(monkeypatch, programs):
    """With gfx950's 8 XCDs the persistent programs take remapped tile runs: still every tile
    exactly once, whatever the program count (ragged: programs % 8 != 0)."""
    monkeypatch.setattr(gemm_plan, "target_xcds", lambda target: 8)
    monkeypatch.setattr(configs, "grouped_programs", lambda target: programs)
    g = gen(17)
    offs = offsets(RAGGED)
    a, b = rand(int(offs[-1]), 72, g=g), rand(len(RAGGED), 48, 72, g=g).transpose(1, 2)
    tiny = Config(16, 16, 32, 3, 4, 1, 16, 1)  # many tiles per program, GROUP_M = 3
    close(api.grouped_mm(a, b, offs, config=tiny), reference.grouped_mm(a, b, offs))


# -- fused SwiGLU ------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mnk", [(1, 45, 70), (19, 40, 136), (33, 64, 64)])
def test_swiglu_matches_two_gemms(target, mnk):
    """``silu(a @ wg) * (a @ wu)`` in one kernel: gate NT (``W.t()``), up NN, awkward sizes."""
    m, n, k = mnk
    g = gen(21 + m)
    a, wg, wu = rand(m, k, g=g), rand(n, k, g=g).t(), rand(k, n, g=g)
    for odt in (FP32, BF16):
        out = api.swiglu(a, wg, wu, out_dtype=odt, target=target, config=SMALL)
        close(out, reference.swiglu(a, wg, wu, out_dtype=odt))


def test_swiglu_batched_shipped_empty_and_out():
    g = gen(22)
    a, wg, wu = rand(2, 9, 64, g=g, dtype=FP16), rand(48, 64, g=g, dtype=FP16).t(), None
    wu = rand(48, 64, g=g, dtype=FP16).t()
    close(api.swiglu(a, wg, wu), reference.swiglu(a, wg, wu))  # shipped decode tile, batched
    out = torch.full((2, 9, 48), float("nan"), dtype=FP32)
    assert api.swiglu(a, wg, wu, out_dtype=FP32, out=out) is out
    close(out, reference.swiglu(a, wg, wu, out_dtype=FP32))
    assert api.swiglu(a[:, :0], wg, wu).shape == (2, 0, 48)
    k0 = api.swiglu(rand(3, 0, g=g), rand(0, 5, g=g), rand(0, 5, g=g))
    assert torch.equal(k0, torch.zeros(3, 5, dtype=BF16))
    with pytest.raises(ValueError, match="one shape"):
        api.swiglu(a, wg, wu[:, :40])


def test_swiglu_tile_rule():
    """The dense class tile, BN halved while two accumulators pass 128 fp32 per lane, then BK
    halved while the pipeline passes 80 KiB of LDS per 4 waves."""
    for m in (1, 16, 64, 128, 200, 4096):
        cfg, dense = (
            configs.select("swiglu", m, 14336, 4096),
            configs.select("dense", m, 14336, 4096),
        )
        assert (cfg.BM, cfg.num_warps) == (dense.BM, dense.num_warps)
        assert 2 * cfg.BM * cfg.BN // (64 * cfg.num_warps) <= configs.SWIGLU_MAX_ACC_PER_LANE
        assert configs.swiglu_lds(cfg) <= configs.SWIGLU_LDS_PER_4_WAVES * cfg.num_warps // 4
    assert configs.select("swiglu", 4096, 14336, 4096).BN == 128  # large: 256x256 -> 256x128


def test_gemm_and_grouped_write_into_out():
    g = gen(23)
    a, b = rand(21, 40, g=g), rand(40, 30, g=g)
    out = torch.empty(30, 21, dtype=FP32).t()  # a strided destination
    assert api.gemm(a, b, out_dtype=FP32, config=SMALL, out=out) is out
    close(out, reference.gemm(a, b, out_dtype=FP32))
    with pytest.raises(ValueError, match="shape"):
        api.gemm(a, b, out_dtype=FP32, out=torch.empty(21, 31))
    offs = offsets([4, 0, 9])
    x, w = rand(13, 32, g=g), rand(3, 32, 24, g=g)
    dst = torch.empty(13, 24, dtype=BF16)
    assert api.grouped_mm(x, w, offs, config=SMALL, out=dst) is dst
    close(dst, reference.grouped_mm(x, w, offs))


@pytest.mark.cpu
def test_check_tolerance_covers_fp32_accumulation_at_full_k_and_not_a_dropped_block():
    # the GPU checks run at full K (4096 and up) against a float64 reference: an fp32 sum
    # in another order passes, one K block of 64 left out does not
    from flydsl_kernels.gemm.cases import _err, _spread

    g = torch.Generator().manual_seed(7)
    m, n, k, bk = 48, 80, 4096, 64
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, generator=g).to(torch.bfloat16)
    parts = [a[:, i : i + bk].float() @ b[i : i + bk].float() for i in range(0, k, bk)]
    out = torch.zeros(m, n)
    for p in reversed(parts):  # fp32, blocked and reversed: another order than the reference
        out += p
    ref = reference.gemm(a, b, out_dtype=torch.float64, acc_dtype=torch.float64)
    absp = reference.gemm(a.abs(), b.abs(), out_dtype=torch.float64, acc_dtype=torch.float64)
    assert (out.double() - ref).abs().max() > 0  # the orders do differ
    assert _err(out, ref, _spread(absp, k)) <= 1.0
    assert _err(out - parts[17], ref, _spread(absp, k)) > 50
