"""torch_flydsl.transformers: each route against the transformers module it replaces, patch / undo.

Modules come from transformers 5.x itself (tiny configs, seeded random
weights) and run on the CPU test backend (FlyDSL's reference backend).
References are the modules' own forwards. Tolerances: RMSNorm routes keep
transformers' cast order, so 16-bit outputs are equal or one ulp apart where
the two fp32 sums of squares differ in the last bit (at most 1% of elements);
fp32 1e-5. Router: the same experts, weights to 1e-6 (fp32) / one bf16 ulp.
Grouped GEMM experts: bf16 1e-2 relative to the output's scale (fp32
accumulation in another order, the bias added before the one rounding). MX
experts: against a PyTorch emulation of a8w4 (activations through the
MX reference quantizer, MXFP4 weights), 1e-2 relative.
"""

from __future__ import annotations

import zlib

import pytest
import torch

import torch_flydsl
from torch_flydsl.transformers import Patch, _forms, patch

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.cpu

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    GptOssConfig,
    LlamaConfig,
    Qwen3MoeConfig,
)
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import (  # noqa: E402
    GptOssExperts,
    GptOssRMSNorm,
    GptOssTopKRouter,
)
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import (  # noqa: E402
    Qwen3MoeExperts,
    Qwen3MoeTopKRouter,
)


@pytest.fixture(autouse=True)
def _fresh_stats():
    torch_flydsl.reset_stats()
    with torch.no_grad():  # inference: the routes are forward-only (see test_autograd_falls_back)
        yield
    torch_flydsl.reset_stats()


def _ulps(a, b):
    ia = a.contiguous().view(torch.int16).to(torch.int32)
    ib = b.contiguous().view(torch.int16).to(torch.int32)
    return (ia - ib).abs()


def _same_numerics(y, ref):
    assert y.dtype == ref.dtype and y.shape == ref.shape
    if y.dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        return
    d = _ulps(y, ref)
    assert int(d.max()) <= 1
    assert int((d > 0).sum()) <= max(1, d.numel() // 100)


def llama_cfg(**kw):
    base = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    return LlamaConfig(**{**base, **kw})


def qwen_moe_cfg(**kw):
    base = dict(
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=6,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
    )
    return Qwen3MoeConfig(**{**base, **kw})


def gpt_oss_cfg(**kw):
    base = dict(
        hidden_size=64,
        intermediate_size=64,
        num_local_experts=6,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
    )
    return GptOssConfig(**{**base, **kw})


def tiny(cfg, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


# -- forms ----------------------------------------------------------------------------------------


def test_forms_recognize_the_modules_by_their_bodies():
    assert _forms.norm_mode(LlamaRMSNorm(8)) == "llama"
    assert _forms.norm_mode(GptOssRMSNorm(8)) == "aten"
    assert _forms.norm_mode(GemmaRMSNorm(8)) == "gemma"
    assert _forms.norm_mode(torch.nn.RMSNorm(8)) is None  # F.rms_norm: the ATen overrides' job

    class Renamed(LlamaRMSNorm):  # a name says nothing; the body does
        pass

    assert _forms.norm_mode(Renamed(8)) == "llama"

    class Different(LlamaRMSNorm):
        def forward(self, hidden_states):
            return self.weight * hidden_states  # not an RMSNorm body: left alone

    assert _forms.norm_mode(Different(8)) is None
    assert _forms.router_form(Qwen3MoeTopKRouter(qwen_moe_cfg())) == ("softmax", None, False)
    assert _forms.router_form(GptOssTopKRouter(gpt_oss_cfg())) == ("topk_softmax", False, True)
    m = tiny(llama_cfg())
    assert _forms.layer_form(m.model.layers[0]) == "tensor"
    assert _forms.layer_form(tiny(gpt_oss_cfg()).model.layers[0]) == "tuple"


# -- RMSNorm --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LlamaRMSNorm, GptOssRMSNorm, GemmaRMSNorm])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1, 48), (2, 5, 72), (3, 1000)], ids=str)
def test_norm_route_matches_the_module(cls, dtype, shape):
    g = torch.Generator().manual_seed(zlib.crc32(repr((cls.__name__, dtype, shape)).encode()))
    n = shape[-1]
    mod = cls(n, eps=1e-5).to(dtype)
    with torch.no_grad():
        mod.weight.copy_(torch.randn(n, generator=g).to(dtype))
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    ref = mod(x)
    with patch(mod) as p:
        assert [r.route for r in p.replaced] == ["rms_norm"]
        y = mod(x)
    _same_numerics(y, ref)
    st = torch_flydsl.stats()["hf.rms_norm"]
    assert st["hits"] == 1 and st["calls"] == 1
    assert torch.equal(mod(x), ref)  # undone


def test_norm_route_keeps_fp32_weights_and_falls_back_where_it_must():
    mod = LlamaRMSNorm(40, eps=1e-6)  # fp32 weight, bf16 input: weight * h.to(bf16) promotes
    x = torch.randn(3, 40).bfloat16()
    ref = mod(x)
    p = patch(mod)
    y = mod(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    x64 = torch.randn(2, 40, dtype=torch.float64)  # no fp64 kernel: the module's own forward
    assert torch.equal(mod(x64), type(mod).forward(mod, x64))
    xe = torch.randn(0, 40).bfloat16()
    assert mod(xe).shape == (0, 40)
    p.undo()
    st = torch_flydsl.stats()["hf.rms_norm"]
    assert st["hits"] == 1 and st["fallbacks"] == {"dtype": 1, "empty": 1}


def test_fused_residual_add_in_the_decoder_layer():
    m = tiny(llama_cfg(), torch.float32)
    layer = m.model.layers[0]
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 7, 64, generator=g)
    pos = torch.arange(7)[None]
    emb = m.model.rotary_emb(h, pos)
    ref = layer(h, position_embeddings=emb, position_ids=pos)
    with patch(m) as p:
        assert p.counts()["add_rms_norm"] == 2
        out = layer(h, position_embeddings=emb, position_ids=pos)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch_flydsl.stats()["hf.add_rms_norm"]["hits"] == 1


# -- router and experts -----------------------------------------------------------------------------


@pytest.mark.parametrize("norm_topk", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen3_router_route(norm_topk, dtype):
    r = Qwen3MoeTopKRouter(
        qwen_moe_cfg(num_experts=12, num_experts_per_tok=3, norm_topk_prob=norm_topk)
    )
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        r.weight.copy_(torch.randn(12, 64, generator=g))
    r = r.to(dtype)
    x = torch.randn(2, 9, 64, generator=g).to(dtype)
    lr, wr, ir = r(x)
    with patch(r):
        lo, wo, io = r(x)
    assert torch.equal(lo, lr) and torch.equal(io, ir) and wo.dtype == wr.dtype
    tol = 1e-6 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(wo, wr, rtol=tol, atol=tol)
    assert torch_flydsl.stats()["hf.moe_router"]["hits"] == 1


def test_gpt_oss_router_route():
    r = GptOssTopKRouter(gpt_oss_cfg(num_local_experts=10, num_experts_per_tok=4))
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        r.weight.copy_(torch.randn(10, 64, generator=g))
        r.bias.copy_(torch.randn(10, generator=g))
    x = torch.randn(13, 64, generator=g)
    lr, wr, ir = r(x)
    with patch(r):
        lo, wo, io = r(x)
    assert torch.equal(lo, lr) and torch.equal(io, ir)
    torch.testing.assert_close(wo, wr, rtol=1e-6, atol=1e-6)


def _experts_inputs(mod, tokens, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    for p_ in mod.parameters():
        with torch.no_grad():
            p_.copy_((torch.randn(p_.shape, generator=g) * 0.1).to(p_.dtype))
    x = torch.randn(tokens, mod.gate_up_proj.shape[1 if mod.is_transposed else 2], generator=g)
    scores = torch.randn(tokens, mod.num_experts, generator=g)
    w, idx = torch.softmax(scores, -1).topk(top_k, -1)
    return x, idx, w


@pytest.mark.parametrize("cls,cfg", [(Qwen3MoeExperts, qwen_moe_cfg), (GptOssExperts, gpt_oss_cfg)])
@pytest.mark.parametrize("tokens", [1, 11])
def test_experts_route_grouped_mm(cls, cfg, tokens):
    c = cfg()
    c._experts_implementation = "eager"
    mod = cls(c).to(torch.bfloat16)
    x, idx, w = _experts_inputs(mod, tokens, 2, tokens)
    x, w = x.bfloat16(), w.bfloat16()
    ref = mod(x, idx, w).float()
    with patch(mod, mx_experts=False) as p:
        assert p.counts()["experts"] == 1
        assert c._experts_implementation == "flydsl"
        out = mod(x, idx, w).float()
    assert c._experts_implementation == "eager"  # restored
    scale = float(ref.abs().max())
    assert float((out - ref).abs().max()) <= 1e-2 * scale
    st = torch_flydsl.stats()["hf.experts"]
    assert st["hits"] == 2 and not st["fallbacks"]  # up and down projections


def _a8w4_reference(mod, x, idx, w):
    """GptOssExperts with activations and weights rounded through the MX reference (PyTorch)."""
    from flydsl_kernels.mx import reference as mxr

    def q(t, elem):
        qq, s = mxr.to_mx(t.float(), elem)
        return mxr.from_mx(qq, s, elem, out_dtype=torch.float32)

    fp8, fp4 = torch.float8_e4m3fn, torch.float4_e2m1fn_x2
    out = torch.zeros(x.shape[0], x.shape[1])
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            wu = q(mod.gate_up_proj[e].t().contiguous(), fp4)  # (2I, H): NT, blocks along H
            h = (q(x[t : t + 1], fp8) @ wu.t() + mod.gate_up_proj_bias[e].float()).to(x.dtype)
            h = mod._apply_gate(h)
            wd = q(mod.down_proj[e].t().contiguous(), fp4)
            o = (q(h, fp8) @ wd.t() + mod.down_proj_bias[e].float()).to(x.dtype)
            out[t] += (o * w[t, j]).float()[0]
    return out


def test_experts_route_mx_a8w4():
    c = gpt_oss_cfg()
    mod = GptOssExperts(c).to(torch.bfloat16)
    x, idx, w = _experts_inputs(mod, 5, 2, 7)
    x, w = x.bfloat16(), w.bfloat16()
    with patch(mod, mx_experts=True) as p:
        assert p.counts()["mx_experts"] == 1
        assert "mx_grouped_mm" in p.replaced[0].detail
        out = mod(x, idx, w).float()
        assert hasattr(mod, "flydsl_mx_gate_up_q")
    assert not hasattr(mod, "flydsl_mx_gate_up_q")  # buffers removed by undo
    ref = _a8w4_reference(mod, x, idx, w)
    assert float((out - ref).abs().max()) <= 1e-2 * float(ref.abs().max())
    assert torch_flydsl.stats()["hf.mx_experts"]["hits"] == 2


# -- whole models, patch / undo -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg", [llama_cfg, qwen_moe_cfg, gpt_oss_cfg], ids=["llama", "qwen3_moe", "gpt_oss"]
)
def test_patch_undo_round_trip(cfg):
    m = tiny(cfg())
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    state = {k: v.clone() for k, v in m.state_dict().items()}
    impl = m.config._experts_implementation
    with torch.no_grad():
        ref = m(ids).logits.float()
        p = patch(m, mx_experts=False)
        assert isinstance(p, Patch) and p.active
        counts = p.counts()
        assert counts["rms_norm"] >= 5 and counts["add_rms_norm"] == 2
        assert any(n.what == "attention" for n in p.not_routed)
        assert any(n.what == "linear" for n in p.not_routed)
        out = m(ids).logits.float()
        p.undo()
        p.undo()  # idempotent
        back = m(ids).logits.float()
    assert not p.active
    assert float((out - ref).abs().max()) <= 3e-2 * float(ref.abs().max())
    assert torch.equal(back, ref)
    assert not any("forward" in mod.__dict__ for mod in m.modules())
    assert m.config._experts_implementation == impl
    assert m.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
    hits = {k: v["hits"] for k, v in torch_flydsl.stats().items() if k.startswith("hf.")}
    assert hits["hf.rms_norm"] > 0 and hits["hf.add_rms_norm"] > 0
    if cfg is not llama_cfg:
        assert counts["moe_router"] == 2 and counts["experts"] == 2
        assert hits["hf.moe_router"] > 0 and hits["hf.experts"] > 0


def test_a_second_patch_leaves_patched_modules_alone():
    m = tiny(qwen_moe_cfg())
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))
    ref = m(ids).logits
    p1 = patch(m, mx_experts=False)
    p2 = patch(m, mx_experts=False)
    assert not p2.replaced
    assert {n.reason for n in p2.not_routed if n.what in ("rms_norm", "router", "experts")} == {
        "forward already replaced on the instance",
        "already patched (undo that patch first)",
    }
    p2.undo()
    p1.undo()
    assert torch.equal(m(ids).logits, ref)


def test_patched_modules_compile_without_graph_breaks():
    """The routes are custom ops: torch.compile(fullgraph=True) traces through a patched norm."""
    mod = LlamaRMSNorm(48, eps=1e-5).bfloat16()
    x = torch.randn(4, 48).bfloat16()
    ref = mod(x)
    torch._dynamo.reset()
    with patch(mod):
        out = torch.compile(mod, backend="eager", fullgraph=True)(x)
    torch._dynamo.reset()
    _same_numerics(out, ref)
    assert torch_flydsl.stats()["hf.rms_norm"]["hits"] >= 1


def test_autograd_falls_back_to_the_module():
    """A call autograd records takes the module's own forward, so backward works."""
    mod = LlamaRMSNorm(24).bfloat16()
    x = torch.randn(3, 24).bfloat16().requires_grad_(True)
    with torch.enable_grad(), patch(mod):
        y = mod(x)
        y.float().sum().backward()
    assert x.grad is not None and mod.weight.grad is not None
    st = torch_flydsl.stats()["hf.rms_norm"]
    assert st["hits"] == 0 and st["fallbacks"] == {"autograd": 1}


def test_a_kernel_error_falls_back_with_a_warning(monkeypatch, caplog):
    import flydsl_kernels.rmsnorm as rn

    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(rn, "rms_norm", boom)
    mod = LlamaRMSNorm(16).bfloat16()
    x = torch.randn(2, 16).bfloat16()
    with patch(mod):
        y = mod(x)
    assert torch.equal(y, type(mod).forward(mod, x))
    assert torch_flydsl.stats()["hf.rms_norm"]["fallbacks"] == {"error": 1}
    assert "injected" in caplog.text


def test_patch_reports_attention_as_the_model_runs_it():
    """``patch`` registers ``"flydsl"`` and reports attention truthfully: routed (one entry
    per attention module) where the model uses ``attn_implementation="flydsl"``, else not
    routed with the call that routes it; never "no implementation is registered"."""
    from transformers import AttentionInterface

    m = tiny(llama_cfg())
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(3))
    with patch(m) as p:
        assert "flydsl" in AttentionInterface._global_mapping
        (n,) = [n for n in p.not_routed if n.what == "attention"]
        assert "sdpa" in n.reason and "set_attn_implementation('flydsl')" in n.reason
        assert "registered yet" not in n.reason and p.counts()["attention"] == 0
    m.set_attn_implementation("flydsl")
    torch_flydsl.reset_stats()
    with torch.no_grad(), patch(m) as p:
        assert p.counts()["attention"] == 2
        assert [r.module for r in p.replaced if r.route == "attention"] == [
            "model.layers.0.self_attn",
            "model.layers.1.self_attn",
        ]
        assert not [n for n in p.not_routed if n.what == "attention"]
        m(ids)
    assert torch_flydsl.stats()["hf.attention"]["hits"] == 2  # what the report says runs
