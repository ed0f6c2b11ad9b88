"""Test tiers: `cpu` always runs, `compile` cross-compiles on the CPU, `gpu` needs a device.

Tests marked `gpu` are skipped, with the reason, where no GPU is present.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from flydsl_core import settings as flydsl_settings

# the test suite's own FLYDSL_* variables (each package declares its own; these are ours)
flydsl_settings.declare(
    "tests",
    flydsl_settings.Var("FLYDSL_ACCEPT", "flag", "1: the golden-file tests rewrite their golden "
                        "files", False),
    flydsl_settings.Var("FLYDSL_TEST_AOTI", "flag", "1: also run the AOTInductor package test on "
                        "the CPU (opt-in: minutes)", False),
)  # fmt: skip

# CI explores the same examples every run (a red CI lands nothing); locally, runs vary.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

os.environ.setdefault(
    "TRITON_DEFAULT_FP_FUSION", "1"
)  # silences a Triton 3.9 warning; same default


def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU on this machine (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        # the marker, not the keyword: keywords hold parent names too (tests/gpu/ is one)
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Tests never read or write the user's compile cache.
    if "FLYDSL_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "flydsl-cache"))


@pytest.fixture
def tool():
    """``tool(name)``: the module ``tools/<name>.py`` (the tools are scripts, not a package)."""
    tools = Path(__file__).resolve().parent.parent / "tools"

    def load(name):
        spec = importlib.util.spec_from_file_location(name, tools / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    # A GPU test hands its cached blocks back: the GPU tier runs in several xdist workers on
    # one device, and on the second H200 run a report case ran out of memory (1 GiB) while
    # other workers' allocators held 140 GB between their tests
    if item.get_closest_marker("gpu") is not None and _gpu_reason() is None:
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
