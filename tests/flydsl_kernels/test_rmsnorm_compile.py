"""RMSNorm kernels cross-compiled for gfx950 (no GPU): widths, spills, registers, instruction counts.

Figures measured with Triton 3.9 on this repository (ResourceReport of the
gfx950 AMDGCN; instruction_count counts every instruction of the kernel
body, s_nop and s_waitcnt included):

bf16 forward row kernel, N = 8192, one row per program (``fwd_row``):

=========  ====================  ============================  ==============
num_warps  ours: VGPR / instr    hand-written Triton 3.9 [*]   loads / stores
=========  ====================  ============================  ==============
4 (ship)   58 / 235              59 / 237                      8 x dwordx4 / 4 x dwordx4 (+ rstd)
8          36 / 152              38 / 158                      4 / 2
16         21 / 114              20 / 119                      2 / 1
=========  ====================  ============================  ==============

[*] ``HANDWRITTEN`` below, compiled with the same divisibility / pointer-range
hints and a run-time row stride (with a compile-time stride it gives 241 /
160 / 118). Ours passes the row stride at run time too when it is a multiple
of 16 (``configs.row_stride_args``): with the constant 8192 LLVM turns the
disjoint ``row * 8192 + col`` into an ``or`` it cannot fold into the address
shift, which cost 4 instructions. The brief's 220 / 55 figure for
hand-written Triton could not be reproduced (237-248 at 4 warps, depending on
masks and ``1/sqrt`` vs ``rsqrt``); the pins below are our measured counts
with a small margin, and the comparison is against the hand-written kernel
compiled in the same test.
"""

from __future__ import annotations

import os

import pytest
import torch

from flydsl_kernels.rmsnorm import FAMILY, configs, model
from flydsl_kernels.rmsnorm.configs import Config
from flydsl_kernels.rmsnorm.model import compile_config

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

pytestmark = pytest.mark.compile

BF16 = torch.bfloat16
#: our measured instruction counts (see the table above); a regression of more than the margin fails
PINNED_ROW_8192 = {4: 235, 8: 152, 16: 114}
MARGIN = 3


def report(cfg, n, dtype=BF16, **kw):
    return compile_config(cfg, n, dtype, **kw).executable.report


@triton.jit
def HANDWRITTEN(X, W, Y, R, stride, N: tl.constexpr, eps, BLOCK: tl.constexpr):
    """The plain Triton 3.9 RMSNorm row kernel a careful author writes (no masks: N == BLOCK)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * stride + cols).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(R + row, rstd)
    w = tl.load(W + cols).to(tl.float32)
    tl.store(Y + row * stride + cols, (x * rstd * w).to(tl.bfloat16))


def handwritten_report(num_warps):
    """``HANDWRITTEN`` at N = 8192 for gfx950, with the hints our compiles get."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flydsl_core.backends.triton.amdgcn import parse_amdgcn

    sig = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "R": "*fp32", "stride": "i32"}
    sig.update(N="constexpr", eps="fp32", BLOCK="constexpr")
    ptr = [["tt.divisibility", 16], ["tt.pointer_range", 32]]
    attrs = {(i,): ptr for i in range(4)}
    attrs[(4,)] = [["tt.divisibility", 16]]
    src = ASTSource(
        fn=HANDWRITTEN, signature=sig, constexprs={"N": 8192, "BLOCK": 8192}, attrs=attrs
    )
    ck = triton.compile(
        src, target=GPUTarget("hip", "gfx950", 64), options={"num_warps": num_warps}
    )
    return parse_amdgcn(
        ck.asm["amdgcn"], "gfx950", num_warps=num_warps, shared_bytes=ck.metadata.shared
    )


def test_row_kernel_8192_bf16_vs_handwritten_triton():
    shipped = configs.select("fwd", 8192, BF16)
    assert (shipped.kernel, shipped.BLOCK, shipped.num_warps) == ("fwd_row", 8192, 4)
    for nw, pinned in PINNED_ROW_8192.items():
        r = report(Config("fwd_row", 8192, 1, nw), 8192)
        hand = handwritten_report(nw)
        per_lane = 8192 // (64 * nw) // 8  # 128-bit accesses per lane for one row of bf16
        assert r.global_loads == {"buffer_load_dwordx4": 2 * per_lane}, r.global_loads  # x and w
        assert r.store_widths_bits == {128: per_lane, 32: 1}, r.store_widths_bits  # y and rstd
        assert r.scratch_bytes == 0 and r.vgpr <= 64 and r.occupancy == 8
        assert r.instruction_count <= pinned + MARGIN, (nw, r.instruction_count)
        # no worse than the hand-written kernel: fewer instructions at every width, and no
        # more VGPRs at the shipped one (one more at 16 warps, where both need about 20)
        assert r.instruction_count <= hand.instruction_count, (
            nw,
            r.instruction_count,
            hand.instruction_count,
        )
        assert r.vgpr <= hand.vgpr + (0 if nw == shipped.num_warps else 1), (nw, r.vgpr, hand.vgpr)


# bf16 rows with N % 8 == 0 (some not % 16): every row access is 128-bit.
WIDE = [
    ("fwd", 1000, {}),
    ("fwd", 4104, {}),
    ("fwd", 4104, {"residual": True, "mode": 1}),
    ("fwd", 7176, {"residual": True, "mode": 2}),
    ("fwd", 40008, {}),
    ("fwd", 40008, {"residual": True}),
    ("bwd", 1000, {}),
    ("bwd", 4104, {}),
    ("bwd", 40008, {}),
]


@pytest.mark.parametrize(
    "which,n,kw",
    WIDE,
    ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(map(str, v.values())),
)
def test_bf16_rows_with_n_multiple_of_8_use_128_bit_accesses(which, n, kw):
    cfgs = (configs.select("fwd", n, BF16),) if which == "fwd" else configs.select("bwd", n, BF16)
    for cfg in cfgs:
        r = report(cfg, n, **kw)
        loads, stores = dict(r.load_widths_bits), dict(r.store_widths_bits)
        # the only narrower accesses allowed are the fp32 per-row scalars (rstd, coef): 32-bit
        assert set(loads) <= {128, 32} and loads.get(128), (cfg, loads)
        assert loads.get(32, 0) <= 2, (cfg, loads)
        if cfg.kernel != "bwd_rowdot":  # the dot kernel stores only its per-row scalar
            assert set(stores) <= {128, 32} and stores.get(128), (cfg, stores)
        assert stores.get(32, 0) <= 1, (cfg, stores)


def _shipped():
    seen = {}
    gfx950 = configs.TABLES["gfx950"]
    tables = [
        (gfx950["fwd"], None),
        (gfx950["bwd"], None),
        (gfx950["fwd_looped"], 131072),
        (gfx950["bwd_rowdot"], 131072),
        (gfx950["bwd_cols"], 131072),
        (gfx950["dw_reduce"], 8192),
    ]
    for table, n in tables:
        for key, cfg in table.items():
            nbytes = key[0] if isinstance(key, tuple) else key
            seen[(cfg, nbytes)] = n or cfg.BLOCK
    return [(cfg, nb, n) for (cfg, nb), n in seen.items()]


SHIPPED = _shipped()


def test_shipped_tables_cover_the_selection_rule():
    for dtype in (torch.float32, BF16, torch.float16):
        for n in (1, 7, 100, 1000, 1025, 4104, 8192, 20011, 32769, 65537, 262144):
            assert configs.select("fwd", n, dtype).kernel.startswith("fwd")
            assert configs.select("bwd", n, dtype)[0].kernel.startswith("bwd")
        assert configs.select("dw_reduce", 1, dtype).kernel == "dw_reduce"


@pytest.mark.parametrize(
    "cfg,nbytes,n",
    SHIPPED,
    ids=lambda v: (
        f"{v.kernel}-B{v.BLOCK}-R{v.R}-w{v.num_warps}" if isinstance(v, Config) else str(v)
    ),
)
def test_shipped_config_compiles_without_spills(cfg, nbytes, n):
    dtype = BF16 if nbytes == 2 else torch.float32
    r = report(cfg, n, dtype)
    assert r.scratch_bytes == 0 and not r.vgpr_spill_count and not r.sgpr_spill_count, cfg
    assert r.vgpr is not None and r.sgpr is not None and r.occupancy is not None
    # no regression against the figures the static model saw when it chose this config
    noted = cfg.notes
    if noted:
        assert r.occupancy >= noted["occ"], (cfg, r.occupancy, noted)
        assert r.instruction_count <= noted["instr"] * 1.05 + 3, (cfg, r.instruction_count, noted)


@pytest.mark.parametrize(
    "kernel,n,dtype",
    [("fwd_row", 8192, BF16), ("fwd_row", 16384, torch.float32), ("fwd_looped", 131072, BF16)],
)
def test_static_model_picks_the_shipped_default(kernel, n, dtype):
    shipped = configs.select("fwd", n, dtype)
    assert shipped.kernel == kernel
    assert model.best(kernel, n, dtype, jobs=1) == shipped


def test_family_cases_compile_for_gfx950():
    for case in FAMILY.cases():
        ck = case.compile("gfx950")
        r = ck.executable.report
        assert r.scratch_bytes == 0 and r.vgpr is not None, case.shape
        assert 128 in r.load_widths_bits, (case.kernel, case.shape, r.load_widths_bits)
