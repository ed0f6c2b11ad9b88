"""flydsl_models.coverage: profiler time attributed to FlyDSL and to op families."""

from __future__ import annotations

import pytest
import torch

from flydsl_models import coverage, measure

pytestmark = pytest.mark.cpu


class Block(torch.nn.Module):
    """A norm module, a GEMM and an attention call, for the attribution."""

    def __init__(self):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.norm = LlamaRMSNorm(64).bfloat16()
        self.proj = torch.nn.Linear(64, 64).bfloat16()

    def forward(self, x):
        h = self.proj(self.norm(x))
        q = h.view(1, 4, -1, 16)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q).reshape(x.shape)


def _profile(model, x, *, module_context=True):
    from torch.profiler import profile

    ctx = coverage.module_ranges(model) if module_context else None
    with torch.no_grad(), profile() as prof:
        if ctx:
            ctx.__enter__()
        with measure.phase("prefill"):
            model(x)
        with measure.phase("decode"):
            model(x[:, :1])
        if ctx:
            ctx.__exit__(None, None, None)
    return prof.profiler.kineto_results


def test_attribution_off_and_patched():
    from torch_flydsl.transformers import patch

    torch.manual_seed(0)
    model = Block()
    x = torch.randn(1, 8, 64).bfloat16()
    off = coverage.attribute(_profile(model, x), gpu=False, module_context=True)
    assert off.flydsl_us == 0 and off.share == 0
    fam = off.by_family
    assert fam["norm"]["total_us"] > 0  # pow/mean/rsqrt inside the norm module's range
    assert fam["gemm"]["total_us"] > 0 and fam["attention"]["total_us"] > 0
    assert off.total_us == pytest.approx(sum(v["total_us"] for v in fam.values()))
    assert set(off.by_phase) == {"prefill", "decode"}
    with patch(model):
        on = coverage.attribute(_profile(model, x), gpu=False, module_context=True)
    assert on.by_family["norm"]["flydsl_us"] > 0
    assert on.by_family["norm"]["flydsl_us"] == pytest.approx(on.by_family["norm"]["total_us"])
    assert on.by_family["gemm"]["flydsl_us"] == 0 and on.share > 0
    assert set(on.flydsl_ops) == {"flydsl::hf_rms_norm"}
    ops = {o["op"] for o in on.top_unrouted}
    assert "aten::linear" in ops and not any(o.startswith("flydsl::") for o in ops)
    d = on.as_dict()
    assert d["share"] == pytest.approx(on.share) and d["device_kind"] == "cpu"


def test_flydsl_ranges_and_kernel_names():
    """``record_function('flydsl::...')`` marks FlyDSL work too; GPU kernel names are known."""
    from torch.profiler import profile

    with profile() as prof, measure.phase("prefill"):
        with torch.autograd.profiler.record_function("flydsl::some_launch"):
            torch.ones(64, 64) @ torch.ones(64, 64)
        torch.ones(64, 64) @ torch.ones(64, 64)
    cov = coverage.attribute(prof.profiler.kineto_results, gpu=False, module_context=False)
    assert cov.flydsl_us > 0 and cov.flydsl_us < cov.total_us
    names = coverage.flydsl_kernel_names()
    assert {
        "rmsnorm_fwd_row",
        "grouped_gemm_kernel",
        "moe_router_kernel",
        "mx_grouped_gemm_nt",
    } <= names


def test_module_kinds():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    block = Qwen3MoeSparseMoeBlock(
        Qwen3MoeConfig(
            hidden_size=32, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2
        )
    )
    assert coverage.module_kind(block) == "moe"
    assert coverage.module_kind(block.experts) is None
    assert coverage.module_kind(Block().norm) == "norm"
