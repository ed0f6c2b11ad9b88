"""Tensor parallel on the CPU: 2 processes on gloo through transformers' tp_plan="auto", FlyDSL on.

``torchrun --nproc-per-node 2 -m flydsl_models.eval --tp 2 --tp-reference`` (the
READMEs' command) shards the default model (llama-tiny: its 2 KV heads split over the
2 ranks) and a tiny Qwen3-MoE (attention projections and expert weights split), runs
the off and eager arms (FlyDSL attention included), and rank 0 runs the same
checkpoint unsharded: the sharded logits must equal the single-process ones within
the report's tolerance, in both arms. About a minute of CPU time per model: two
processes, each importing torch and transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu

SIZES = {
    "default": ["--hidden", "128", "--intermediate", "224"],  # llama-tiny: 8 / 2 heads
    "qwen3_moe": [
        "--model",
        "qwen3-30b-a3b",
        "--hidden",
        "64",
        "--intermediate",
        "128",
        "--moe-intermediate",
        "32",
        "--experts",
        "4",
        "--top-k",
        "2",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "16",
    ],
}


@pytest.mark.timeout(900)
# one model: its dense attention projections and its experts both shard
@pytest.mark.parametrize("model", ["default", "qwen3_moe"])
def test_tp2_on_gloo_matches_one_process(tmp_path, model):
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "flydsl_models.eval", "--tp", "2", "--tp-reference", *SIZES[model],
        "--layers", "2", "--vocab", "256", "--prompt-len", "8", "--gen-len", "3", "--repeats", "1",
        "--profile-steps", "1", "--arms", "off,eager", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=850)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    assert r["tp"]["size"] == 2 and r["tp"]["backend"] == "gloo"
    ref = r["tp"]["reference"]
    assert set(ref) == {"off", "eager"}
    for arm, c in ref.items():
        assert c["ok"], (arm, c)
        assert c["logits_max_rel_error"] <= c["tolerance_rel"] and c["top1_agreement"] >= 0.99
    eager = r["arms"]["eager"]
    assert eager["correctness"]["ok"]
    assert eager["stats"]["hf.rms_norm"]["hits"] > 0 and eager["coverage"]["share"] > 0
    assert eager["stats"]["hf.attention"]["hits"] > 0  # each rank's heads on FlyDSL attention
    if model == "qwen3_moe":
        assert eager["stats"]["hf.experts"]["hits"] > 0  # on each rank's shard of the experts
    assert "Tensor parallel vs single process" in (out / "report.md").read_text()
