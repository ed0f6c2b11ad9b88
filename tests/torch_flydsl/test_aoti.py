"""AOTInductor: ``aoti_compile_and_package`` of an exported model with FlyDSL's pass installed.

* CPU tier: the exported program, lowered by AOTInductor itself (export, its AOTAutograd,
  the post-grad passes), holds FlyDSL's ops where its GEMMs were: a recording pass after
  ours captures the graph and stops the compile before C++ code generation (minutes here).
* Opt-in CPU end to end (``FLYDSL_TEST_AOTI=1``, about 2.5 min on the 2-core dev machine):
  the ``.pt2`` is built, loaded with ``aoti_load_package`` and run; its wrapper calls the
  ``flydsl::`` ops through AOTInductor's proxy executor, which runs FlyDSL's CPU backend.
* GPU tier (``-m gpu``): the package on the GPU, FlyDSL's generated Triton kernels compiled
  into it, results equal to eager.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_flydsl
from torch_flydsl.inductor import FlyDSLPass, Settings

BF16 = torch.bfloat16


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 48), nn.Linear(48, 32)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))) + x


class _Stop(Exception):
    pass


class _Record(FlyDSLPass):
    """FlyDSL's pass, then keep the graph and stop the compile."""

    graphs: list

    def __call__(self, graph):
        super().__call__(graph)
        type(self).graphs.append([n.target for n in graph.nodes if n.op == "call_function"])
        raise _Stop

    def uuid(self):
        return super().uuid() + ":record"  # never a cache hit of a graph our pass compiled


@pytest.mark.cpu
def test_exported_and_lowered_graph_holds_flydsl_ops(tmp_path):
    torch.manual_seed(0)
    m = MLP().to(BF16)
    x = torch.randn(5, 32).to(BF16)
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(m, (x,), dynamic_shapes=({0: batch},))
    _Record.graphs = []
    rec = _Record(Settings.from_options({"device": "cpu"}))
    torch_flydsl.reset_stats()
    from .test_compile_cpu import _no_compile_caches

    with _no_compile_caches(), pytest.raises(Exception) as stop:
        torch._inductor.aoti_compile_and_package(
            ep,
            package_path=str(tmp_path / "mlp.pt2"),
            inductor_configs={"post_grad_custom_post_pass": rec},
        )
    assert isinstance(stop.value, _Stop) or "_Stop" in repr(stop.value)
    (targets,) = _Record.graphs
    assert targets.count(torch.ops.flydsl.gemm.default) == 2
    assert torch.ops.aten.addmm.default not in targets and torch.ops.aten.erf.default not in targets
    st = torch_flydsl.stats()
    assert st["compile:addmm"]["hits"] == 2 and st["compile:epilogue"]["hits"] == 2


def _package(tmp_path, device, options):
    torch.manual_seed(0)
    m = MLP().to(BF16).to(device)
    x = torch.randn(5, 32, device=device).to(BF16)
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(m, (x,), dynamic_shapes=({0: batch},))
    path = torch._inductor.aoti_compile_and_package(
        ep,
        package_path=str(tmp_path / "mlp.pt2"),
        inductor_configs={"post_grad_custom_post_pass": FlyDSLPass(Settings.from_options(options))},
    )
    return m, torch._inductor.aoti_load_package(path)


def _check(m, runner, device):
    with torch.no_grad():
        for rows in (1, 5, 300):
            x = torch.randn(rows, 32, device=device).to(BF16)
            out, ref = runner(x), m(x)
            torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.cpu
@pytest.mark.skipif(
    os.environ.get("FLYDSL_TEST_AOTI") != "1", reason="opt-in (FLYDSL_TEST_AOTI=1): ~2.5 min"
)
def test_package_runs_on_cpu(tmp_path):
    torch_flydsl.reset_stats()
    m, runner = _package(tmp_path, "cpu", {"device": "cpu"})
    _check(m, runner, "cpu")
    assert torch_flydsl.stats()["flydsl::gemm"]["hits"] == 6  # 2 GEMMs x 3 calls


@pytest.mark.gpu
def test_package_runs_on_gpu(tmp_path, monkeypatch):
    """The .pt2 holds FlyDSL's Triton kernels (compiled by AOTInductor) and runs them."""
    from torch_flydsl import eligibility

    monkeypatch.setenv("FLYDSL_TORCH_ARCHS", eligibility.resolve_arch(None) or "none")
    torch_flydsl.reset_stats()
    m, runner = _package(tmp_path, "cuda", {"gates": "open"})
    assert torch_flydsl.stats()["compile:addmm"]["hits"] == 2  # FlyDSL's kernels, not ATen's
    _check(m, runner, "cuda")
