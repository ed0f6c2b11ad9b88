"""GEMM kernels cross-compiled for gfx950 (no GPU): MFMA kind, spills, LDS, load widths, K loop.

Figures measured with Triton 3.9 (bf16 NT, M = N = K = 4096, ResourceReport
of the gfx950 AMDGCN; "K-loop instr" counts every instruction of the
innermost loop body, found by its backward branch, ``model.k_loop_body``):

===========================  ======  =======  ============  ==================  =============
shipped config               VGPR    LDS      K-loop instr  MFMA                global loads
===========================  ======  =======  ============  ==================  =============
decode 16x128x128 4w nk16    64      74 KiB   89            16x16x32_bf16       128-bit
small  64x256x64  8w nk32    92      81 KiB   64            32x32x16_bf16       128-bit
medium 128x128x64 4w nk32    134     65 KiB   84            32x32x16_bf16       128-bit
large  256x256x64 8w nk16    254     132 KiB  152           16x16x32_bf16       128-bit
===========================  ======  =======  ============  ==================  =============

All global loads of A and B are ``buffer_load_dwordx4 ... lds`` on gfx950:
Triton 3.9 emits direct-to-LDS loads (``direct_to_lds_loads`` equals the
number of 128-bit loads). References from the brief (not reproduced here):
torch 2.15's vendored FlyDSL GEMM 128x128x64 bf16 NT 52 VGPRs, 64 KiB LDS,
~34 instr per K tile; the Triton tutorial 128x128x64 154 VGPRs, ~91 unmasked.
Ours at 128x128x64 4 warps nonkdim 32 is 134 VGPRs, 65 KiB, 84 per K tile (NT; 92
before the K loop clamped operand rows instead of masking them: 8 ``v_cndmask`` per
tile; NN 102, TT 104, TN 113, where the M/N axis is the contiguous one and stays masked).
"""

from __future__ import annotations

import re

import pytest

from flydsl_kernels.gemm import FAMILY, configs, model
from flydsl_kernels.gemm.configs import Config

pytestmark = pytest.mark.compile

#: (vgpr_total, K-loop instructions) measured above; a regression past the margin fails
PINNED = {"decode": (64, 89), "small": (92, 64), "medium": (134, 84), "large": (254, 152)}
VGPR_MARGIN, INSTR_MARGIN = 8, 6
MFMA = {16: "v_mfma_f32_16x16x32_bf16", 32: "v_mfma_f32_32x32x16_bf16"}
LDS_LIMIT = 160 * 1024


@pytest.fixture(scope="module")
def compiled():
    return {name: model.compile_config(cfg) for name, cfg in configs.TABLES["gfx950"].items()}


def loop_source(triton_src: str) -> str:
    """The body of the ``for`` loop of the generated Triton source."""
    lines = triton_src.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(r"\s+for \w+ in tl\.range", ln))
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for ln in lines[start + 1 :]:
        if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
            break
        body.append(ln)
    return "\n".join(body)


@pytest.mark.parametrize("name", list(configs.TABLES["gfx950"]))
def test_shipped_config(compiled, name, capsys):
    cfg = configs.TABLES["gfx950"][name]
    ck = compiled[name]
    fig = model.figures(ck)
    r = ck.executable.report
    with capsys.disabled():
        print(f"\n[gfx950 {name}] {cfg.as_dict()} -> {fig}")
    assert fig["mfma"].get(MFMA[cfg.nonkdim]), fig["mfma"]
    assert set(fig["mfma"]) == {MFMA[cfg.nonkdim]}
    assert not r.scratch_bytes and not r.vgpr_spill_count and not r.sgpr_spill_count
    assert r.lds_bytes <= LDS_LIMIT
    assert set(fig["loads"]) == {128}, fig["loads"]  # every global load is 128-bit
    vgpr, instr = PINNED[name]
    assert r.vgpr_total <= vgpr + VGPR_MARGIN, (r.vgpr_total, vgpr)
    assert fig["k_loop"] <= instr + INSTR_MARGIN, (fig["k_loop"], instr)
    # the loop really is the K loop: it holds one K tile's MFMAs per wave (the pipeline's
    # last tile is peeled after it)
    body = model.k_loop_body(ck.stages()["amdgcn"])
    per_tile = cfg.BM * cfg.BN * cfg.BK // (cfg.nonkdim**2 * (512 // cfg.nonkdim)) // cfg.num_warps
    assert sum(ln.startswith("v_mfma") for ln in body) == per_tile


def test_no_k_mask_when_even(compiled):
    """EVEN_K: the loop has no comparison at all (its masks are the loop-invariant M/N ones)."""
    src = compiled["large"].stages()["triton"]
    body = loop_source(src)
    assert "tl.load" in body and "tl.dot" in body
    assert not re.search(r" (<|<=|>=|>) ", body), body
    # and the K tail does appear when K is not a multiple of BK
    odd = model.compile_config(configs.TABLES["gfx950"]["large"], K=4096 + 32).stages()["triton"]
    assert re.search(r" < K\b", loop_source(odd))


def test_layouts_all_128_bit():
    """Every layout (the unit-stride dim differs) keeps 128-bit global loads."""
    cfg = Config(128, 128, 64, 8, 4, 2, 32, 1)
    for layout in ("NN", "NT", "TN", "TT"):
        ck = model.compile_config(cfg, layout=layout)
        r = ck.executable.report
        assert set(r.load_widths_bits) == {128}, (layout, r.load_widths_bits)
        assert not r.scratch_bytes


def test_split_k_and_reduce_compile():
    ck = model.compile_config(configs.TABLES["gfx950"]["decode"], M=16, split_k=4)
    assert not ck.executable.report.scratch_bytes


def test_static_model_picks_shipped():
    """The model's ranking over the decode candidates still puts the shipped one first."""
    cands = [Config(16, bn, bk, 1, 4, 2, 16, 1) for bn in (64, 128) for bk in (128, 256)]
    ranked = model.rank("dense", candidates=cands)
    assert ranked[0][0] == configs.TABLES["gfx950"]["decode"], [r[0] for r in ranked[:2]]


def test_report_cases_compile():
    for case in FAMILY.cases():
        r = case.compile("gfx950").executable.report
        assert not r.scratch_bytes, case.shape


@pytest.mark.parametrize("target", ["gfx942", "gfx1250"])
def test_other_targets_report(target, capsys):
    """Printed, not pinned: the large config on the previous and the next AMD generation."""
    ck = model.compile_config(configs.TABLES["gfx950"]["large"], target=target)
    fig = model.figures(ck)
    with capsys.disabled():
        print(f"\n[{target} large] {fig}")
    assert fig["mfma"]


@pytest.mark.parametrize("m", [16, 64, 128, 4096])
def test_swiglu_tiles_do_not_spill(m):
    """The fused SwiGLU per shape class (Llama-3.1-8B gate+up, N=14336, K=4096) on gfx950: no
    scratch, 2 waves per SIMD, LDS within 160 KiB, 128-bit loads, the class's MFMA. Measured
    (Triton 3.9): decode 16x128x64 74 VGPR 70 KiB; small 64x256x64 140 VGPR 146 KiB; medium
    128x128x32 205 VGPR 49 KiB; large 256x128x64 256 VGPR (128 + 128 AGPR) 132 KiB."""
    from flydsl_core import TensorSpec
    from flydsl_kernels.gemm.plan import plan_swiglu

    n, k = 14336, 4096
    cfg = configs.select("swiglu", m, n, k)
    a, b = model.operand_specs(m, n, k, "bf16")
    o = TensorSpec("bf16", (1, m, n))
    ck = plan_swiglu(a, b, b, o, config=cfg, target="gfx950").compile("gfx950")
    fig = model.figures(ck)
    assert fig["scratch"] == 0 and fig["occ"] >= 2 and fig["lds"] <= LDS_LIMIT, fig
    assert 128 in fig["loads"] and MFMA[cfg.nonkdim] in fig["mfma"], fig


@pytest.mark.parametrize("target", ["sm90", "gfx1250", "gfx942"])
@pytest.mark.parametrize("m", [16, 4096])
def test_swiglu_tiles_do_not_spill_on_other_targets(target, m):
    """The SwiGLU tile of each target's own table compiles without scratch: the accumulator
    rule counts values per lane of the target's warp (32 lanes on sm90 / gfx1250; counting 64
    there gave sm90's prefill tile 624 B of scratch)."""
    from flydsl_core import TensorSpec
    from flydsl_kernels.gemm.plan import plan_swiglu

    n, k = 14336, 4096
    cfg = configs.select("swiglu", m, n, k, target=target)
    a, b = model.operand_specs(m, n, k, "bf16")
    o = TensorSpec("bf16", (1, m, n))
    ck = plan_swiglu(a, b, b, o, config=cfg, target=target).compile(target)
    assert model.figures(ck)["scratch"] == 0, (target, cfg)
