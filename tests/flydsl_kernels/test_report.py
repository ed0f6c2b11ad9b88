"""``flydsl-kernels report``: selection, real gfx950 resources, JSON, error rows, exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import flydsl_kernels
from flydsl_core.compile.resources import ResourceReport
from flydsl_kernels import report
from flydsl_kernels.registry import Family, ReportCase

ONE_TOPK = "topk/topk_small/256x1024"  # the cheapest shipped case: one small compile and check


# -- a fake family, so error handling does not depend on the shipped kernels -------------------


class _Executable:
    def __init__(self, rep):
        self.report = rep


class _Compiled:
    def __init__(self, rep):
        self.executable = _Executable(rep)


def _fake_report() -> ResourceReport:
    return ResourceReport(
        target="gfx950",
        backend="hip",
        kernel_name="fake",
        vgpr=40,
        sgpr=20,
        scratch_bytes=0,
        lds_bytes=1024,
        occupancy=8,
        occupancy_max=8,
        instruction_count=100,
        load_widths_bits={32: 3, 128: 2},
        matrix_ops={"v_mfma_f32_16x16x32_bf16": 16, "v_mfma_f32_32x32x16_bf16": 4},
        matrix_loop_instructions=90,
        matrix_loop_mfma=10.0,
        matrix_loops=[
            {"instructions": 150, "conditional": 0, "mfma": 10.0},
            {"instructions": 90, "conditional": 12, "mfma": 10.0},
        ],
    )


def _case(kernel, *, compile_exc=None, check=0.25, check_exc=None, calls=None):
    def compile_(target):
        if compile_exc:
            raise compile_exc
        return _Compiled(_fake_report())

    def check_(device):
        if calls is not None:
            calls.append(kernel)
        if check_exc:
            raise check_exc
        return check

    return ReportCase("fake", kernel, "8x8 fp32", {"BLOCK": 8}, compile_, check_)


@pytest.fixture
def fake_families(monkeypatch):
    """Install the given cases as the only family; returns the installer."""

    def install(cases, *, break_after=None):
        def gen():
            for i, c in enumerate(cases):
                if break_after is not None and i == break_after:
                    raise KeyError("no shipped config")
                yield c

        fams = {"fake": Family("fake", gen, description="a fake family for the tests")}
        monkeypatch.setattr(flydsl_kernels, "families", lambda: fams)

    return install


def test_matrix_summary():
    assert report.matrix_summary({}) == ""
    assert report.matrix_summary({"b": 2, "a": 3}) == "a x 3, b x 2"


def test_good_case_row(fake_families):
    fake_families([_case("good")])
    (row,) = report.collect(["FAKE/good"], device="cpu")  # selection is case-insensitive
    assert row["error"] is None and row["ok"] is True and row["check_error"] == 0.25
    assert row["vgpr"] == 40 and row["lds_bytes"] == 1024 and row["occupancy"] == 8
    assert row["load_width_bits"] == 128  # the widest global load
    assert row["matrix"] == "v_mfma_f32_16x16x32_bf16 x 16, v_mfma_f32_32x32x16_bf16 x 4"
    assert row["check_device"] == "cpu" and row["ours_us"] is None  # no timing on the CPU
    assert row["loop_per_mfma"] == [9.0, 15.0]  # main loop / worst loop, per 32x32 MFMA


def test_loop_per_mfma_column(fake_families, capsys):
    fake_families([_case("good")])
    assert report.main(["fake", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "loop/MFMA" in out and "9.00 / 15.00" in out


def test_raising_cases_are_error_rows_and_exit_nonzero(fake_families, tmp_path, capsys):
    fake_families(
        [
            _case("good"),
            _case("badcompile", compile_exc=RuntimeError("LLVM fell over [gfx950]")),
            _case("badcheck", check_exc=ValueError("shape mismatch")),
            _case("inaccurate", check=3.5),
            _case("nan", check=float("nan")),
        ]
    )
    out = tmp_path / "r.json"
    assert report.main(["fake", "--device", "cpu", "--json", str(out)]) == 1
    rows = {r["kernel"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["good"]["error"] is None and rows["good"]["ok"]
    assert rows["badcompile"]["error"] == "compile: RuntimeError: LLVM fell over [gfx950]"
    assert rows["badcompile"]["check_error"] == 0.25  # the check still ran
    assert rows["badcheck"]["error"] == "check: ValueError: shape mismatch"
    assert rows["badcheck"]["vgpr"] == 40  # the compile still reported
    assert rows["inaccurate"]["error"] is None and rows["inaccurate"]["ok"] is False
    assert rows["nan"]["ok"] is False and rows["nan"]["check_error"] == "nan"
    text = capsys.readouterr().out
    assert "LLVM fell over [gfx950]" in text  # not eaten as rich markup
    assert "3.5 FAIL" in text and "5 cases, 4 failed" in text


def test_named_baseline_column(fake_families, capsys):
    named = _case("named")
    named.aten = lambda device: lambda: None
    named.baseline = lambda device: f"dequant + matmul on {device}"
    plain = _case("plain")
    plain.aten = lambda device: lambda: None
    fake_families([named, plain, _case("none")])
    rows = {r["kernel"]: r for r in report.collect(["fake"], device="cpu")}
    assert rows["named"]["baseline"] == "dequant + matmul on cpu"
    assert rows["plain"]["baseline"] == "ATen" and rows["none"]["baseline"] is None
    assert report.main(["fake", "--device", "cpu"]) == 0
    assert "dequant + matmul on cpu" in capsys.readouterr().out


def test_family_whose_cases_raise_is_an_error_row(fake_families):
    fake_families([_case("first"), _case("second")], break_after=1)
    rows = report.collect(["fake"], device="cpu")
    assert [r["kernel"] for r in rows] == ["first", "?"]
    assert rows[1]["error"].startswith("cases(): KeyError") and report.failed(rows) == [rows[1]]


def test_no_check_skips_checks(fake_families, tmp_path):
    calls = []
    fake_families([_case("a", calls=calls), _case("b", check_exc=AssertionError, calls=calls)])
    out = tmp_path / "r.json"
    assert report.main(["fake", "--no-check", "--json", str(out)]) == 0
    assert calls == []
    rows = json.loads(out.read_text())["rows"]
    assert [(r["check_error"], r["check_device"], r["vgpr"]) for r in rows] == [
        (None, None, 40)
    ] * 2


def test_unknown_selection_lists_the_families(capsys):
    assert report.main(["no-such-kernel"]) == 2
    err = capsys.readouterr().err
    assert "no case matches 'no-such-kernel'" in err
    assert err.count("\n") == 1  # one line
    for name in flydsl_kernels.FAMILIES:
        assert name in err


@pytest.mark.compile
def test_one_topk_case_compiles_for_gfx950_and_json_matches(tmp_path, capsys):
    rows = report.collect([ONE_TOPK], target="gfx950", device="cpu")
    (row,) = rows
    assert (row["family"], row["kernel"]) == ("topk", "topk_small") and row["error"] is None
    r = row["resources"]
    assert r["target"] == "gfx950" and r["backend"] == "hip"  # a real cross-compile
    assert row["vgpr"] > 0 and row["sgpr"] > 0 and row["instruction_count"] > 0
    assert 1 <= row["occupancy"] <= row["occupancy_max"] == 8
    assert row["load_width_bits"] == max(int(w) for w in r["load_widths_bits"]) >= 32
    assert row["scratch_bytes"] == 0 and row["check_error"] <= 1 and row["ok"]

    out = tmp_path / "report.json"
    assert report.main([ONE_TOPK, "--device", "cpu", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["target"] == "gfx950" and doc["device"] == "cpu" and doc["gpu"] is False
    assert doc["rows"] == json.loads(json.dumps(rows))  # the same rows as collect()
    table = capsys.readouterr().out
    assert "topk/topk_small" in table and "1 cases, 0 failed" in table


@pytest.mark.compile
@pytest.mark.parametrize(
    "select",
    [
        "gemm/gemm_kernel/4096x4096x4096 bf16",
        "attention/attn_fwd_kernel/B4 S4096x4096 H32/8 D128 causal llama",
    ],
)
def test_loop_figure_is_the_core_finders_for_gemm_and_attention(select):
    from flydsl_core.backends.triton.amdgcn import matrix_loops

    cases, _ = report.select_cases([select])
    rows = report.collect([select], target="gfx950", check=False)
    ck = cases[0].compile("gfx950")
    loops = matrix_loops(ck.stages()["amdgcn"])
    per = [lp.per_matrix_op for lp in loops]
    for row in rows:
        assert row["error"] is None
        assert row["loop_per_mfma"] == [round(min(per), 2), round(max(per), 2)]


@pytest.mark.gpu
def test_gpu_rows_have_times_and_speedup():
    (row,) = report.collect([ONE_TOPK], device="cuda", reps=10)
    assert row["error"] is None and row["ok"]
    assert row["ours_us"] > 0 and row["aten_us"] > 0 and row["speedup"] > 0


def _console_script(*args):
    """The installed ``flydsl-kernels`` run with ``args`` (skips where it is not installed)."""
    exe = Path(sys.executable).with_name("flydsl-kernels")
    if not exe.exists():
        pytest.skip(f"no {exe}: run `uv sync` to install the console script")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def test_installed_entry_point_lists_cases():
    p = _console_script("report", "--list", "topk")
    assert p.returncode == 0, p.stderr
    assert "topk_small" in p.stdout and "moe_router_kernel" in p.stdout


# -- `flydsl-kernels model FAMILY`: each family's static model, with no runpy warning --------------


@pytest.mark.parametrize("family", flydsl_kernels.FAMILIES)
def test_model_subcommand_reaches_each_familys_model(family, capsys):
    assert report.main(["model", family, "--help"]) == 0
    assert f"usage: flydsl-kernels model {family}" in capsys.readouterr().out


def test_model_subcommand_usage_errors(capsys):
    assert report.main(["model", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown family 'nope'" in err and "attention" in err
    assert report.main(["model"]) == 2  # a family is required
    assert report.main(["model", "attention", "--kind", "nope"]) == 2  # argparse's own error


@pytest.mark.compile
def test_model_subcommand_ranks_one_attention_candidate(capsys):
    argv = ["model", "attention", "--kind", "decode", "--dclass", "d64", "--limit", "1"]
    assert report.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "'BM': 16" in out[0]  # one candidate: a config and its figures


def test_model_subcommand_runs_without_the_runpy_warning():
    p = _console_script("model", "attention", "--help")
    assert p.returncode == 0, p.stderr
    assert "RuntimeWarning" not in p.stderr and "--check-tables" in p.stdout


@pytest.mark.cpu
def test_cases_behind_aten_get_their_kernel_time(monkeypatch):
    """The timing phase with stand-in timers (invented times, not measurements): a case whose
    speedup is below ``SLOW_CASE`` gets ``kernel_us`` from ``kernel_time_ms``, one ahead does
    not (the profiler pass costs a GPU run's budget)."""
    times = iter([[2.0, 1.0], [1.0, 2.0]])  # ms: ours behind ATen, then ahead of it
    monkeypatch.setattr(report, "median_times_ms", lambda thunks, reps: next(times))
    monkeypatch.setattr(report, "kernel_time_ms", lambda fn, reps: 0.5)
    slow, fast = (
        report.collect([ONE_TOPK], device="cpu", check=False, time_gpu=True, guards=False)[0]
        for _ in range(2)
    )
    assert slow["speedup"] == 0.5 and slow["kernel_us"] == 500.0
    assert fast["speedup"] == 2.0 and fast["kernel_us"] is None
