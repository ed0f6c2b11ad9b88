"""The GPU tier, runnable on the CPU: every test here takes ``device`` and runs twice.

* ``device="cpu"`` (tiers ``cpu`` / ``compile``, what CI runs): small shapes on the
  reference backend, so every line of a GPU test runs before a GPU is ever lent;
* ``device="cuda"`` (marker ``gpu``; skipped with the reason where no GPU is present):
  the same code at GPU shapes on the device's own target and tables.

``call(fn, *args, **kw)`` (fixture) moves tensor arguments to the device, passes
``target="cpu-reference"`` on the CPU (the GPU resolves its own), runs ``fn`` with guard
buffers after every tensor the kernel library allocates (``flydsl_kernels.guards``) and fails
the test on an out-of-bounds write, and brings tensor results back to the CPU. With
``guard_inputs=True`` the tensor arguments are guarded too (a write past a KV cache the call
appends to fails the test; a read past an input reads the guard's bytes) and the call returns
``(result, args, kwargs)``, the arguments as the call left them, on the CPU.
"""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def pytest_generate_tests(metafunc):
    own = any(
        "device" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")
    )  # a test that names its own devices (a GPU-only one) keeps them
    if "device" in metafunc.fixturenames and not own:
        metafunc.parametrize("device", DEVICES)


def _tree(v, fn):
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, (tuple, list)):
        return type(v)(_tree(x, fn) for x in v)
    if isinstance(v, dict):
        return {k: _tree(x, fn) for k, x in v.items()}
    return v


@pytest.fixture
def call(device):
    from flydsl_kernels.guards import GuardedAllocations

    def run(fn, *args, guard_inputs=False, **kw):
        args, kw = _tree(args, lambda t: t.to(device)), _tree(kw, lambda t: t.to(device))
        kw.setdefault("target", "cpu-reference" if device == "cpu" else None)
        with GuardedAllocations() as g:
            if guard_inputs:
                args, kw = _tree(args, g.guard), _tree(kw, g.guard)
            out = fn(*args, **kw)
        bad = g.violations()
        assert not bad, "; ".join(map(str, bad))
        cpu = lambda v: _tree(v, lambda t: t.detach().cpu())  # noqa: E731
        return (cpu(out), cpu(args), cpu(kw)) if guard_inputs else _tree(out, lambda t: t.cpu())

    return run


@pytest.fixture
def big(device):
    """Scale a size for the device: ``big(cpu_size, gpu_size)``."""
    return lambda cpu, gpu: cpu if device == "cpu" else gpu
