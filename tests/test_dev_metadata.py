"""tools/dev_metadata.py: the ``.dist-info`` folders that give an interpreter importing the
packages from their sources (the lent GPU machine) the entry points an install declares."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

import pytest

NAMES = {"flydsl-core", "flydsl-kernels", "torch-flydsl", "flydsl-models"}


def _eps(dist) -> set:
    return {(e.group, e.name, e.value) for e in dist.entry_points}


@pytest.mark.cpu
def test_metadata_declares_what_the_install_declares(tool, tmp_path):
    tool("dev_metadata").write(tmp_path)
    made = {d.metadata["Name"]: d for d in md.distributions(path=[str(tmp_path)])}
    assert set(made) == NAMES
    for name, dist in made.items():  # the workspace's editable install is the reference
        assert _eps(dist) == _eps(md.distribution(name)), name
        assert dist.version == md.distribution(name).version
    assert ("torch_dynamo_backends", "flydsl", "torch_flydsl.inductor:backend") in _eps(
        made["torch-flydsl"]
    )


@pytest.mark.cpu
def test_an_interpreter_without_the_install_finds_the_backend(tool, tmp_path):
    """``-S``: no site-packages, so only the folder written here can declare the backend."""
    assert tool("dev_metadata").main([str(tmp_path)]) == 0
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
        "from importlib.metadata import entry_points; "
        "print(sorted((e.name, e.value) for e in entry_points(group='torch_dynamo_backends')))"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('flydsl', 'torch_flydsl.inductor:backend')]"
