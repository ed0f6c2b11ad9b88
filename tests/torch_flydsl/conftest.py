"""Fixtures of the torch-flydsl tests: the CPU test backend, switched on per test."""

import pytest
import torch

import torch_flydsl


@pytest.fixture
def cpu_backend(monkeypatch, tmp_path):
    """torch_flydsl enabled on the CPU key (reference backend), stats reset; off afterwards."""
    # an empty local table: the shipped rules only, whatever the user's cache holds
    from torch_flydsl import gates

    gates.write_table(tmp_path / "no_local_rules.json", [])
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(tmp_path / "no_local_rules.json"))
    monkeypatch.delenv("FLYDSL_TORCH_PRECEDENCE", raising=False)
    torch_flydsl.disable()
    torch_flydsl.enable(device="cpu")
    torch_flydsl.enable(ops=["rms_norm"], device="cpu")  # opt-in on the CPU key
    torch_flydsl.reset_stats()
    torch.manual_seed(0)
    yield torch_flydsl
    torch_flydsl.disable()
    torch_flydsl.reset_stats()


@pytest.fixture
def deterministic():
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(prev)
