"""tools/bench_host.py at its smallest size: a row per API, and what each call runs on the host
besides our kernels. The decode row is the H200 run's finding (2026-12-04: 13 torch ops and a
sync of index checks per paged decode call): its index check is one kernel of ours, so it runs
no torch op besides our kernels; no time is asserted."""

from __future__ import annotations

import json

import pytest


@pytest.mark.compile
def test_host_rows_and_the_ops_besides_our_kernels(tool, tmp_path):
    bench = tool("bench_host")
    path = tmp_path / "host.json"
    assert bench.main(["--calls", "2", "--rounds", "1", "--json", str(path)]) == 0
    rows = {r["api"]: r for r in json.loads(path.read_text())["rows"]}
    assert all(r["host_us"] > 0 for r in rows.values())
    decode = rows["flash_attn_with_kvcache"]
    # the index check and attention (and split-KV's combine); nothing else computes, nothing
    # syncs through .item()
    assert decode["launches"] in (2, 3) and decode["torch_ops"] == decode["reads_back"] == 0, decode
    for api in ("rms_norm", "topk", "gemm", "flash_attn_func"):
        assert rows[api]["launches"] >= 1 and rows[api]["torch_ops"] == 0, rows[api]
    # the backward: its four kernels and no memset of dK / dV, no zero LSE gradient
    train = rows["flash_attn_func fwd+bwd"]
    assert train["launches"] == 4 and train["torch_ops"] == 0, train
