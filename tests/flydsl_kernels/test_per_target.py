"""Per-target configs: selection takes the target, unknown options never reach a compiler, and
the report's cases that spilled or failed on sm90 / gfx942 compile clean there (compile tier).

The full check is ``flydsl-kernels report --no-check --target T`` for T in gfx950, gfx942,
gfx1250 and sm90 (every case compiles, none has scratch, spills or too much LDS; docs); the
compile tier pins the cases that failed before the per-target tables (AMD options on sm90, MX
spills on sm90 and gfx942) and one per family and target, cheaply.
"""

from __future__ import annotations

import pytest
import torch

from flydsl_kernels import _target, report
from flydsl_kernels.gemm import configs as gemm_configs
from flydsl_kernels.guards import GuardedAllocations
from flydsl_kernels.mx import configs as mx_configs
from flydsl_kernels.rmsnorm import configs as rms_configs
from flydsl_kernels.topk import configs as topk_configs


@pytest.mark.cpu
def test_selection_takes_the_target():
    for t in _target.TUNED_TARGETS:
        large = gemm_configs.TABLES[t]["large"]
        assert gemm_configs.select("dense", 4096, 4096, 4096, target=t) == large
    # the CPU backends and None read the default (gfx950) table
    for t in (None, "cpu-reference", "cpu-interpret", "mi355x"):
        decode = gemm_configs.TABLES["gfx950"]["decode"]
        assert gemm_configs.select("dense", 16, 4096, 4096, target=t) == decode
    assert mx_configs.select("grouped", 256, 1536, 2048, "e4m3", "e4m3", target="sm90").BM == 128
    mx_gemm = mx_configs.select("gemm", 32, 4096, 4096, "e4m3", "e4m3", target="h200")
    assert mx_gemm.BK == 64  # an alias
    # wave32 targets: the same elements per lane (twice the warps of 32 lanes)
    g = rms_configs.select("fwd", 4096, torch.bfloat16)
    s = rms_configs.select("fwd", 4096, torch.bfloat16, target="sm90")
    assert (g.kernel, g.BLOCK) == (s.kernel, s.BLOCK) and s.num_warps == 2 * g.num_warps
    # the one adjusted entry: (bf16, 8192) on sm90 takes 16 warps (rmsnorm/configs.py EVIDENCE)
    assert rms_configs.select("fwd", 8192, torch.bfloat16, target="sm90").num_warps == 16
    topk = topk_configs.select("topk", 256, 4096, 8, torch.float32)
    assert topk_configs.select("topk", 256, 4096, 8, torch.float32, target="gfx942") == topk
    wave32 = topk_configs.select("topk", 256, 4096, 8, torch.float32, target="gfx1250")
    assert wave32.num_warps == 2 * topk.num_warps
    # grids follow the target's CUs / SMs
    assert gemm_configs.grouped_programs("sm90") == 2 * 132
    sm90_decode = gemm_configs.TABLES["sm90"]["decode"]
    assert gemm_configs.split_k(sm90_decode, 16, 4096, 4096, target="sm90") > 1


@pytest.mark.cpu
def test_options_a_target_does_not_know_never_reach_it():
    cfg = gemm_configs.TABLES["gfx950"]["large"]
    assert {"matrix_instr_nonkdim", "kpack"} <= set(cfg.options("gfx950"))
    assert {"matrix_instr_nonkdim", "kpack"} <= set(cfg.options("gfx1250"))
    assert set(cfg.options("sm90")) == {"num_warps", "num_stages"}
    assert set(cfg.options("cpu-reference")) == {"num_warps"}
    assert _target.compiler_options({"waves_per_eu": 2, "num_warps": 4}, "sm90") == {"num_warps": 4}


@pytest.mark.cpu
def test_table_target_of_tensors(monkeypatch):
    x = torch.empty(2)
    assert _target.table_target(x, None) == "gfx950"
    assert _target.table_target(x, "cpu-interpret") == "gfx950"
    assert _target.table_target(x, "h200") == "sm90"
    monkeypatch.setenv("FLYDSL_TARGET", "cpu-interpret")
    assert _target.table_target(x, None) == "gfx950"


@pytest.mark.cpu
def test_guards_catch_a_planted_out_of_bounds_write():
    """The canary mechanism itself: a write one element past an output, and one before it."""
    from flydsl_kernels.rmsnorm import rms_norm

    x, w = torch.randn(5, 40), torch.randn(40)
    with GuardedAllocations() as g:
        y, _ = rms_norm(x, (40,), w, 1e-6, target="cpu-reference")
    assert g.count == 2 and g.violations() == []  # y and rstd, both untouched outside
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (40,), w, 1e-6))
    buf = g.guards[0][2]
    buf[256 + y.numel() * 4] ^= 1  # the first byte past y
    buf[255] ^= 1  # the last byte before it
    bad = g.violations()
    assert [(v.side, v.first_byte) for v in bad] == [("before", 1), ("after", 0)]
    assert "rmsnorm.api" in str(bad[0])


#: (target, case selection, what must hold besides a clean compile)
PINNED = [
    ("sm90", "gemm_kernel/16x4096x4096", "mma.sync"),  # AMD options once failed the compile
    ("sm90", "gemm_kernel/4096x4096x4096", "wgmma"),
    ("sm90", "grouped_gemm_kernel/32768 tokens", "wgmma"),
    ("sm90", "mx_gemm_nt/32x4096x4096 mxfp8 x mxfp8", "emulated"),  # spilled 104 B before
    ("sm90", "mx_gemm_nt/1024x8192x8192", "emulated"),  # spilled 424 B before
    ("sm90", "mx_gemm_nt/32x14336x4096 mxfp8 x mxfp4", "emulated"),  # a8w4 on the decode tile
    ("sm90", "rmsnorm_fwd_row/4096x5120 bf16 +res", ""),  # 8 warps spilled 4 B here
    ("sm90", "mx_grouped_gemm_nt/4096 tokens x top-8 of 128 experts, N=2048", "emulated"),
    ("gfx942", "mx_grouped_gemm_nt/4096 tokens x top-8 of 128 experts, N=2048", "emulated"),
    ("gfx1250", "gemm_kernel/4096x14336x4096", "v_wmma"),
]


@pytest.mark.compile
@pytest.mark.parametrize("target,select,must", PINNED, ids=[f"{t}-{s}" for t, s, _ in PINNED])
def test_case_compiles_clean_on_target(target, select, must):
    (row,) = report.collect([select], target=target, device="cpu", check=False)
    assert row["error"] is None, row["error"]  # compiled; no scratch, spills or LDS overflow
    assert row["scratch_bytes"] == 0
    if must == "emulated":
        assert row["emulated"] and "no MX matrix instructions" in row["emulated"]
    else:
        assert must in row["matrix"], row["matrix"]
