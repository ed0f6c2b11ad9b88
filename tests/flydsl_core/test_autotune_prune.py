"""Static pruning and tuning against real gfx950 compiles (no GPU: pruning only)."""

from __future__ import annotations

import pytest
import torch

from flydsl_core.autotune import ConfigSpace, prune, tune
from flydsl_core.examples import matmul

pytest.importorskip("triton")
pytestmark = pytest.mark.compile


def _args():
    a, b = matmul.make_inputs((256, 256, 256), torch.bfloat16)
    return (a, b, torch.empty(256, 256, dtype=torch.bfloat16))


def test_prune_rejects_spilling_configs_and_reports_survivors():
    # waves_per_eu=4 squeezes a 128x256 tile (238 VGPRs unconstrained) into 128: it spills.
    # Two candidates compile in two processes (the example kernel is importable).
    space = ConfigSpace(BM=[128], BN=[256], BK=[64], num_warps=[4], waves_per_eu=[0, 4])
    res = prune(matmul.KERNEL, _args(), space, "gfx950", jobs=2)
    by = {c.config["waves_per_eu"]: c for c in res.candidates}
    assert by[0].rejected is None and by[0].report["scratch_bytes"] == 0
    assert by[4].rejected is not None and "spills" in by[4].rejected
    assert res.summary() == "1 of 2 configs survive static pruning on gfx950"


def test_prune_enforces_an_occupancy_floor():
    space = ConfigSpace(BM=[64, 128], BN=[128], BK=[64], num_warps=[4])
    res = prune(matmul.KERNEL, _args(), space, "gfx950", occupancy_floor=8, jobs=1)
    occ = {c.config["BM"]: c.report["occupancy"] for c in res.candidates}
    for c in res.candidates:
        assert (c.rejected is None) == (occ[c.config["BM"]] >= 8)


def test_tune_without_a_gpu_says_it_only_pruned():
    space = ConfigSpace(BM=[32, 64], BN=[64], BK=[32], num_warps=[4])
    r = tune(matmul.KERNEL, _args(), space, "gfx950", jobs=1)
    assert r.method == "static" and not r.timings_ms
    assert "nothing was timed" in r.message
    assert r.best in {c.config for c in r.pruned.survivors}
