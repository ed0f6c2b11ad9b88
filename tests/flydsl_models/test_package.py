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
    assert {"torch", "torch-flydsl", "flydsl-kernels", "transformers"} <= names


def test_imports_only_what_it_declares():
    """Every workspace package flydsl_models imports is declared (flydsl_kernels: the MX
    reference and the registry); flydsl_core is not imported (models use public APIs)."""
    import ast
    from pathlib import Path

    import flydsl_models

    imported = set()
    for f in Path(flydsl_models.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    reqs = md.requires("flydsl-models") or []
    declared = {r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for r in reqs}
    ours = {"flydsl_core", "flydsl_kernels", "torch_flydsl"}
    assert "flydsl_core" not in imported
    for mod in imported & ours:
        assert mod.replace("_", "-") in declared, mod
