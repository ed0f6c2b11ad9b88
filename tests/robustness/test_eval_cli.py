"""flydsl-eval under misuse: every bad option answered in one line on stderr, exit status 2,
before the first model is built (``flydsl_models.checks``)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flydsl_models import eval as ev
from flydsl_models import models

from .conftest import ROBUST

pytestmark = pytest.mark.cpu


@pytest.fixture(autouse=True)
def _no_model_is_built(monkeypatch):
    """Every case here must be refused before a model is built."""

    def refuse(*a, **k):
        raise AssertionError("a model was built for a bad option")

    monkeypatch.setattr(models, "build", refuse)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def _refused(capsys, argv, *needles, out=None):
    rc = ev.main([*argv, "--out", str(out)] if out is not None else argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("flydsl-eval: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)
    return err


MOE = ["--model", "qwen3-30b-a3b", "--hidden", "64", "--moe-intermediate", "32", "--head-dim", "16"]


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--layers", "0"], ["--layers 0", "at least 1"]),
        (["--layers", "-1"], ["--layers -1"]),
        (["--kv-heads", "0"], ["--kv-heads 0"]),
        (["--heads", "0"], ["--heads 0"]),
        (["--heads", "4", "--kv-heads", "3"], ["multiple of --kv-heads", "4 attention heads"]),
        (["--batch", "0"], ["--batch 0"]),
        (["--prompt-len", "0"], ["--prompt-len 0"]),
        (["--gen-len", "0"], ["--gen-len 0"]),
        (["--vocab", "0"], ["--vocab 0"]),
        (["--vocab", "1"], ["--vocab 1", "at least 2"]),
        (["--repeats", "0"], ["--repeats 0"]),
        (["--profile-steps", "-1"], ["--profile-steps -1"]),
        (["--threads", "0"], ["--threads 0"]),
        (["--tp", "0"], ["--tp 0"]),
        (["--tp-reference"], ["--tp-reference", "--tp N"]),
        (["--mx-experts", "on"], ["--mx-experts on", "no MoE experts"]),
        (["--model", "llama-3.1-8b", "--experts", "4"], ["--experts", "llama"]),
        ([*MOE, "--experts", "0"], ["--experts 0"]),
        ([*MOE, "--experts", "4", "--top-k", "6"], ["top-k 6", "4 experts"]),
        (["--prompt-len", "131070", "--gen-len", "8"], ["131078 tokens", "131072 positions"]),
        (["--tp", "2"], ["--tp 2 needs 2 processes", "torchrun"]),
        (["--hidden", "100", "--heads", "8"], ["hidden size 100", "--head-dim"]),
        (["--arms", "off,fast"], ["subset of off,eager,compile,train"]),
        (["--model", "llama-9000"], ["expected one of llama-3.1-8b"]),
        (["--dtype", "fp8"], ["--dtype", "fp8"]),
        (["--layers", "two"], ["--layers", "two"]),
        (["--train-steps", "0", "--arms", "train"], ["--train-steps 0"]),
        (["--train-lr", "0"], ["--train-lr 0"]),
        (
            ["--model", "gpt-oss-20b", "--hidden", "48", "--heads", "4", "--kv-heads", "2"],
            ["hidden size 48", "multiple of 32", "--mx-experts off"],
        ),
    ],
)
def test_bad_options(tmp_path, capsys, argv, needles):
    _refused(capsys, argv, *needles, out=tmp_path)


def test_tp_that_cannot_split_the_kv_heads(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    _refused(capsys, ["--tp", "2", "--kv-heads", "1", "--heads", "4"], "1 key/value heads",
             "--tp 2", out=tmp_path)  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "3")
    _refused(capsys, ["--tp", "3"], "8 attention heads", out=tmp_path)


def test_the_default_model_splits_over_two_processes(monkeypatch, tmp_path):
    """The documented TP command's default model: its heads and KV heads divide by 2."""
    from flydsl_models import checks

    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ev.parser().parse_args(["--tp", "2", "--tp-reference", "--out", str(tmp_path)])
    spec, mx = ev.checked(args)
    checks.check_model(args, spec, mx=mx)  # no error
    assert spec.config_dict["num_key_value_heads"] % 2 == 0


def test_device_without_a_gpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        _refused(capsys, ["--device", f"cuda:{n}"], f"cuda:{n}", out=tmp_path)
    else:
        _refused(capsys, ["--device", "cuda"], "--device cuda", "no GPU", out=tmp_path)
    _refused(capsys, ["--device", "tpu"], "expected cpu or cuda", out=tmp_path)


def test_broken_config_files_are_named(tmp_path, capsys):
    bad = tmp_path / "broken.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 64,')
    _refused(capsys, ["--model", str(bad)], str(bad), "not valid JSON", "line 1", out=tmp_path)
    (tmp_path / "list.json").write_text("[1, 2]")
    _refused(
        capsys, ["--model", str(tmp_path / "list.json")], "list.json", "JSON object", out=tmp_path
    )
    (tmp_path / "notype.json").write_text('{"hidden_size": 64}')
    _refused(capsys, ["--model", str(tmp_path / "notype.json")], "no model_type", out=tmp_path)
    (tmp_path / "alien.json").write_text('{"model_type": "no-such-model"}')
    _refused(capsys, ["--model", str(tmp_path / "alien.json")], "alien.json", out=tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{")
    _refused(capsys, ["--model", str(ckpt)], str(ckpt / "config.json"), out=tmp_path)


def test_unwritable_out_is_found_before_the_run(tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    _refused(capsys, ["--out", str(f)], "not a directory")
    _refused(capsys, ["--out", str(f / "sub")], "cannot write there")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            _refused(capsys, ["--out", str(ro)], "cannot write there")
        finally:
            ro.chmod(0o700)


@ROBUST
@given(
    name=st.sampled_from(["layers", "heads", "kv-heads", "batch", "prompt-len", "gen-len", "vocab",
                          "repeats", "tp", "hidden", "intermediate", "head-dim", "threads"]),
    value=st.integers(max_value=0),
)  # fmt: skip
def test_counts_below_one(tmp_path_factory, capsys, name, value):
    out = tmp_path_factory.mktemp("out")
    _refused(capsys, [f"--{name}", str(value)], f"--{name} {value}", out=out)
