"""The package installs, imports, and declares what it needs."""

import importlib
import importlib.metadata as md

import pytest

pytestmark = pytest.mark.cpu


def test_imports_with_version():
    mod = importlib.import_module("flydsl_kernels")
    assert mod.__version__ == md.version("flydsl-kernels")


def test_declares_its_dependencies():
    reqs = md.requires("flydsl-kernels") or []
    names = {r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for r in reqs}
    assert "torch" in names
