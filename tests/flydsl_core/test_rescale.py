"""``fly.rescale(x, factor)``: the values of ``x * factor`` on every backend; on AMD CDNA
(``Target.has_wave_skip_asm``) an asm block whose wave skips the multiplies when all its
factors are exactly 1 (``rules.elementwise.rescale_asm``), what an online softmax's lazy
accumulator rescale needs. Where LLVM's register choice does not fit the asm's guards, the
kernel is compiled again with plain multiplies (never wrong code).
"""

from __future__ import annotations

import pytest
import torch
from tests.flydsl_core.conftest import randn

import flydsl_core as fly
from flydsl_core.backends.triton import amdgcn


@fly.kernel
def rescale_rows(x: fly.Tensor, f: fly.Tensor, out: fly.Tensor, BM: fly.constexpr,
                 BN: fly.constexpr):  # fmt: skip
    t = x[fly.ds(0, BM), fly.ds(0, BN)].load()
    fr = f[fly.ds(0, BM)].load()
    out[fly.ds(0, BM), fly.ds(0, BN)].store(fly.rescale(t, fr[:, None]))


@fly.kernel
def rescale_full(x: fly.Tensor, f: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    t = x[fly.ds(0, B)].load()
    out[fly.ds(0, B)].store(fly.rescale(t, f[fly.ds(0, B)].load()))


@fly.kernel
def rescaled_accumulator(q: fly.Tensor, k: fly.Tensor, v: fly.Tensor, f: fly.Tensor,
                         out: fly.Tensor, N, BM: fly.constexpr, BN: fly.constexpr,
                         D: fly.constexpr):  # fmt: skip
    # an online softmax's shape: the accumulator of a chained dot (s = q k^T, acc += p v),
    # rescaled per row before each accumulation; Triton gives a lane one row of it on AMD
    qt = q[fly.ds(0, BM), fly.ds(0, D)].load()
    acc = fly.zeros((BM, D), fly.fp32)
    for n in fly.range(0, N, BN):
        s = fly.dot(qt, k[fly.ds(n, BN), fly.ds(0, D)].load().T)
        p = fly.exp2(s * 0.01)
        fr = f[fly.ds(n // BN * BM, BM)].load()
        acc.set(fly.rescale(acc, fr[:, None]))
        acc += fly.dot(p.to(fly.bf16), v[fly.ds(n, BN), fly.ds(0, D)].load())
    out[fly.ds(0, BM), fly.ds(0, D)].store(acc)


def _factors(n, seed):
    """Mostly exactly 1 (the skipped case), some not, and the special values."""
    g = torch.Generator().manual_seed(seed)
    f = torch.where(torch.rand(n, generator=g) < 0.6, 1.0, torch.rand(n, generator=g) * 2)
    f[:4] = torch.tensor([float("nan"), float("inf"), 0.0, -1.0])[: min(4, n)]
    return f


@pytest.mark.cpu
def test_rescale_is_the_product(target):
    x = randn((32, 16), seed=1)
    x[0, :4] = torch.tensor([float("inf"), -0.0, float("nan"), 1e-30])
    f = _factors(32, 2)
    out = torch.empty_like(x)
    rescale_rows[(1,)](x, f, out, BM=32, BN=16, target=target)
    torch.testing.assert_close(out, x * f[:, None], rtol=0, atol=0, equal_nan=True)
    # a full-shape factor (no broadcast) and 16-bit tiles (the product rounds as a mul does)
    y = randn((64,), seed=3, dtype=torch.bfloat16)
    g = _factors(64, 4).to(torch.bfloat16)
    o = torch.empty_like(y)
    rescale_full[(1,)](y, g, o, B=64, target=target)
    torch.testing.assert_close(o, y * g, rtol=0, atol=0, equal_nan=True)


@pytest.mark.cpu
def test_rescale_rejects_integer_tiles():
    from flydsl_core.exc import FlyDSLError

    x = torch.zeros(16, dtype=torch.int32)
    with pytest.raises(FlyDSLError, match="rescale scales a float tile"):
        rescale_full[(1,)](x, x, x, B=16, target="cpu-reference")


def _accumulator_kernel(target):
    q = fly.TensorSpec(torch.bfloat16, (128, 128))
    kv = fly.TensorSpec(torch.bfloat16, (512, 128))
    f = fly.TensorSpec(torch.float32, (8 * 128,))
    out = fly.TensorSpec(torch.float32, (128, 128))
    return rescaled_accumulator.compile(
        q,
        kv,
        kv,
        f,
        out,
        512,
        BM=128,
        BN=64,
        D=128,
        target=target,
        options={"num_warps": 4, "num_stages": 1},
    )


@pytest.mark.cpu
def test_rescaled_accumulator_matches_torch():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(32, 16, generator=g).to(torch.bfloat16)
    k = torch.randn(64, 16, generator=g).to(torch.bfloat16)
    v = torch.randn(64, 16, generator=g).to(torch.bfloat16)
    f = _factors(4 * 32, 8).abs().nan_to_num(posinf=2.0)
    out = torch.empty(32, 16)
    rescaled_accumulator[(1,)](q, k, v, f, out, 64, BM=32, BN=16, D=16, target="cpu-reference")
    acc = torch.zeros(32, 16, dtype=torch.float64)
    for t in range(4):
        s = q.double() @ k[16 * t : 16 * t + 16].double().T
        p = torch.exp2(s * 0.01).to(torch.bfloat16).double()
        acc = acc * f[32 * t : 32 * t + 32, None].double() + p @ v[16 * t : 16 * t + 16].double()
    torch.testing.assert_close(out.double(), acc, rtol=1e-5, atol=1e-5)


@pytest.mark.compile
@pytest.mark.parametrize("target", ["gfx950", "gfx942"])
def test_rescale_skips_as_one_wave_on_cdna(target):
    ck = _accumulator_kernel(target)
    src, asm = ck.stages()["triton"], ck.stages()["amdgcn"]
    assert "tl.inline_asm_elementwise" in src and "v_cmp_neq_f32" in src
    (lp,) = amdgcn.matrix_loops(asm)
    ops = lp.mnemonics()
    # each lane holds one row of the MFMA accumulator: one compare, one branch per trip, and
    # the multiplies behind it (counted apart, as a block a trip may skip)
    assert ops.count("v_cmp_neq_f32") == 1 and ops.count("s_cbranch_vccz") == 1
    muls = [m for m in ops if m == "v_mul_f32"]
    assert len(muls) == 128 * 128 // (4 * 64) and lp.conditional >= len(muls)  # one per element
    r = ck.executable.report
    assert not r.scratch_bytes and not r.vgpr_spill_count and not r.sgpr_spill_count


@pytest.mark.compile
def test_rescale_falls_back_to_multiplies_where_the_guard_fails(capfd):
    # a blocked layout gives a thread elements of several rows: the asm's factors are not in
    # one register, its guard stops the assembler, and the kernel compiles with multiplies,
    # quietly (the assembler's messages are dropped); compiled through the backend itself, so
    # no cache answers instead
    from flydsl_core.backends import get_backend

    x = fly.TensorSpec(torch.float32, (64, 64))
    f = fly.TensorSpec(torch.float32, (64,))
    fn = rescale_rows.ir(x, f, x, BM=64, BN=64)
    backend = get_backend("gfx950")
    assert "v_cmp_neq_f32" in backend.generate(fn, 1).source  # the asm was tried
    exe = backend.compile(fn, options={"num_warps": 1})
    assert "inline_asm" not in exe.source
    asm = exe.stages()["amdgcn"]
    assert "v_cmp_neq_f32" not in asm and ("v_mul_f32" in asm or "v_pk_mul_f32" in asm)
    assert "fly.rescale" not in capfd.readouterr().err


@pytest.mark.compile
@pytest.mark.parametrize("target", ["gfx1250", "sm90"])
def test_rescale_is_a_plain_multiply_elsewhere(target):
    ck = _accumulator_kernel(target)
    src = ck.stages()["triton"]
    assert "inline_asm" not in src and " * " in src


def test_the_loop_finder_reads_conditional_assembly_and_local_labels():
    # what rescale_asm's block looks like in a listing: guards that do not assemble, a branch
    # to a numeric local label
    body = [
        ".LBB0_1:",
        "\tds_read_b128 v[0:3], v4",
        "\tv_mfma_f32_32x32x16_bf16 v[8:23], v[0:3], v[0:3], v[8:23]",
        "\t;;#ASMSTART",
        "\t.ifnc v8,v8",
        '.error "guard"',
        "v_mov_b32 v9, v9",
        ".endif",
        ".ifc v8,v9",
        "v_nop_never",
        ".else",
        "v_add_f32 v1, v1, v1",
        ".endif",
        "v_cmp_neq_f32 vcc, 1.0, v30",
        "s_cbranch_vccz 2f",
        "v_mul_f32 v8, v8, v30",
        "v_mul_f32 v9, v9, v30",
        "2:",
        "\t;;#ASMEND",
        "\ts_cmp_lt_i32 s0, 8",
        "\ts_cbranch_scc1 .LBB0_1",
        "\ts_endpgm",
    ]
    got = list(amdgcn.instructions(body))
    assert ("v_mov_b32", "v9, v9") not in got and ("v_nop_never", "") not in got
    assert ("v_add_f32", "v1, v1, v1") in got
    assert ("s_cbranch_vccz", ".Llocal2_0") in got and ".Llocal2_0" in got
    (lp,) = amdgcn.loops(body)
    # ds_read, mfma, add, cmp, branch, s_cmp, s_cbranch every trip; the two multiplies apart
    assert lp.always == 7 and lp.conditional == 2


@pytest.mark.compile
@pytest.mark.parametrize("target", ["gfx950", "sm90"])
def test_reciprocal_is_one_instruction_on_the_gpu(target):
    # fly.reciprocal: the hardware reciprocal (v_rcp_f32 / rcp.approx.ftz), not a division
    spec = fly.TensorSpec(torch.float32, (256,))

    @fly.kernel
    def rcp_kernel(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
        out[fly.ds(0, B)].store(fly.reciprocal(x[fly.ds(0, B)].load()))

    ck = rcp_kernel.compile(spec, spec, B=256, target=target)
    if target == "gfx950":
        asm = ck.stages()["amdgcn"]
        assert "v_rcp_f32" in asm and "v_div_scale" not in asm and "v_div_fmas" not in asm
    else:
        ptx = ck.stages()["ptx"]
        assert "rcp.approx.ftz.f32" in ptx and "div.rn" not in ptx and "div.full" not in ptx
