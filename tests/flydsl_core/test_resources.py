"""Resource reports of small Triton kernels cross-compiled on the CPU for every GPU target.

Each kernel is compiled once per module (``_build`` is cached); the facts
asserted are what Triton 3.9 really emits: 128-bit vector memory operations
for aligned bf16 rows, the matrix instruction family of each arch, no scratch
for simple kernels, and register-limited occupancy equal to LLVM's own
``; Occupancy:`` comment.
"""

from __future__ import annotations

import functools
import json
import os
import re

import pytest

from flydsl_core.compile.resources import Instr, ResourceReport, amd_occupancy, count_instructions
from flydsl_core.targets import get_target

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from flydsl_core.backends.triton import amdgcn, ptx  # noqa: E402
from flydsl_core.backends.triton.amdgcn import parse_amdgcn  # noqa: E402
from flydsl_core.backends.triton.ptx import parse_ptx  # noqa: E402
from flydsl_core.backends.triton.report import report_from_triton  # noqa: E402

pytestmark = pytest.mark.compile

# Triton reads this knob at compile time; set it to silence its warning.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


@triton.jit
def _copy_rows(x, y, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    for s in range(0, N, BLOCK):
        tl.store(y + row * N + s + offs, tl.load(x + row * N + s + offs))


@triton.jit
def _rmsnorm_row(x, w, y, eps, N: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N)
    v = tl.load(x + row * N + offs).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / N + eps)
    tl.store(y + row * N + offs, (v * r * tl.load(w + offs).to(tl.float32)).to(tl.bfloat16))


@triton.jit
def _matmul_tile(a, b, c, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.dot(
        tl.load(a + rm[:, None] * BK + rk[None, :]), tl.load(b + rk[:, None] * BN + rn[None, :])
    )
    tl.store(c + rm[:, None] * BN + rn[None, :], acc.to(tl.bfloat16))


@triton.jit
def _matmul_k_loop(a, b, c, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a_t = tl.load(a + rm[:, None] * K + k + rk[None, :])
        b_t = tl.load(b + (k + rk[:, None]) * BN + rn[None, :])
        acc += tl.dot(a_t, b_t)
    tl.store(c + rm[:, None] * BN + rn[None, :], acc.to(tl.bfloat16))


_COPY = (
    _copy_rows,
    {"x": "*bf16", "y": "*bf16", "N": "constexpr", "BLOCK": "constexpr"},
    {"N": 8192, "BLOCK": 2048},
)
_RMS = (
    _rmsnorm_row,
    {"x": "*bf16", "w": "*bf16", "y": "*bf16", "eps": "fp32", "N": "constexpr"},
    {"N": 8192},
)
_MM_SIG = {
    "a": "*bf16",
    "b": "*bf16",
    "c": "*bf16",
    "BM": "constexpr",
    "BN": "constexpr",
    "BK": "constexpr",
}
_MM64 = (_matmul_tile, _MM_SIG, {"BM": 64, "BN": 64, "BK": 64})
_MM128 = (_matmul_tile, _MM_SIG, {"BM": 128, "BN": 128, "BK": 64})
_LOOP = (
    _matmul_k_loop,
    {
        "a": "*bf16",
        "b": "*bf16",
        "c": "*bf16",
        "K": "i32",
        **{k: "constexpr" for k in ("BM", "BN", "BK")},
    },
    {"BM": 128, "BN": 128, "BK": 64},
)

# name -> (kernel spec, target, options)
KERNELS = {
    "gfx950/copy": (_COPY, "gfx950", {"num_warps": 4}),
    "gfx950/rms": (_RMS, "gfx950", {"num_warps": 8}),
    "gfx950/mm64": (_MM64, "gfx950", {"num_warps": 4}),
    "gfx950/mm128": (_MM128, "gfx950", {"num_warps": 4}),
    "gfx950/loop": (_LOOP, "gfx950", {"num_warps": 4, "num_stages": 2}),
    # 128x128 fp32 accumulators cannot fit the 64 VGPRs of 8 waves per SIMD: spills.
    "gfx950/spill": (_MM128, "gfx950", {"num_warps": 4, "waves_per_eu": 8}),
    "gfx942/copy": (_COPY, "gfx942", {"num_warps": 4}),
    "gfx942/mm64": (_MM64, "gfx942", {"num_warps": 4}),
    "gfx1250/copy": (_COPY, "gfx1250", {"num_warps": 4}),
    "gfx1250/mm64": (_MM64, "gfx1250", {"num_warps": 4}),
    "sm90/copy": (_COPY, "sm90", {"num_warps": 4}),
    "sm90/mm128": (_MM128, "sm90", {"num_warps": 4}),
    "sm90/loop": (_LOOP, "sm90", {"num_warps": 4, "num_stages": 2}),
    # the same tile capped at 128 registers per thread: ptxas spills to local memory.
    "sm90/spill": (_MM128, "sm90", {"num_warps": 4, "maxnreg": 128}),
}
AMD = [k for k in KERNELS if KERNELS[k][1].startswith("gfx") and k != "gfx950/spill"]


@functools.cache
def _build(name: str):
    (fn, signature, constexprs), target, options = KERNELS[name]
    # 16-byte aligned pointers, as torch's allocations are: what lets Triton vectorize.
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, ty in enumerate(signature.values())
        if ty.startswith("*") or ty == "i32"
    }
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=get_target(target).triton_target(), options=options)


@functools.cache
def _report(name: str) -> ResourceReport:
    return report_from_triton(_build(name))


def _shape(instr: str) -> int:
    """M*N*K of one matrix instruction from its name."""
    m = re.search(r"m(\d+)n(\d+)k(\d+)", instr) or re.search(r"(\d+)x(\d+)x(\d+)", instr)
    assert m, instr
    return int(m.group(1)) * int(m.group(2)) * int(m.group(3))


def _macs_per_workgroup(r: ResourceReport) -> int:
    """Multiply-accumulates the listing's matrix instructions do for one workgroup."""
    per_wave = sum(n * _shape(op) for op, n in r.matrix_ops.items())
    if r.backend == "cuda":  # wgmma is issued per warpgroup of 4 warps
        return per_wave * (r.num_warps // 4)
    return per_wave * r.num_warps


# -- memory widths -------------------------------------------------------------


@pytest.mark.parametrize("name", ["gfx950/copy", "gfx950/rms"])
def test_gfx950_bf16_rows_use_128_bit_loads(name):
    r = _report(name)
    assert set(r.load_widths_bits) == {128}, r.global_loads
    assert set(r.global_loads) <= {"buffer_load_dwordx4", "global_load_dwordx4"}
    assert set(r.store_widths_bits) == {128}
    # 8192 bf16 = 16 KiB per row; each 128-bit lane load moves 16 B.
    lanes = r.num_warps * 64
    assert sum(r.load_widths_bits.values()) * lanes * 16 >= 8192 * 2
    assert r.direct_to_lds_loads == 0


def test_rms_reduction_goes_through_lds():
    r = _report("gfx950/rms")
    assert r.lds_reads and r.lds_writes  # the cross-wave sum of squares
    assert r.lds_bytes == 32  # Triton's metadata.shared: one fp32 per wave
    assert r.lds_static_bytes == 0  # Triton's LDS is dynamic


@pytest.mark.parametrize("name", ["gfx942/copy", "gfx1250/copy", "sm90/copy"])
def test_copy_is_128_bit_on_every_gpu(name):
    r = _report(name)
    assert set(r.load_widths_bits) == {128}, r.global_loads
    assert set(r.store_widths_bits) == {128}


def test_gfx1250_copy_uses_b128_names():
    assert set(_report("gfx1250/copy").global_loads) <= {"buffer_load_b128", "global_load_b128"}


def test_sm90_copy_is_ld_global_v4():
    r = _report("sm90/copy")
    assert set(r.global_loads) == {"ld.global.v4.b32"}
    assert set(r.global_stores) == {"st.global.v4.b32"}


def test_direct_to_lds_loads():
    amd = _report("gfx950/loop")
    assert amd.direct_to_lds_loads > 0
    assert "global_load_lds_dwordx4" in amd.global_loads
    nv = _report("sm90/loop")
    assert nv.direct_to_lds_loads > 0
    assert nv.load_widths_bits.get(128, 0) >= nv.direct_to_lds_loads  # cp.async of 16 B


# -- matrix instructions -----------------------------------------------------------


def test_gfx950_matmul_uses_cdna4_bf16_mfma():
    for name in ("gfx950/mm64", "gfx950/mm128"):
        ops = _report(name).matrix_ops
        assert ops, name
        assert set(ops) <= {"v_mfma_f32_32x32x16_bf16", "v_mfma_f32_16x16x32_bf16"}


def test_gfx942_matmul_uses_cdna3_bf16_mfma():
    ops = _report("gfx942/mm64").matrix_ops
    assert ops
    assert all(re.fullmatch(r"v_mfma_f32_(32x32x8|16x16x16)_?bf16(_1k)?", op) for op in ops), ops


def test_gfx1250_matmul_uses_wmma():
    r = _report("gfx1250/mm64")
    assert r.matrix_ops
    assert all(op.startswith("v_wmma_") for op in r.matrix_ops)
    assert not any(op.startswith("v_mfma") for op in r.matrix_ops)


def test_sm90_matmul_uses_wgmma():
    ops = _report("sm90/mm128").matrix_ops
    assert ops
    assert all(op.startswith("wgmma.mma_async") for op in ops)


@pytest.mark.parametrize(
    "name, shape",
    [
        ("gfx950/mm64", (64, 64, 64)),
        ("gfx950/mm128", (128, 128, 64)),
        ("gfx942/mm64", (64, 64, 64)),
        ("gfx1250/mm64", (64, 64, 64)),
        ("sm90/mm128", (128, 128, 64)),
    ],
)
def test_matrix_instructions_cover_the_tile_exactly(name, shape):
    # The instruction counts are per wave; times the waves they must do the tile's MACs.
    r = _report(name)
    assert _macs_per_workgroup(r) == shape[0] * shape[1] * shape[2]


# -- registers, scratch, occupancy -----------------------------------------------------


@pytest.mark.parametrize("name", AMD)
def test_amd_simple_kernels(name):
    r = _report(name)
    assert r.vgpr > 0 and r.sgpr > 0 and r.vgpr_total >= r.vgpr
    assert r.scratch_bytes == 0
    assert r.vgpr_spill_count == 0 and r.sgpr_spill_count == 0
    assert r.num_warps == KERNELS[name][2]["num_warps"]
    assert r.instruction_count > 0
    counted = (
        sum(r.global_loads.values())
        + sum(r.global_stores.values())
        + sum(r.lds_reads.values())
        + sum(r.lds_writes.values())
        + r.matrix_op_count
    )
    assert r.instruction_count > counted
    assert r.code_bytes >= 4 * r.instruction_count  # AMDGCN encodings are 4 or 8 bytes
    assert r.code_bytes <= 12 * r.instruction_count
    assert not r.warnings, r.warnings


@pytest.mark.parametrize("name", AMD)
def test_amd_occupancy_matches_the_compiler(name):
    r = _report(name)
    assert r.compiler_occupancy is not None
    # LLVM's figure counts registers (and static LDS, 0 here): it must equal ours.
    assert r.occupancy_limits["vgpr"] == r.compiler_occupancy
    if r.occupancy_limits.get("lds", 99) >= r.compiler_occupancy:
        assert r.occupancy == r.compiler_occupancy
    assert 1 <= r.occupancy <= get_target(KERNELS[name][1]).registers.max_waves_per_simd


def test_amd_register_facts():
    # gfx950 bf16 128x128x64 tile with 4 waves: 64 fp32 accumulators per lane plus
    # operands -> more than 64 VGPRs, so fewer than 8 waves per SIMD.
    r = _report("gfx950/mm128")
    assert r.vgpr > 64 and r.occupancy < 8
    assert r.occupancy_limiter == "vgpr"
    # wave32 gfx1250 allows up to 16 waves per SIMD; a copy uses few registers.
    assert _report("gfx1250/copy").occupancy == 16
    assert _report("gfx1250/copy").agpr is None


def test_amd_spill_is_reported():
    r = _report("gfx950/spill")
    assert r.vgpr_total <= 64  # 512 / 8 waves
    assert r.vgpr_spill_count > 0
    assert r.scratch_bytes > 0
    assert r.compiler_occupancy == 8


def test_sm90_registers_and_occupancy():
    r = _report("sm90/mm128")
    assert 0 < r.vgpr <= 255
    assert r.scratch_bytes == 0 and r.spill_store_bytes == 0 and r.spill_load_bytes == 0
    assert r.occupancy_unit == "warps_per_sm"
    assert 0 < r.occupancy <= 64 and r.occupancy % r.num_warps == 0
    # a 128x128 fp32 accumulator tile on one warpgroup needs >128 registers per thread
    assert r.vgpr > 128 and "registers" in r.occupancy_limiter
    assert r.lds_bytes >= 32 * 1024  # two bf16 tiles staged through shared memory


def test_sm90_registers_agree_with_ptxas():
    ck = _build("sm90/mm128")
    from_cubin = _report("sm90/mm128")
    from_ptxas = parse_ptx(ck.asm["ptx"], "sm90")  # no cubin: runs Triton's ptxas -v
    if from_ptxas.vgpr is None:
        pytest.skip(f"ptxas unavailable: {from_ptxas.reasons.get('vgpr')}")
    assert from_ptxas.vgpr == from_cubin.vgpr
    assert from_ptxas.spill_store_bytes == 0


def test_sm90_spill_is_reported():
    r = _report("sm90/spill")
    assert r.vgpr <= 128
    assert r.scratch_bytes > 0
    if r.spill_store_bytes is None:
        pytest.skip(f"ptxas unavailable: {r.reasons.get('spill_store_bytes')}")
    assert r.spill_store_bytes > 0 and r.spill_load_bytes > 0


# -- the report as data ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["gfx950/mm128", "sm90/mm128"])
def test_report_is_json(name):
    d = json.loads(json.dumps(_report(name).to_dict()))
    assert d["target"] == KERNELS[name][1]
    assert d["matrix_ops"]


def test_unknown_figures_are_none_with_a_reason():
    ck = _build("gfx950/mm64")
    r = parse_amdgcn(ck.asm["amdgcn"], "gfx950")  # no shared_bytes
    assert r.lds_bytes is None and "lds_bytes" in r.reasons
    assert r.num_warps == 4  # from .max_flat_workgroup_size
    nv = parse_ptx(_build("sm90/copy").asm["ptx"], "sm90", run_ptxas=False)
    assert nv.vgpr is None and nv.reasons["vgpr"]
    assert nv.spill_store_bytes is None and nv.occupancy is None
    assert nv.sgpr is None and "sgpr" in nv.reasons
    assert set(nv.load_widths_bits) == {128}  # the PTX alone still gives the mix


def test_wrong_target_is_rejected():
    with pytest.raises(ValueError, match="gfx950"):
        report_from_triton(_build("gfx950/copy"), "gfx942")


def test_metadata_and_comments_are_cross_checked():
    text = _build("gfx950/copy").asm["amdgcn"]
    doctored = re.sub(r"(\.vgpr_count:\s+)\d+", r"\g<1>200", text)
    r = parse_amdgcn(doctored, "gfx950", shared_bytes=0)
    assert r.vgpr_total == 200  # the metadata is preferred ...
    assert any("vgpr_total" in w for w in r.warnings)  # ... and the mismatch reported


def test_amd_occupancy_model():
    g950 = get_target("gfx950")
    # LLVM: 512 VGPRs, granule 8, at most 8 waves.
    assert amd_occupancy(g950, vgprs=128)[0]["vgpr"] == 4
    assert amd_occupancy(g950, vgprs=129)[0]["vgpr"] == 3
    assert amd_occupancy(g950, vgprs=7)[0]["vgpr"] == 8
    assert amd_occupancy(g950, vgprs=512)[0]["vgpr"] == 1
    # 64 KiB of LDS per 4-wave workgroup: 2 workgroups per 160 KiB CU -> 2 waves per SIMD.
    limits, wgs = amd_occupancy(g950, vgprs=32, lds_bytes=64 * 1024, num_warps=4)
    assert limits["lds"] == 2 and wgs == 2
    # the same workgroup does not fit gfx942's 64 KiB twice
    assert (
        amd_occupancy(get_target("gfx942"), vgprs=32, lds_bytes=64 * 1024, num_warps=4)[0]["lds"]
        == 1
    )
    # more than a workgroup may have: does not fit at all
    assert amd_occupancy(g950, vgprs=32, lds_bytes=161 * 1024, num_warps=4)[0]["lds"] == 0


_NESTED = """\
\t.text
\t.globl\tk
\t.type\tk,@function
k:
\ts_mov_b32 s0, 0
.LBB0_1:
\ts_add_i32 s0, s0, 1
.LBB0_2:
\tds_read_b128 v[0:3], v4
\tv_mfma_f32_32x32x16_bf16 v[8:23], v[0:3], v[0:3], v[8:23]
\ts_cmp_lt_i32 s1, 4
\ts_cbranch_scc1 .LBB0_2
\tbuffer_store_dword v8, off, s[4:7], 0
\ts_cmp_lt_i32 s0, 8
\ts_cbranch_scc1 .LBB0_1
\ts_endpgm
.Lfunc_end0:
"""


def test_loops_are_counted_and_the_matrix_loop_is_the_innermost_with_mfma():
    r = parse_amdgcn(_NESTED, "gfx950", shared_bytes=0)
    assert r.loop_instructions == [4, 8]  # inner (ds_read..branch), outer (includes inner)
    assert r.matrix_loop_instructions == 4
    copy = _report("gfx950/copy")
    assert copy.matrix_loop_instructions is None


#: LLVM's rotated layout: the latch block (.LBB0_3) sits above the header (.LBB0_4), and a block
#: behind a uniform branch (the lazy rescale) jumps back up to the latch
_ROTATED = """\
\t.text
\t.type\tk,@function
k:
\ts_mov_b32 s0, 0
\ts_branch .LBB0_4
.LBB0_3:
\tv_mfma_f32_32x32x16_bf16 v[8:23], v[0:3], v[0:3], v[8:23]
\ts_add_i32 s0, s0, 1
\ts_cmp_lt_i32 s0, 8
\ts_cbranch_scc0 .LBB0_5
.LBB0_4:
\tds_read_b128 v[0:3], v4
\tv_mfma_f32_16x16x32_bf16 v[8:11], v[0:3], v[0:3], v[8:11]
\tv_cmp_lt_i32_e32 vcc, 0, v5
\ts_and_saveexec_b64 s[6:7], vcc
\ts_cbranch_execz .LBB0_3
\tv_pk_mul_f32 v[24:25], v[24:25], v[6:7]
\tv_pk_mul_f32 v[26:27], v[26:27], v[6:7]
\ts_branch .LBB0_3
.LBB0_5:
\ts_endpgm
.Lfunc_end0:
"""


def test_the_loop_finder_follows_the_control_flow_graph():
    from flydsl_core.backends.triton import amdgcn

    (lp,) = amdgcn.loops(_ROTATED)
    # one loop: the latch above the header, and the skippable block counted apart
    assert lp.header == ".LBB0_4" and len(lp.instructions) == 12
    assert lp.always == 9 and lp.conditional == 3
    assert lp.matrix == 1.5  # a 32x32x16 counts 1, a 16x16x32 half
    assert lp.per_matrix_op == 6.0
    assert amdgcn.main_matrix_loop(_ROTATED) == lp
    r = parse_amdgcn(_ROTATED, "gfx950", shared_bytes=0)
    assert r.matrix_loop_instructions == 9 and r.matrix_loop_mfma == 1.5
    assert r.matrix_loops == [{"instructions": 9, "conditional": 3, "mfma": 1.5}]
    assert r.loop_per_mfma == (6.0, 6.0)
    # nested loops: only the innermost one holding a matrix op is a matrix loop
    nested = amdgcn.matrix_loops(_NESTED)
    assert [len(x.instructions) for x in nested] == [4] and nested[0].inner


@pytest.mark.parametrize(
    "mnem, weight",
    [
        ("v_mfma_f32_32x32x16_bf16", 1.0),
        ("v_mfma_f32_16x16x32_bf16", 0.5),
        ("v_mfma_f32_32x32x8_bf16", 1.0),
        ("v_wmma_f32_16x16x32_bf16", 0.5),
        ("v_mfma_scale_f32_32x32x64_f8f6f4", 1.0),
        ("v_mfma_f32_4x4x4_16b_f16", 1 / 64),
        ("v_add_f32", 0.0),
    ],
)
def test_matrix_weight_is_in_32x32_equivalents(mnem, weight):
    from flydsl_core.backends.triton.amdgcn import matrix_weight

    assert matrix_weight(mnem) == weight


@pytest.mark.parametrize(
    "mnem, arch, weight",
    [
        ("v_mfma_f32_32x32x16_bf16", "gfx950", 1.0),
        ("v_mfma_f32_16x16x32_bf16", "gfx950", 0.5),
        ("v_mfma_f32_16x16x16_bf16", "gfx950", 0.25),  # legacy form: a quarter of the work
        ("v_mfma_f32_32x32x8_f16", "gfx950", 0.5),
        ("v_mfma_scale_f32_32x32x64_f8f6f4", "gfx950", 1.0),
        ("v_mfma_scale_f32_16x16x128_f8f6f4", "gfx950", 0.5),
        ("v_mfma_f32_32x32x16_fp8_fp8", "gfx950", 0.25),
        ("v_mfma_f32_32x32x8bf16_1k", "gfx942", 1.0),
        ("v_mfma_f32_16x16x16bf16_1k", "gfx942", 0.5),
        ("v_mfma_f32_16x16x32_fp8_fp8", "gfx942", 0.5),
        ("v_mfma_i32_32x32x16_i8", "gfx942", 1.0),
        ("v_wmma_f32_16x16x32_bf16", "gfx1250", 0.5),  # WMMA: by output area
    ],
)
def test_matrix_weight_by_the_archs_fastest_mfma(mnem, arch, weight):
    """With the arch, an MFMA counts its multiply-adds against the arch's fastest 32x32 form of
    its input type: gfx950's legacy forms are not counted as if they did gfx950's work."""
    from flydsl_core.backends.triton.amdgcn import matrix_weight

    assert matrix_weight(mnem, arch) == weight


@pytest.mark.parametrize("target", ["gfx950", "sm90"])
def test_a_matmul_k_loop_holds_its_matrix_ops(target):
    r = _report(f"{target}/loop")
    assert r.loop_instructions, r.loop_instructions
    assert 0 < r.matrix_loop_instructions <= r.instruction_count
    assert _report(f"{target}/mm128").loop_instructions == []  # one tile: no loop


# -- the per-ISA classifiers and the one counting loop ----------------------------------------------


@pytest.mark.parametrize(
    "mnem, ops, want",
    [
        (
            "v_mfma_f32_32x32x16_bf16",
            "v[8:23], v[0:3], v[0:3], v[8:23]",
            Instr("matrix", "v_mfma_f32_32x32x16_bf16"),
        ),
        (
            "v_wmma_f32_16x16x32_bf16",
            "v[0:7], v[8:15], v[16:23], v[0:7]",
            Instr("matrix", "v_wmma_f32_16x16x32_bf16"),
        ),
        (
            "buffer_load_dwordx4",
            "v[0:3], v4, s[0:3], 0 offen",
            Instr("load", "buffer_load_dwordx4", 128),
        ),
        (
            "buffer_load_dword",
            "v1, s[0:3], 0 offen lds",
            Instr("load", "buffer_load_dword lds", 32, True),
        ),
        (
            "global_load_lds_dwordx4",
            "v[2:3], off",
            Instr("load", "global_load_lds_dwordx4", 128, True),
        ),
        ("global_store_short", "v[0:1], v2, off", Instr("store", "global_store_short", 16)),
        ("ds_read2_b64", "v[0:3], v4 offset1:8", Instr("lds_read", "ds_read2_b64", 128)),
        ("ds_write_b128", "v4, v[0:3]", Instr("lds_write", "ds_write_b128", 128)),
        ("tensor_load_to_lds", "s[0:3], s[4:11]", Instr("load", "tensor_load_to_lds", None, True)),
        ("s_cbranch_scc1", ".LBB0_2", Instr(None, "s_cbranch_scc1", branch_to=".LBB0_2")),
        ("v_add_f32_e32", "v0, v1, v2", Instr(None, "v_add_f32_e32")),
    ],
)
def test_amdgcn_classifier(mnem, ops, want):
    assert amdgcn.classify(mnem, ops) == want


@pytest.mark.parametrize(
    "op, ops, want",
    [
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "{...}",
            Instr("matrix", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
        ),
        (
            "ld.global.v4.b32",
            "{%r1, %r2, %r3, %r4}, [%rd1]",
            Instr("load", "ld.global.v4.b32", 128),
        ),
        ("st.global.b16", "[%rd1], %rs1", Instr("store", "st.global.b16", 16)),
        ("ld.shared.v2.f32", "{%f1, %f2}, [%r1]", Instr("lds_read", "ld.shared.v2.f32", 64)),
        (
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "{...}, [%r1]",
            Instr("lds_read", "ldmatrix.sync.aligned.m8n8.x4.shared.b16", 128),
        ),
        (
            "cp.async.cg.shared.global",
            "[%r1], [%rd1], 16",
            Instr("load", "cp.async.cg.shared.global", 128, True),
        ),
        ("bra.uni", "$L__BB0_1", Instr(None, "bra.uni", branch_to="$L__BB0_1")),
        ("bra", "$L__BB0_1", Instr(None, "bra", branch_to="$L__BB0_1")),
    ],
)
def test_ptx_classifier(op, ops, want):
    assert ptx.classify(op, ops) == want


def test_one_counting_loop_for_every_isa():
    stream = [
        Instr("load", "a", 128),
        "L1",
        Instr("matrix", "m"),
        Instr("lds_read", "r", 64),
        Instr(None, "br", branch_to="L1"),
        Instr("store", "s", 32),
        Instr("load", "a lds", 32, True),
        Instr(None, "br", branch_to="nowhere"),
    ]
    got = count_instructions(stream)
    assert got["instruction_count"] == 7 and got["direct_to_lds_loads"] == 1
    assert got["global_loads"] == {"a": 1, "a lds": 1} and got["load_widths_bits"] == {
        32: 1,
        128: 1,
    }
    assert got["global_stores"] == {"s": 1} and got["store_widths_bits"] == {32: 1}
    assert got["matrix_ops"] == {"m": 1} and got["lds_reads"] == {"r": 1}
    assert got["loop_instructions"] == [3] and got["matrix_loop_instructions"] == 3
