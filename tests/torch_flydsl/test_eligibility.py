"""One eligibility rule (``torch_flydsl.eligibility``) for every path, and op lists derived
from the specs."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import torch_flydsl
from torch_flydsl import _runtime, eligibility, gates
from torch_flydsl.ops import SPECS

pytestmark = pytest.mark.cpu

SRC = pathlib.Path(torch_flydsl.__file__).resolve().parent


@pytest.fixture
def fresh(monkeypatch):
    for v in ("FLYDSL_TARGET", "FLYDSL_TORCH_CPU_TARGET", "FLYDSL_TORCH_ARCHS", "FLYDSL_GPU_ARCH"):
        monkeypatch.delenv(v, raising=False)
    eligibility.clear_caches()
    yield monkeypatch
    eligibility.clear_caches()


def test_one_home_for_plain_types_and_targets():
    sources = {p: p.read_text() for p in SRC.rglob("*.py")}
    plain = [p for p, s in sources.items() if "frozenset({torch.Tensor, torch.nn.Parameter})" in s]
    assert plain == [SRC / "eligibility.py"]
    assert [p for p, s in sources.items() if re.search(r"^def _target\(", s, re.M)] == []
    assert [p for p, s in sources.items() if re.search(r"^def _device_reason\(", s, re.M)] == []


def test_every_path_asks_the_same_helper():
    from torch_flydsl.flex import call, run
    from torch_flydsl.transformers import _attention, _checks

    assert call.device_reason is eligibility.device_reason
    assert _attention.target is eligibility.target
    x = torch.empty(2)
    assert run.kernel_target(x) == eligibility.target(x)  # flex's launches ask the helper
    assert _checks.device_reason is _attention.device_reason is eligibility.device_reason


def test_op_lists_are_derived_from_the_specs():
    assert tuple(s.name for s in SPECS.values() if s.eager_overloads) == torch_flydsl.OPS
    assert tuple(dict.fromkeys(g for s in SPECS.values() for g in s.gate_ops)) == gates.OPS
    for s in SPECS.values():
        for o in s.overloads:
            assert o.gate is None or o.gate in gates.OPS
    # every gate op has an open CPU rule in each dtype its overloads take
    table = gates.GateTable()
    for s in SPECS.values():
        for o in s.overloads:
            for dt in o.dtypes if o.gate else ():
                assert table.rules("cpu", o.gate, dt), (o.op, dt)


def test_cpu_tensors_are_eligible_everywhere(fresh):
    x = torch.randn(2, 3)
    assert eligibility.device_reason(x) is None and eligibility.arch(x) == "cpu"
    assert eligibility.device_reason(torch.nn.Parameter(x)) is None
    fake = torch.empty(2, 3, device="meta")
    assert eligibility.device_reason(fake) == "arch"


def test_subclasses_are_not(fresh):
    class Sub(torch.Tensor):
        pass

    assert eligibility.device_reason(torch.randn(2).as_subclass(Sub)) == "subclass"


@pytest.mark.parametrize(
    "env, cpu, want",
    [
        ({}, None, "cpu-reference"),
        ({"FLYDSL_TARGET": "interpret"}, None, "cpu-interpret"),  # an alias
        ({"FLYDSL_TARGET": "gfx950"}, None, "cpu-reference"),  # a GPU target: not for CPU
        ({"FLYDSL_TARGET": "interpret"}, "cpu-reference", "cpu-reference"),  # the specific wins
        ({}, "interpreter", "cpu-interpret"),
    ],
)
def test_the_cpu_target_rule(fresh, env, cpu, want):
    for k, v in env.items():
        fresh.setenv(k, v)
    if cpu:
        fresh.setenv("FLYDSL_TORCH_CPU_TARGET", cpu)
    assert eligibility.cpu_target() == want
    assert eligibility.target(torch.empty(1)) == want
    torch_flydsl.disable()
    assert torch_flydsl.status("cpu")["target"] == want


@pytest.mark.parametrize(
    "device, env, allowed, target, arch",
    [
        ("gfx950", None, None, "gfx950", "gfx950"),
        ("gfx942", None, None, "gfx942", ""),  # not in the default allowed list
        ("gfx942", None, "mi300x,gfx950", "gfx942", "gfx942"),  # aliases are accepted
        ("gfx950", "h200", "sm90", "sm90", "sm90"),  # $FLYDSL_TARGET names the GPU target
        ("gfx950", "cpu-interpret", None, "gfx950", "gfx950"),  # a CPU target: not for GPUs
        ("gfx1100", None, "gfx950", None, ""),  # an arch FlyDSL has no target for
    ],
)
def test_the_gpu_target_rule(fresh, device, env, allowed, target, arch):
    fresh.setattr(_runtime, "resolve_arch", lambda idx: device)
    if env:
        fresh.setenv("FLYDSL_TARGET", env)
    if allowed:
        fresh.setenv("FLYDSL_TORCH_ARCHS", allowed)
    assert eligibility.gpu_target(0) == target
    assert eligibility.device_arch("cuda", 0) == arch


def test_compile_context_follows_the_rule(fresh):
    from torch_flydsl.inductor.graph_pass import CompileContext
    from torch_flydsl.inductor.settings import Settings

    fresh.setattr(_runtime, "resolve_arch", lambda idx: "gfx942")
    fresh.setenv("FLYDSL_TARGET", "gfx950")
    ctx = CompileContext(Settings.from_options({"device": "cuda"}))
    assert ctx.assumed_arch == "gfx950"  # the traced kernels' target: $FLYDSL_TARGET's
    cpu = torch.empty(1)
    assert ctx.arch(cpu) == ""  # CPU nodes only with device="cpu"
    assert CompileContext(Settings.from_options({"device": "cpu"})).arch(cpu) == "cpu"
