"""tools/gpu_run.py's dry run (``--device cpu``): the prepared GPU run's whole pipeline on the
CPU, with small shapes, writing the same files; and its summary on GPU-shaped figures.

The dry run goes in-process (``--in-process``: every part's entry point in this interpreter,
no interpreter start per part), which is what keeps it within a minute; on the GPU each part
is a subprocess with a time limit. The summary test feeds ``gpu_summary`` a report with GPU
figures (invented, labelled so in the test) to check the goal logic and the plots: a goal is
met / not met from the measured figure, never asserted about the hardware.
"""

from __future__ import annotations

import json
import tarfile

import pytest


@pytest.mark.compile
def test_dry_run_writes_every_file(tool, tmp_path, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    gpu_run = tool("gpu_run")
    out = tmp_path / "run"
    rc = gpu_run.main(["--out", str(out), "--device", "cpu", "--in-process", "--pack"])
    kept = sorted(p.name for p in out.iterdir())
    # at most 8 files come back from the device; tune.json only from a run that names the part
    assert kept == sorted(k for k in gpu_run.KEEP if k != "tune.json"), kept
    assert len(gpu_run.KEEP) <= 8
    with tarfile.open(out / "gpu-run.tar.gz") as tar:
        names = set(tar.getnames())
    for f in ("env.json", "parts.json", "junit.xml", "launch.json", "host.json", "ops.json", "gemm.json",
              "dispatch.json", "attention.json", "warm-0.json", "report.log", "pytest.log"):  # fmt: skip
        assert f in names, (f, sorted(names))
    parts = json.loads(tar_read(out / "gpu-run.tar.gz", "parts.json"))["parts"]
    assert [p["part"] for p in parts] == ["env", "warm", "report", "attention", "pytest", "launch", "host", "ops", "gemm", "dispatch", "tune", "summary"]  # fmt: skip
    assert all(p["status"] == "ok" for p in parts if p["part"] != "tune"), parts
    assert parts[-2]["status"] == "not run"  # the sweep runs only when named
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert len(report["rows"]) == len(gpu_run.DRY_SELECT)
    assert all(r["ok"] and not r["error"] for r in report["rows"]), report["rows"]
    summary = (out / "summary.md").read_text()
    assert "Dry run on the CPU" in summary and "not measured" in summary
    att = json.loads((out / "attention.json").read_text())
    assert att["cpu_figures"] and {r["mode"] for r in att["rows"]} == {"fwd", "bwd", "decode"}
    assert all(r["ok"] for r in att["rows"]), att["rows"]
    assert "## Attention vs SDPA" in summary and "| decode | B2 ctx1024" in summary
    assert (out / "plots.png").read_bytes()[:4] == b"\x89PNG"


def tar_read(path, name) -> str:
    with tarfile.open(path) as tar:
        return tar.extractfile(name).read().decode()


def _row(key, family, kernel, shape, **kw):
    base = dict(key=key, family=family, kernel=kernel, shape=shape, error=None, ok=True)
    base.update(speedup=None, hbm_pct=None, gbps=None, flops=None, ours_us=None, aten_us=None)
    return {**base, **kw}


@pytest.mark.cpu
def test_summary_goals_and_plots_from_gpu_figures(tool, tmp_path):
    """Invented GPU figures (not measurements): each goal comes out met or not met."""
    rows = [
        _row("rmsnorm/rmsnorm_fwd_row/4096x8192 bf16", "rmsnorm", "rmsnorm_fwd_row",
             "4096x8192 bf16", hbm_pct=87.0, gbps=4176.0, speedup=1.3, ours_us=32.0, aten_us=41.0),
        _row("topk/topk_small/256x4096 fp32 k=8", "topk", "topk_small", "256x4096 fp32 k=8",
             speedup=2.5, hbm_pct=20.0),
        _row("topk/topk_small/256x1024 fp32 k=2", "topk", "topk_small", "256x1024 fp32 k=2",
             speedup=1.5, hbm_pct=10.0),
        _row("gemm/gemm_kernel/16x4096x4096 bf16 NT", "gemm", "gemm_kernel",
             "16x4096x4096 bf16 NT", speedup=0.8, flops=1.0),
        _row("gemm/gemm_kernel/4096x4096x4096 bf16 NT", "gemm", "gemm_kernel",
             "4096x4096x4096 bf16 NT", speedup=0.95, flops=1.0),
        _row("gemm/gemm_kernel/128x6144x4096 bf16 NT", "gemm", "gemm_kernel",
             "128x6144x4096 bf16 NT", speedup=0.1, flops=1.0),  # medium M: not in the goal
        _row("mx/x/y", "mx", "mx_gemm_nt", "32x4096x4096", error="check canary: out-of-bounds write", ok=False),
    ]  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps({"gpu": True, "device": "cuda", "rows": rows}))
    launch = {"real_driver": True, "our_python_us": 2.5, "below_triton_jit": True,
              "us": {"flydsl cache hit": 6.0, "triton @jit": 9.0, "aten add (out=)": 4.0}}  # fmt: skip
    (tmp_path / "launch.json").write_text(json.dumps(launch))
    (tmp_path / "env.json").write_text(json.dumps({"gpu": "test GPU", "commit": "abc"}))
    summary = tool("gpu_summary")
    g = summary.goals(json.loads((tmp_path / "report.json").read_text()), launch, True)
    assert [x["met"] for x in g] == [True, False, False, True]
    assert "0.87x over 2 shapes" in g[2]["value"]  # geomean of 0.8 and 0.95, M=128 left out
    att = [  # invented: decode misses the 0.9x goal, one backward case failed its check
        {"mode": "fwd", "shape": "B4 S4096", "ok": True, "err": 1e-3, "ours_s": 1e-3,
         "sdpa_s": 1.1e-3, "speedup": 1.1, "tflops": 500.0},
        {"mode": "bwd", "shape": "B4 S4096", "ok": False, "err": 0.5, "ours_s": 1e-3,
         "sdpa_s": 1e-3, "speedup": 1.0, "tflops": 400.0},
        {"mode": "decode", "shape": "B1 ctx1024", "ok": True, "err": 1e-3, "ours_s": 2e-5,
         "sdpa_s": 1e-5, "speedup": 0.5, "tflops": 1.0, "graph_s": 1e-5, "sdpa_graph_s": 1.2e-5,
         "graph_speedup": 1.2, "graph_err": 1e-3},
        {"mode": "decode", "shape": "B8 ctx1024", "ok": True, "err": 1e-3, "ours_s": 2e-5,
         "sdpa_s": 1e-5, "speedup": 0.5, "tflops": 1.0, "graph_error": "RuntimeError: capture"},
    ]  # fmt: skip
    lines = summary.attention_lines({"cpu_figures": False, "rows": att}, True)
    assert lines[2].startswith("| fwd | 1 (0 failed) | 1.10x") and lines[2].endswith("**met** |")
    assert "| bwd | 1 (1 failed) | - |" in lines[3] and lines[3].endswith("**not met** |")
    assert lines[4].startswith("| decode | 2 (0 failed) | 0.50x") and "**not met**" in lines[4]
    assert "| B1 ctx1024 | 0.010 | 0.012 | 1.20x | 1.0e-03 |" in lines
    assert "| B8 ctx1024 | RuntimeError: capture | - | - | - |" in lines
    assert summary.attention_lines(None, True) == ["attention.json: missing"]
    text = summary.write_summary(tmp_path)
    assert "**met**" in text and "**not met**" in text
    assert "1 with an out-of-bounds write" in text and "mx/x/y" in text
    assert (tmp_path / "plots.png").stat().st_size > 1000


@pytest.mark.compile
def test_tune_part_and_its_summary(tool, tmp_path, monkeypatch):
    """``--only tune``: the attention sweep's dry run (two candidates of each kind on the
    reference backend), its JSON and its summary section."""
    monkeypatch.delenv("OUT", raising=False)
    gpu_run = tool("gpu_run")
    out = tmp_path / "run"
    rc = gpu_run.main(["--out", str(out), "--device", "cpu", "--in-process", "--only", "tune",
                       "--tune-dclass", "d128,d64"])  # fmt: skip
    assert rc == 0
    doc = json.loads((out / "tune.json").read_text())
    assert doc["cpu_figures"]
    kinds = [(r["dclass"], r["kind"]) for r in doc["rows"]]
    each = ["fwd", "fwd", "bwd_dkdv", "bwd_dkdv", "bwd_dq", "bwd_dq", "decode", "decode"]
    assert kinds == [("d128", k) for k in each] + [("d64", k) for k in each], kinds
    assert all(r["ok"] and r["s"] > 0 for r in doc["rows"]), doc["rows"]
    assert [r["shipped"] for r in doc["rows"][:2]] == [True, False]
    # every candidate's resources, cross-compiled for the table's target (sm90 in a dry run)
    for r in doc["rows"]:
        res = r["resources"]
        assert "compile_error" not in res and res["vgpr"] > 0, r
        assert res["clean"] == (res["spill_bytes"] == 0 and res["scratch_bytes"] == 0)
    summary = (out / "summary.md").read_text()
    assert "## Attention config sweep" in summary and "| bwd_dq | 2 | 2 |" in summary
    assert "| bwd_dq d64 | 2 | 2 |" in summary
    assert "| best without spills |" in summary
    assert "Dry run on the CPU" in summary


@pytest.mark.cpu
def test_summary_of_a_gpu_run_without_the_report_is_no_dry_run(tool, tmp_path):
    """``--only attention,tune`` on a GPU writes no report.json; env.json names the GPU, and
    the summary must not call the run a dry run nor its figures unmeasured."""
    (tmp_path / "env.json").write_text(json.dumps({"gpu": "test GPU", "device": "cuda"}))
    att = [{"mode": "fwd", "shape": "B4 S4096", "ok": True, "err": 1e-3, "ours_s": 1e-3,
            "sdpa_s": 0.5e-3, "speedup": 0.5, "tflops": 500.0}]  # invented, not a measurement  # fmt: skip
    (tmp_path / "attention.json").write_text(json.dumps({"cpu_figures": False, "rows": att}))
    text = tool("gpu_summary").write_summary(tmp_path)
    assert "Dry run on the CPU" not in text
    assert "| fwd | 1 (0 failed) | 0.50x" in text and "**not met**" in text


@pytest.mark.cpu
def test_merge_checks_takes_the_warm_parts_results(tool, tmp_path):
    """The report part times only; the warm shards' check results go into report.json by case
    key, a case only a shard reached is added without its (shared-GPU) times, and with no
    report.json at all the shards' rows are the report."""
    gpu_run = tool("gpu_run")

    def row(key, **kw):
        base = dict(key=key, check_device=None, check_error=None, ok=None, error=None)
        base.update(ours_us=None, aten_us=None, speedup=None, tflops=None, gbps=None)
        return {**base, "hbm_pct": None, **kw}

    warm = [
        [row("a", check_device="cuda", check_error=0.5, ok=True, ours_us=9.0, speedup=3.0)],
        [row("b", check_device="cuda", check_error=2.0, ok=False, ours_us=8.0),
         row("c", check_device="cuda", check_error=0.1, ok=True, ours_us=7.0, speedup=2.0)],
    ]  # fmt: skip
    for i, rows in enumerate(warm):
        (tmp_path / f"warm-{i}.json").write_text(json.dumps({"gpu": True, "rows": rows}))
    report = {"gpu": True, "device": "cuda", "rows": [row("a", ours_us=4.0, speedup=1.5),
                                                      row("b", ours_us=5.0, speedup=0.5)]}  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps(report))
    gpu_run.merge_checks(tmp_path, 2)
    got = {r["key"]: r for r in json.loads((tmp_path / "report.json").read_text())["rows"]}
    assert (got["a"]["ok"], got["a"]["check_error"], got["a"]["ours_us"]) == (True, 0.5, 4.0)
    assert (got["b"]["ok"], got["b"]["check_error"], got["b"]["speedup"]) == (False, 2.0, 0.5)
    assert got["c"]["ok"] is True and got["c"]["ours_us"] is None and got["c"]["speedup"] is None
    (tmp_path / "report.json").unlink()
    gpu_run.merge_checks(tmp_path, 2)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["checks_from"].startswith("warm") and len(doc["rows"]) == 3
    assert all(r["ours_us"] is None for r in doc["rows"])
