"""Every FLYDSL_* variable is declared once, by the package that reads it, in the one table
mechanism of flydsl_core.settings, and parsed strictly; unknown names are warned about."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

from flydsl_core import settings
from flydsl_core.exc import SettingsError

pytestmark = pytest.mark.cpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [
    *ROOT.glob("packages/*/src/**/*.py"),
    *ROOT.glob("tools/*.py"),
    *ROOT.glob("tests/**/*.py"),
]


def test_every_variable_named_in_the_sources_is_declared():
    settings.load_all()  # the installed packages' declarations (tests/conftest.py: the tests')
    named = set()
    for p in SOURCES:
        if p.name == "test_settings.py":
            continue
        named |= set(re.findall(r"\bFLYDSL_[A-Z0-9_]*[A-Z0-9]\b", p.read_text()))
    assert named - set(settings.VARIABLES) == set()


def test_nothing_but_settings_reads_them_from_the_environment():
    reads = re.compile(
        r"(environ\.get|getenv)\(\s*[\"']FLYDSL_|environ\[\s*[\"']FLYDSL_\w+[\"']\s*\](?!\s*=[^=])"
    )
    here = pathlib.Path(settings.__file__).resolve()
    offenders = [
        str(p.relative_to(ROOT))
        for p in SOURCES
        if p.resolve() != here and "/tests/" not in str(p) and reads.search(p.read_text())
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "name, raw, want",
    [
        ("FLYDSL_DISABLE_CACHE", "yes", True),
        ("FLYDSL_DISABLE_CACHE", " Off ", False),
        ("FLYDSL_DISABLE_CACHE", "", False),  # blank is unset
        ("FLYDSL_VERIFY", None, True),  # the default
        ("FLYDSL_TORCH_DEVICE", "CPU", "cpu"),
        ("FLYDSL_TORCH_ARCHS", "gfx950, sm90", ("gfx950", "sm90")),
        ("FLYDSL_CACHE_DIR", "/x/y", pathlib.Path("/x/y")),
        ("FLYDSL_TARGET", " mi355x ", "mi355x"),
    ],
)
def test_values_parse(monkeypatch, name, raw, want):
    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    assert settings.get(name) == want


@pytest.mark.parametrize(
    "name, raw, accepted",
    [
        ("FLYDSL_TORCH", "bogus", "1/0, true/false"),
        ("FLYDSL_DISABLE_CACHE", "2", "1/0, true/false"),
        ("FLYDSL_TORCH_DEVICE", "tpu", "one of cuda, cpu"),
        ("FLYDSL_TORCH_PRECEDENCE", "mine", "one of ours, upstream"),
        ("FLYDSL_TORCH_ARCHS", "gfx950,,sm90", "comma-separated"),
    ],
)
def test_bad_values_name_the_variable_and_what_it_takes(monkeypatch, name, raw, accepted):
    monkeypatch.setenv(name, raw)
    with pytest.raises(SettingsError, match=rf"{name}='{re.escape(raw)}' .*{accepted}"):
        settings.get(name)
    with pytest.raises(SettingsError, match=name):
        settings.check_all()


def test_an_undeclared_name_is_an_error():
    with pytest.raises(SettingsError, match="not a FlyDSL setting"):
        settings.get("FLYDSL_NOPE")


def test_each_package_declares_its_own():
    every = settings.load_all()
    by = {}
    for v in every.values():
        by.setdefault(v.package, set()).add(v.name)
    assert {"FLYDSL_TARGET", "FLYDSL_CACHE_DIR", "FLYDSL_DUMP_DIR"} <= by["flydsl-core"]
    assert {n for n in every if n.startswith("FLYDSL_TORCH")} == by["torch-flydsl"]
    assert by["tests"] == {"FLYDSL_ACCEPT", "FLYDSL_TEST_AOTI"}
    # core's module names no other package's variable (core knows nothing of torch)
    core = pathlib.Path(settings.__file__).read_text()
    assert not re.search(r"FLYDSL_(TORCH|ACCEPT|TEST)", core)


def test_declare_rejects_clashes_and_bad_names():
    v = settings.Var("FLYDSL_TEST_DECLARE_ONCE", "flag", "a test variable", False)
    try:
        (got,) = settings.declare("pkg-a", v)
        assert got.package == "pkg-a" and settings.get("FLYDSL_TEST_DECLARE_ONCE") is False
        assert settings.declare("pkg-a", v) == (got,)  # the same declaration again: fine
        with pytest.raises(ValueError, match="declared by pkg-a already"):
            settings.declare("pkg-b", v)
    finally:
        settings.VARIABLES.pop("FLYDSL_TEST_DECLARE_ONCE", None)
    with pytest.raises(ValueError, match="FLYDSL_<NAME>"):
        settings.declare("pkg", settings.Var("OTHER_NAME", "flag", "x"))


def _run(code: str, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLYDSL_")}
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code], env={**base, **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_listing_loads_declarations_without_importing_their_packages():
    code = (
        "import sys\n"
        "from flydsl_core import settings\n"
        "v = settings.load_all()\n"
        "assert v['FLYDSL_TORCH_DEVICE'].package == 'torch-flydsl', v\n"
        "assert 'torch' not in sys.modules and 'torch_flydsl' not in sys.modules\n"
        "assert settings.get('FLYDSL_TORCH_DEVICE') == 'cpu'\n"
        "print('ok')\n"
    )
    # FLYDSL_TORCH=bogus would make `import torch_flydsl` raise: listing must still work
    out = _run(code, FLYDSL_TORCH_DEVICE="cpu", FLYDSL_TORCH="bogus")
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_an_unknown_name_warns_once_naming_the_closest():
    typo = "FLYDSL_DISABLE_CAHCE"
    code = (
        "from flydsl_core import settings\n"
        "settings.get('FLYDSL_VERIFY'); settings.get('FLYDSL_VERIFY')\n"
        "print(sorted(settings.unknown()))\n"
    )
    out = _run(code, **{typo: "1"})
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("UnknownSettingWarning") == 1
    assert f"{typo} is set but no FlyDSL package declares it" in out.stderr
    assert "did you mean FLYDSL_DISABLE_CACHE?" in out.stderr
    assert typo in out.stdout
    # import torch_flydsl reads a setting at import: the warning comes there
    out = _run("import torch_flydsl", **{typo: "1"})
    assert out.returncode == 0 and out.stderr.count("UnknownSettingWarning") == 1, out.stderr
    # declared names never warn
    out = _run(code, FLYDSL_TORCH_DEVICE="cpu", FLYDSL_DISABLE_CACHE="1")
    assert "UnknownSettingWarning" not in out.stderr and "[]" in out.stdout


def test_the_check_warns_through_warnings(monkeypatch):
    monkeypatch.setenv("FLYDSL_NOT_A_SETTING", "1")
    monkeypatch.setattr(settings, "_CHECKED", False)
    with pytest.warns(settings.UnknownSettingWarning, match="FLYDSL_NOT_A_SETTING"):
        settings.check_environment()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings.check_environment()  # once per process


@pytest.mark.parametrize("var", ["FLYDSL_CACHE_DIR", "FLYDSL_DUMP_DIR"])
@pytest.mark.parametrize("under", [False, True])
def test_a_folder_variable_at_a_file_is_an_error(monkeypatch, tmp_path, var, under):
    f = tmp_path / "a_file"
    f.write_text("x")
    monkeypatch.setenv(var, str(f / "sub" if under else f))
    with pytest.raises(SettingsError, match=rf"{var}=.*a_file is a file, not a folder"):
        settings.get(var)
    monkeypatch.setenv(var, str(tmp_path / "new" / "folder"))  # missing folders are fine
    assert settings.get(var) == tmp_path / "new" / "folder"
