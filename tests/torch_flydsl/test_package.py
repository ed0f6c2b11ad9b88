"""The package installs, imports, and declares what it needs."""

import importlib
import importlib.metadata as md

import pytest

pytestmark = pytest.mark.cpu


def test_imports_with_version():
    mod = importlib.import_module("torch_flydsl")
    assert mod.__version__ == md.version("torch-flydsl")


def test_declares_its_dependencies():
    reqs = md.requires("torch-flydsl") or []
    names = {r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for r in reqs}
    assert "torch" in names


def test_every_custom_op_is_in_one_namespace_and_one_home():
    """torch_flydsl's custom ops are ``flydsl::`` ops, defined under ``torch_flydsl.library``
    (flex_attention's two next to their rewrite); nothing is left in another namespace."""
    import pathlib
    import re

    import torch

    import torch_flydsl.inductor
    import torch_flydsl.library
    import torch_flydsl.transformers

    root = pathlib.Path(torch_flydsl.library.__file__).resolve().parents[1]
    where = {}
    for p in root.rglob("*.py"):
        if p.name == "custom_ops.py":  # the public factory: its examples are users' namespaces
            continue
        for ns, name in re.findall(
            r"(?:custom_op|triton_op)\(\s*f?\"(\{?\w+\}?)::(\w+)", p.read_text()
        ):
            where[name] = (ns, p.relative_to(root).as_posix())
    assert where, "no custom op definitions found"
    for name, (ns, path) in where.items():
        assert ns in ("flydsl", "{NAMESPACE}"), (name, ns)
        assert path.startswith("library/") or path == "flex/_compile.py", (name, path)
    for name in ("gemm", "grouped_mm", "hf_rms_norm", "hf_grouped_mm", "flex_attention"):
        assert hasattr(torch.ops.flydsl, name)
    assert torch_flydsl.library.NAMESPACE == "flydsl"
