"""flydsl-core imports light, and its public surface is what the docs promise."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu


def test_import_loads_neither_torch_nor_triton():
    code = "import sys, flydsl_core; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_flat_api_exposes_the_language():
    import flydsl_core as fly

    for name in (
        "kernel",
        "constexpr",
        "program_id",
        "range",
        "if_",
        "while_",
        "dot",
        "dot_scaled",
        "Layout",
    ):
        assert hasattr(fly, name), name
