"""Every FLYDSL_* variable is declared once (flydsl_core.settings) and parsed strictly."""

from __future__ import annotations

import pathlib
import re

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
