"""The command lines under random misuse: one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flydsl_core import examples
from flydsl_core.cli import main as flydsl
from flydsl_core.targets import lookup_target
from flydsl_kernels.report import main as flydsl_kernels

from .conftest import ROBUST

pytestmark = pytest.mark.cpu

word = st.text(st.characters(codec="ascii", categories=("L", "N", "P")), min_size=1, max_size=8)
bad_example = word.filter(lambda w: w not in examples.NAMES and not w.startswith("-"))
bad_dtype = word.filter(lambda w: w not in ("fp32", "bf16", "fp16", "float32", "bfloat16",
                                            "float16") and not w.startswith("-"))  # fmt: skip
bad_target = word.filter(lambda w: lookup_target(w) is None and not w.startswith("-"))

flydsl_argv = st.one_of(
    st.tuples(st.sampled_from(["check", "ir", "inspect", "compile"]), bad_example).map(list),
    bad_dtype.map(lambda d: ["check", "vector_add", "--dtypes", d]),
    bad_dtype.map(lambda d: ["ir", "matmul", "--dtype", d]),
    bad_target.map(lambda t: ["inspect", "matmul", "--target", t]),
    bad_target.map(lambda t: ["aot", "vector_add", "--target", t, "--out", "x"]),
    st.sampled_from(["cpu", "interpret", "ref"]).map(
        lambda t: ["aot", "vector_add", "--target", t, "--out", "x"]
    ),
    word.filter(lambda w: w not in ("info", "clear") and not w.startswith("-")).map(
        lambda a: ["cache", a]
    ),
    bad_example.map(lambda c: [c]),
    bad_target.map(lambda t: ["export", "softmax", "--target", t, "--out", "x"]),
    st.sampled_from(["cpu", "ref"]).map(lambda t: ["export", "all", "--target", t, "--out", "x"]),
    word.filter(lambda w: w not in _export_names() and not w.startswith("-")).map(
        lambda n: ["export", n, "--out", "x"]
    ),
    word.filter(lambda w: not w.lstrip("-").isdigit()).map(lambda s: ["check", "--seed", s]),
)


@functools.cache
def _export_names() -> frozenset:
    """What ``flydsl export`` takes: ``all``, the groups and their kernels."""
    from flydsl_core import export

    groups = export.groups()
    return frozenset({"all", *groups, *(c.kernel for g in groups.values() for c in g.cases())})


def _one_line_usage_error(rc, err):
    assert rc == 2, err
    assert err.count("\n") == 1 and "error:" in err and "Traceback" not in err


@ROBUST
@given(argv=flydsl_argv)
def test_flydsl_bad_arguments(capsys, argv):
    rc = flydsl(argv)
    _one_line_usage_error(rc, capsys.readouterr().err)


@ROBUST
@given(
    argv=st.one_of(
        bad_target.map(lambda t: ["--target", t, "--list"]),
        word.filter(lambda w: not w.isdigit() or int(w) < 1).map(lambda r: ["--reps", r]),
        st.sampled_from(["tpu", "gpu", "rocm"]).map(lambda d: ["--device", d]),
        st.sampled_from(["/", "/nonexistent-dir/x.json"]).map(lambda p: ["--json", p]),
        st.text(st.characters(codec="ascii", categories=("L",)), min_size=12, max_size=14).map(
            lambda s: ["--list", "zz" + s]
        ),
    )
)
def test_flydsl_kernels_bad_arguments(capsys, argv):
    rc = flydsl_kernels(argv)
    _one_line_usage_error(rc, capsys.readouterr().err)


@ROBUST
@given(value=word.filter(lambda w: lookup_target(w) is None))
def test_flydsl_target_is_honoured_and_checked(monkeypatch, capsys, value):
    monkeypatch.setenv("FLYDSL_TARGET", value)
    rc = flydsl(["check", "vector_add", "--dtypes", "fp32"])
    err = capsys.readouterr().err
    _one_line_usage_error(rc, err)
    assert "FLYDSL_TARGET" in err


@ROBUST
@given(
    var=st.sampled_from(["FLYDSL_CACHE_DIR", "FLYDSL_DUMP_DIR"]),
    where=st.sampled_from(["file", "under_file", "missing", "folder"]),
    argv=st.sampled_from([["cache", "clear"], ["cache", "info"], ["targets"]]),
)
def test_folder_settings(capsys, tmp_path_factory, var, where, argv):
    """A folder variable pointing at a file is one line, exit 2, naming it; nothing touched."""
    base = tmp_path_factory.mktemp("folder_settings")
    (base / "f").write_text("x")
    path = {
        "file": base / "f",
        "under_file": base / "f" / "sub",
        "missing": base / "new" / "cache",
        "folder": base,
    }[where]
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {var: str(path)}):  # per example, restored after it
        if var == "FLYDSL_CACHE_DIR":  # (never unset the suite's isolated cache dir)
            os.environ.pop("FLYDSL_DUMP_DIR", None)
        rc = flydsl(argv)
    out = capsys.readouterr()
    if where in ("file", "under_file"):
        _one_line_usage_error(rc, out.err)
        assert var in out.err and "is a file, not a folder" in out.err
        assert (base / "f").read_text() == "x"
    else:
        assert rc == 0, out.err
        if argv == ["cache", "clear"] and var == "FLYDSL_CACHE_DIR":
            assert "removed 0 entries" in out.out
