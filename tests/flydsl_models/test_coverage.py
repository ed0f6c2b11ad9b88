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
    with (
        torch.no_grad(),
        measure.profiling(model, module_context=module_context, device=x.device) as (prof, marks),
    ):
        with measure.phase("prefill"):
            model(x)
        with measure.phase("decode"):
            model(x[:, :1])
    return prof.profiler.kineto_results, marks


def test_attribution_off_and_patched():
    from torch_flydsl.transformers import patch

    torch.manual_seed(0)
    model = Block()
    x = torch.randn(1, 8, 64).bfloat16()
    events, marks = _profile(model, x)
    off = coverage.attribute(events, gpu=False, module_context=True, marks=marks)
    assert off.flydsl_us == 0 and off.share == 0
    fam = off.by_family
    assert fam["norm"]["total_us"] > 0  # pow/mean/rsqrt inside the norm module's range
    assert fam["gemm"]["total_us"] > 0 and fam["attention"]["total_us"] > 0
    assert off.total_us == pytest.approx(sum(v["total_us"] for v in fam.values()))
    assert set(off.by_phase) == {"prefill", "decode"}
    ph = off.by_phase["prefill"]
    assert ph["total_us"] == pytest.approx(sum(v["total_us"] for v in ph["by_family"].values()))
    with patch(model):
        events, marks = _profile(model, x)
        on = coverage.attribute(events, gpu=False, module_context=True, marks=marks)
    assert on.by_family["norm"]["flydsl_us"] > 0
    assert on.by_family["norm"]["flydsl_us"] == pytest.approx(on.by_family["norm"]["total_us"])
    assert on.by_family["gemm"]["flydsl_us"] == 0 and on.share > 0
    assert set(on.flydsl_ops) == {"flydsl::hf_rms_norm"}
    ops = {o["op"] for o in on.top_unrouted}
    assert "aten::linear" in ops and not any(o.startswith("flydsl::") for o in ops)
    d = on.as_dict()
    assert d["share"] == pytest.approx(on.share) and d["device_kind"] == "cpu"


def test_eager_overrides_count_by_their_hits():
    """An ATen op that torch-flydsl's eager override took counts as FlyDSL (its share of hits);
    SDPA's override is attention, the F.rms_norm override norm."""
    import torch_flydsl

    torch.manual_seed(0)
    x = torch.randn(2, 4, 16, 16, dtype=torch.bfloat16)
    w = torch.randn(16, dtype=torch.bfloat16)
    torch_flydsl.enable(ops=["sdpa", "rms_norm"], device="cpu")
    try:
        ctx = measure.profiling(torch.nn.Linear(1, 1), module_context=False, device=x.device)
        with ctx as (prof, marks), measure.phase("prefill"):
            torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
            torch.nn.functional.rms_norm(x, (16,), w, 1e-6)
    finally:
        torch_flydsl.disable(ops=["sdpa", "rms_norm"], device="cpu")
    assert marks.overrides == {
        "aten::_scaled_dot_product_flash_attention_for_cpu": 1.0,
        "aten::_fused_rms_norm": 1.0,
    }
    cov = coverage.attribute(
        prof.profiler.kineto_results, gpu=False, module_context=False, marks=marks
    )
    assert cov.by_family["attention"]["flydsl_us"] > 0 and cov.by_family["norm"]["flydsl_us"] > 0
    assert cov.by_family["gemm"]["flydsl_us"] == 0


def test_override_shares_from_stats_snapshots():
    before = {"_grouped_mm": {"calls": 2, "hits": 2}, "hf.rms_norm": {"calls": 1, "hits": 1}}
    after = {
        "_grouped_mm": {"calls": 6, "hits": 4},
        "topk": {"calls": 1, "hits": 1},
        "topk.values": {"calls": 1, "hits": 0},
        "hf.rms_norm": {"calls": 9, "hits": 9},  # a transformers route: its ops are named
        "compile:mm": {"calls": 3, "hits": 3},  # nodes of the compile pass: not ATen calls
        "flydsl::gemm": {"calls": 3, "hits": 3},
        "_scaled_mm": {"calls": 0, "hits": 0},
    }
    assert coverage.override_shares(before, after) == {"aten::_grouped_mm": 0.5, "aten::topk": 0.5}


def test_flydsl_ranges_and_kernel_names():
    """``record_function('flydsl::...')`` marks FlyDSL work (transformers' ``"flydsl"``
    attention runs as ``flydsl::hf_attention``); the same work outside such a range does not
    count; GPU kernel names come from the families' ``KERNELS``."""
    from torch.profiler import profile

    a = torch.ones(64, 64)
    with profile() as prof, measure.phase("prefill"):
        with torch.autograd.profiler.record_function("flydsl::some_launch"):
            a @ a
        a @ a
        with torch.autograd.profiler.record_function("flydsl::hf_attention"):
            (a * 2).softmax(-1)
        (a * 2).softmax(-1)  # SDPA's math in ATen ops: attention by no name, not FlyDSL
    cov = coverage.attribute(prof.profiler.kineto_results, gpu=False, module_context=False)
    assert 0 < cov.flydsl_us < cov.total_us
    assert cov.by_family["attention"]["flydsl_us"] > 0
    assert set(cov.flydsl_ops) == {"flydsl::some_launch", "flydsl::hf_attention"}
    names = coverage.flydsl_kernel_names()
    assert {"rmsnorm_fwd_row", "grouped_gemm_kernel", "moe_router_kernel", "mx_grouped_gemm_nt",
            "attn_fwd_kernel", "attn_bwd_dq_kernel"} <= names  # fmt: skip


@pytest.mark.parametrize(
    "op, kernel_family, family",
    [
        ("flydsl::gemm", "gemm", "gemm"),
        ("flydsl::gemm_cpu", "gemm", "gemm"),
        ("flydsl::swiglu", "gemm", "gemm"),
        ("flydsl::grouped_mm", "gemm", "gemm"),
        ("flydsl::mx_mm", "mx", "gemm"),
        ("flydsl::mx_grouped_mm_cpu", "mx", "gemm"),
        ("flydsl::flex_attention", "attention", "attention"),
        ("flydsl::flex_attention_backward", "attention", "attention"),
        ("flydsl::hf_attention", "attention", "attention"),
        ("flydsl::hf_attention_backward", "attention", "attention"),
        ("flydsl::hf_rms_norm", "rmsnorm", "norm"),
        ("flydsl::hf_add_rms_norm", "rmsnorm", "norm"),
        ("flydsl::hf_moe_router", "topk", "moe"),
        ("flydsl::hf_grouped_mm", "gemm", "gemm"),
        ("flydsl::hf_mx_grouped_mm", "mx", "gemm"),
    ],
)
def test_flydsl_ops_take_their_family_from_the_registry(op, kernel_family, family):
    assert coverage.registry_family(op) == kernel_family
    assert coverage.report_family(kernel_family) == family


def test_every_flydsl_op_has_a_family():
    """Every op torch_flydsl.library lists resolves to a kernel family, so a new op cannot fall
    into "other" unnoticed."""
    import re

    import torch_flydsl.library as lib

    # the first column of its docstring's table: ``op`` (or ``op``, continued below)
    ops = {f"{lib.NAMESPACE}::{o}" for o in re.findall(r"^``(\w+)``", lib.__doc__, re.M)}
    assert len(ops) >= 8, ops
    missing = sorted(op for op in ops if coverage.registry_family(op) is None)
    assert not missing, missing


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
