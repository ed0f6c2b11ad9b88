"""``fly.tanh`` in the Triton lowering: one branch-free fp32 formula on every GPU target
(``rules.elementwise.tanh_helper``: an odd polynomial below ``|x| = 0.55``, ``1 - 2 / (1 +
e^(2|x|))`` above), checked against ``torch.tanh`` over the whole fp32 range by running the same
formula in Triton's interpreter (``cpu-interpret``, where a division stands for the GPU's
one-instruction reciprocal), and compiled for gfx950 with no branch and no library call
(gfx1250 has a native ``v_tanh_f32``: the library's tanh compiles to it).

Tolerance: 2 ulp of the correctly rounded result (the formula measures 1.6 ulp with exactly
rounded exp2 and reciprocal; on gfx950 each of those is within 1 ulp), exact at 0, -0, +-inf
and NaN; denormal results may flush to zero on the GPU, so below the smallest normal the
tolerance is absolute (1.2e-38).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import flydsl_core as fly

pytest.importorskip("triton")

TINY = float(np.finfo(np.float32).tiny)


@fly.kernel
def tanh_kernel(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    t = x.tile((B,), 0)
    out.tile((B,), 0).store(fly.tanh(t.load()))


@fly.kernel
def tanh_loop_kernel(x: fly.Tensor, out: fly.Tensor, N, B: fly.constexpr):
    # tanh inside a loop, as softcap uses it in the attention kernels' KV loops
    acc = fly.zeros((B,), fly.fp32)
    for i in fly.range(0, N, B):
        acc += fly.tanh(x[fly.ds(i, B)].load() * 0.02) * 50.0
    out[fly.ds(0, B)].store(acc)


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    lin = torch.linspace(-20.0, 20.0, 40001)
    small = torch.logspace(-45, 0, 3000)  # down into the denormals
    big = torch.logspace(0, 38.5, 500)
    near_cut = torch.linspace(0.5, 0.6, 1001)  # both sides of the polynomial's edge
    rnd = torch.randn(5000, generator=g) * 4
    special = torch.tensor([0.0, float("inf"), 88.7, 1e30, 3.4e38, TINY, 1e-40])
    pos = torch.cat([lin, small, big, near_cut, rnd, special])
    return torch.cat([pos, -pos]).float()


#: the interpreter evaluates both sides of the formula's select in numpy: the polynomial side
#: overflows (harmlessly) for huge |x|
QUIET = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)


def _ulps(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``|out - ref|`` in units of the fp32 spacing at ``ref`` (absolute below the smallest
    normal, where the GPU may flush to zero)."""
    spacing = torch.from_numpy(np.spacing(np.abs(ref.float().numpy()))).double()
    err = (out.double() - ref.double()).abs()
    return torch.where(ref.abs() < TINY, err / TINY, err / spacing)


@pytest.mark.cpu
@QUIET
def test_tanh_matches_torch_over_the_whole_fp32_range():
    x = _inputs()
    n = x.numel()
    out = torch.empty_like(x)
    tanh_kernel[(1,)](x, out, B=1 << (n - 1).bit_length(), target="cpu-interpret")
    exact = torch.tanh(x.double())
    # within 2 ulp of the exact value, and of torch.tanh (itself within 1 ulp) within 3
    for ref, tol in ((exact, 2.0), (torch.tanh(x), 3.0)):
        err = _ulps(out, ref)
        bad = err > tol
        assert not bad.any(), [
            (x[i].item(), out[i].item(), ref[i].item()) for i in bad.nonzero()[:5, 0]
        ]
    # exact where it must be: zeros keep their sign, the infinities give +-1
    for v in (0.0, -0.0, float("inf"), float("-inf")):
        one = torch.tensor([v])
        o = torch.empty(1)
        tanh_kernel[(1,)](one, o, B=1, target="cpu-interpret")
        assert torch.equal(o, torch.tanh(one)) and o.signbit() == torch.tanh(one).signbit()


@pytest.mark.cpu
@QUIET
def test_tanh_propagates_nan():
    x = torch.tensor([float("nan"), 1.0, -float("nan"), 0.3])
    out = torch.empty_like(x)
    tanh_kernel[(1,)](x, out, B=4, target="cpu-interpret")
    assert out.isnan().tolist() == [True, False, True, False]


@pytest.mark.cpu
@QUIET
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tanh_of_16_bit_floats_rounds_once(dtype):
    x = _inputs().clamp(-60000, 60000).to(dtype)
    out = torch.empty_like(x)
    tanh_kernel[(1,)](x, out, B=1 << (x.numel() - 1).bit_length(), target="cpu-interpret")
    want = torch.tanh(x.double()).to(dtype)
    # computed in fp32 within 2 ulp there, then rounded: at most one 16-bit ulp off
    step = torch.from_numpy(np.spacing(np.abs(want.float().numpy()).astype(np.float16))).float()
    if dtype == torch.bfloat16:
        step = step * 8  # bf16 has 3 fewer mantissa bits than fp16
    assert ((out.float() - want.float()).abs() <= step.clamp_min(1e-7)).all()


@pytest.mark.compile
@pytest.mark.parametrize("target", ["gfx950", "gfx942", "gfx1250", "sm90"])
def test_tanh_compiles_branch_free(target):
    spec = fly.TensorSpec(torch.float32, (4096,))
    ck = tanh_loop_kernel.compile(spec, spec, 4096, B=256, target=target)
    src = ck.stages()["triton"]
    if target == "gfx1250":  # a native tanh: one instruction, no branch
        assert "libdevice.tanh" in src and "v_tanh_f32" in ck.stages()["amdgcn"]
        return
    assert "_fly_tanh" in src and "libdevice.tanh" not in src
    if target.startswith("gfx"):
        asm = ck.stages()["amdgcn"]
        assert "__ocml_tanh" not in asm and "s_cbranch_execz" not in asm
        # the loop: one backward branch and no other branch inside it
        from flydsl_core.backends.triton.amdgcn import loops

        (lp,) = loops(asm)
        branches = [m for m in lp.mnemonics() if m.startswith(("s_cbranch", "s_branch"))]
        assert len(branches) == 1 and lp.conditional == 0, branches
        ops = lp.mnemonics()
        assert any(m.startswith("v_rcp_f32") for m in ops) and "v_exp_f32_e32" in ops
        assert not any(m.startswith(("v_div_", "v_frexp", "v_ldexp")) for m in ops)
    else:
        ptx = ck.stages()["ptx"]
        # the formula's exp2 and approximate reciprocal, not libdevice's tanhf
        assert "ex2.approx" in ptx and "rcp.approx.ftz.f32" in ptx and "tanh.approx" not in ptx
