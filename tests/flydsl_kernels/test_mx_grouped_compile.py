"""The grouped MX GEMM cross-compiled (no GPU): the native scaled MFMA on gfx950, emulation on gfx942.

Static figures (Triton 3.9, cross-compiled for gfx950, untimed) of the shipped
configs at Qwen3-30B-A3B's gate_up shape (32768 rows = 4096 tokens x top-8,
128 experts, N=1536, K=2048); K loop = instructions of the persistent kernel's
inner loop, MFMA = scaled MFMAs per wave and K tile:

======  ================  ===========  ==========  =====  ====  =======  =====  ======
class   tile, warps       formats      VGPR/AGPR   SGPR   occ   LDS (B)  instr  K loop
======  ================  ===========  ==========  =====  ====  =======  =====  ======
decode  16x256x128, 8     fp8 x fp8    107 / 0     91     4     6144     730    135
decode  16x256x128, 8     fp4 x fp4    76 / 0      86     6     4096     574    79
small   64x256x128, 4     fp8 x fp8    218 / 0     106    2     19184    1152   243
large   256x128x128, 8    fp8 x fp8    128 / 85    104    2     102384   1183   199
large   256x128x128, 8    fp4 x fp4    128 / 24    93     3     52720    895    117
large   256x128x128, 8    fp8 x fp4    128 / 57    96     2     86000    1072   161
======  ================  ===========  ==========  =====  ====  =======  =====  ======

No scratch anywhere; decode uses 4 x v_mfma_scale_f32_16x16x128_f8f6f4, small and
large 16 x v_mfma_scale_f32_32x32x64_f8f6f4. gfx942 has no block-scaled MFMA:
Triton upcasts to bf16 (large: 128 x v_mfma_f32_32x32x8_bf16, 256 VGPR, 360 B of
scratch, 6306 instructions; decode: 32 x v_mfma_f32_16x16x16_bf16, 166 VGPR,
2491 instructions), recorded here, not asserted.

Ragged K (the weight gradient, Qwen3-30B-A3B gate_up dW: M=2048, N=1536, 128 K
groups over K=32768) with the large tile: 128 VGPR / 91 AGPR, 102384 B LDS, no
scratch, 1249 instructions, 208 in the K loop, 128-bit loads.
"""

from __future__ import annotations

import pytest

from flydsl_kernels.mx import FAMILY, configs, model

pytest.importorskip("triton")
pytestmark = pytest.mark.compile

SCALED_MFMA = {"v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4"}
SHAPE = model.GROUPED_MODEL_SHAPE
GROUPED = configs.TABLES["gfx950"]["grouped"]
CASES = [
    ("decode", "e4m3", "e4m3"),
    ("small", "e4m3", "e4m3"),
    ("large", "e4m3", "e4m3"),
    ("decode", "e2m1", "e2m1"),
    ("large", "e4m3", "e2m1"),  # a8w4
]


@pytest.mark.parametrize("cls, fa, fb", CASES)
def test_grouped_uses_the_native_scaled_mfma_on_gfx950(cls, fa, fb):
    cfg = GROUPED[cls]
    ck = model.compile_grouped(*SHAPE, fa, fb, cfg=cfg, target="gfx950")
    r = ck.executable.report
    print(
        f"gfx950 {cls} {fa}x{fb}: {dict(r.matrix_ops)} vgpr={r.vgpr} agpr={r.agpr} sgpr={r.sgpr} "
        f"lds={r.lds_bytes} occ={r.occupancy} instr={r.instruction_count}"
    )
    assert r.matrix_ops and set(r.matrix_ops) <= SCALED_MFMA, r.matrix_ops
    assert any(op in ck.stages()["amdgcn"] for op in SCALED_MFMA)
    assert not r.scratch_bytes and not r.vgpr_spill_count
    assert r.lds_bytes <= 160 * 1024
    assert r.occupancy >= 2  # the static model's floor


def test_grouped_ragged_k_uses_the_scaled_mfma_on_gfx950():
    """The weight-gradient form (K masked at each group's end) still lowers to the scaled MFMA."""
    cfg = configs.select("grouped", 2048, 1536, 4096 * 8, "e4m3", "e4m3")  # M = hidden 2048: large
    ck = model.compile_grouped(
        *model.WGRAD_MODEL_SHAPE, "e4m3", "e4m3", cfg=cfg, ragged_k=True, target="gfx950"
    )
    r = ck.executable.report
    print(
        f"gfx950 ragged K: {dict(r.matrix_ops)} vgpr={r.vgpr} agpr={r.agpr} lds={r.lds_bytes} "
        f"loads={dict(r.load_widths_bits)}"
    )
    assert r.matrix_ops and set(r.matrix_ops) <= SCALED_MFMA, r.matrix_ops
    assert not r.scratch_bytes and r.lds_bytes <= 160 * 1024
    # the group ends are rounded to multiples of 32 in the kernel, so the masked K loads stay
    # 128-bit (without that hint they were byte loads, and every tile spilled)
    assert max(r.load_widths_bits) == 128


def test_select_grouped_follows_the_shape_classes():
    def sel(*sizes):
        return configs.select("grouped", *sizes)

    assert sel(4, 1536, 2048, "e4m3", "e4m3") == GROUPED["decode"]
    assert sel(48, 1536, 2048, "e4m3", "e4m3") == GROUPED["small"]
    assert sel(256, 1536, 2048, "e4m3", "e4m3") == GROUPED["large"]


@pytest.mark.parametrize("cls", ("decode", "large"))
def test_grouped_is_emulated_on_gfx942(cls):
    """Recorded, not asserted beyond the obvious: gfx942 has no block-scaled MFMA."""
    cfg = GROUPED[cls]
    r = model.compile_grouped(*SHAPE, "e4m3", "e4m3", cfg=cfg, target="gfx942").executable.report
    print(
        f"gfx942 {cls}: {dict(r.matrix_ops)} vgpr={r.vgpr} scratch={r.scratch_bytes} "
        f"instr={r.instruction_count}"
    )
    assert not set(r.matrix_ops) & SCALED_MFMA


def test_grouped_family_cases_compile_for_gfx950():
    cases = [c for c in FAMILY.cases() if c.kernel == "mx_grouped_gemm_nt"]
    assert len(cases) == 5 and all(c.config_for("gfx950")["kernel"] == "grouped" for c in cases)
    r = cases[-1].compile("gfx950").executable.report  # gpt-oss a8w4
    assert set(r.matrix_ops) <= SCALED_MFMA and not r.scratch_bytes
