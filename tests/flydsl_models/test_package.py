"""The package installs, imports, and declares what it needs."""

import importlib
import importlib.metadata as md

import pytest

pytestmark = pytest.mark.cpu


def test_imports_with_version():
    mod = importlib.import_module("flydsl_models")
    assert mod.__version__ == md.version("flydsl-models")


def test_declares_its_dependencies():
    reqs = md.requires("flydsl-models") or []
    names = {r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for r in reqs}
    assert "torch" in names
