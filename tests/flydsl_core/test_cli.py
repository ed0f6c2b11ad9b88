"""The flydsl command line, run in-process."""

from __future__ import annotations

import json

import pytest

from flydsl_core.cli import main

pytestmark = pytest.mark.compile


def test_check_passes_and_ir_prints(capsys):
    assert main(["check", "vector_add", "softmax", "--dtypes", "fp32"]) == 0
    assert "all examples match PyTorch" in capsys.readouterr().out
    assert main(["ir", "matmul", "--locs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kernel @matmul(") and "matmul.py:" in out and "for " in out


def test_inspect_reports_mfma_for_gfx950(capsys):
    assert main(["inspect", "matmul", "--target", "gfx950", "--stage", "amdgcn"]) == 0
    out = capsys.readouterr().out
    assert "v_mfma_f32_" in out and "vgpr" in out and "occupancy" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "softmax", "--target", "sm90", "--stage", "nope"],
        ["check", "nosuch"],
        ["check", "--dtypes", "int8"],
        ["ir", "nosuch"],
        ["ir", "matmul", "--dtype", "float64"],
        ["inspect", "matmul", "--target", "gfx9000"],
        ["inspect", "matmul", "--num-warps", "3"],
        ["compile", "matmul", "--out", __file__],  # a file, not a directory
        ["aot", "vector_add", "--target", "cpu-reference", "--out", "x"],
        ["export", "softmax", "--target", "cpu-reference", "--out", "x"],
        ["export", "nosuch_kernel", "--out", "x"],
        ["export", "softmax"],
        ["cache", "bogus"],
        ["bogus"],
        [],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "Traceback" not in err


@pytest.mark.parametrize("var, value", [("FLYDSL_TORCH", "bogus"), ("FLYDSL_TARGET", "gfx9000")])
def test_bad_settings_are_one_line_and_exit_2(monkeypatch, capsys, var, value):
    monkeypatch.setenv(var, value)
    assert main(["check", "vector_add", "--dtypes", "fp32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and var in err


@pytest.mark.parametrize("cmd", [["cache", "clear"], ["cache", "info"], ["check", "vector_add"]])
@pytest.mark.parametrize("var", ["FLYDSL_CACHE_DIR", "FLYDSL_DUMP_DIR"])
def test_a_folder_setting_at_a_file_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys, cmd, var):
    f = tmp_path / "not_a_folder"
    f.write_text("x")
    monkeypatch.setenv(var, str(f))
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and var in err and "is a file, not a folder" in err
    assert f.read_text() == "x"  # nothing touched


def test_settings_lists_every_package_and_flags_unknown_names(monkeypatch, capsys):
    from flydsl_core import settings

    typo = "FLYDSL_DISABLE_" + "CAHCE"  # built here: the sources name declared variables only
    monkeypatch.setattr(settings, "_CHECKED", False)
    monkeypatch.setenv(typo, "1")
    monkeypatch.setenv("FLYDSL_TORCH_DEVICE", "tpu")
    with pytest.warns(settings.UnknownSettingWarning, match=typo):
        assert main(["settings"]) == 0
    out = capsys.readouterr().out
    for name in ("FLYDSL_TARGET", "FLYDSL_TORCH_ARCHS", "FLYDSL_TORCH_GATES"):
        assert name in out
    assert "torch-flydsl" in out and "flydsl-core" in out
    assert typo in out and "FLYDSL_DISABLE_CACHE?" in out
    assert "invalid" in out  # the bad FLYDSL_TORCH_DEVICE, shown rather than failing


def test_target_names_and_aliases_and_flydsl_target(monkeypatch, capsys):
    from flydsl_core.cli import target_name

    assert {target_name(t) for t in ("gfx950", "MI355X", "mi350x", "cdna4", " GFX950")} == {
        "gfx950"
    }
    assert target_name("interpret") == "cpu-interpret" and target_name("ref") == "cpu-reference"
    monkeypatch.setenv("FLYDSL_TARGET", "ref")  # honoured where --target is not given
    assert main(["check", "vector_add", "--dtypes", "fp32"]) == 0
    assert "on cpu-reference vs PyTorch" in capsys.readouterr().out


def test_aot_writes_a_manifest(tmp_path, capsys):
    assert main(["aot", "vector_add", "--target", "gfx942", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert [e["kernel"] for e in m["kernels"]] == ["vector_add"] and m["kernels"][0][
        "target"
    ] == "gfx942"


def test_export_writes_standalone_triton(tmp_path, capsys):
    """The core's examples export with no other package's help (the families' groups come
    from flydsl-kernels' entry point: tests/flydsl_kernels/test_export.py)."""
    assert main(["export", "softmax", "--target", "gfx950", "--out", str(tmp_path)]) == 0
    assert "wrote 2 kernels for gfx950" in capsys.readouterr().out
    m = json.loads((tmp_path / "manifest.json").read_text())
    files = [k["file"] for k in m["groups"]["examples"]["kernels"]]
    assert files == ["examples/softmax__37x1000_fp32.py", "examples/softmax__37x1000_bf16.py"]
    src = (tmp_path / files[0]).read_text()
    assert "\nimport triton\n" in src and "flydsl" not in src.split('"""')[2]
    assert (tmp_path / "README.md").exists() and not (
        tmp_path / "examples" / "tuning.json"
    ).exists()


def test_targets_and_cache(capsys):
    assert main(["targets"]) == 0
    assert "gfx950" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0


def test_compile_writes_every_stage(tmp_path, capsys):
    assert main(["compile", "matmul", "--target", "sm90", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(
        f"matmul.{e}" for e in ("ir", "py", "ttir", "ttgir", "llir", "ptx", "cubin")
    )
    ptx = (tmp_path / "matmul.ptx").read_text()
    assert "wgmma" in ptx or "mma.sync" in ptx  # the 32x32 default tiles may use mma.sync
