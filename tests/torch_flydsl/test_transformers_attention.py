"""``attn_implementation="flydsl"`` (``torch_flydsl.transformers.register``) against ``"eager"``
on tiny random-weight models on the CPU test backend: Llama (GQA, left padding, the KV cache)
and gpt-oss (sinks, a sliding-window layer and a full one).

bf16 models; logits compared at the positions padding does not cover, tolerance: max error /
max |eager| <= 3e-2 (two bf16 layers of rounding apart).
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig

import torch_flydsl.transformers as tft

TOL = 3e-2


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max()).item()


def llama():
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def gpt_oss(top_k=2):
    cfg = GptOssConfig(
        hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=top_k,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=256, sliding_window=5, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(1)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for mod in m.modules():
            if hasattr(mod, "sinks"):  # learned-looking sinks, not the init's near-zeros
                mod.sinks.normal_(0.0, 1.5)
    return m


def logits(model, impl, **kw):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**kw).logits


@pytest.fixture
def registered(plain):
    """``"flydsl"`` registered, no ``torch_flydsl.enable()``: the route needs none (below)."""
    return plain


@pytest.mark.parametrize("make", [llama, gpt_oss], ids=["llama", "gpt_oss"])
def test_logits_match_eager_with_padding(registered, make):
    model = make()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (2, 13), generator=g)
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    for kw in ({"input_ids": ids, "attention_mask": mask}, {"input_ids": ids}):
        registered.reset_stats()
        ours = logits(model, "flydsl", **kw)
        st = registered.stats()["hf.attention"]
        assert st["hits"] == 2 and st["fallbacks"] == {}  # both layers ran FlyDSL
        want = logits(model, "eager", **kw)
        valid = kw.get("attention_mask", torch.ones_like(ids)).bool()
        assert rel_err(ours[valid], want[valid]) <= TOL


def test_llama_decode_with_the_kv_cache(registered):
    model = llama()
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(3))
    out = {}
    for impl in ("flydsl", "eager"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            pre = model(input_ids=ids[:, :8], use_cache=True)
            out[impl] = model(input_ids=ids[:, 8:], past_key_values=pre.past_key_values).logits
    assert rel_err(out["flydsl"], out["eager"]) <= TOL


def test_fp32_model_falls_back_to_the_same_math(registered):
    model = llama().float()
    ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(4))
    registered.reset_stats()
    ours = logits(model, "flydsl", input_ids=ids)
    assert registered.stats()["hf.attention"]["fallbacks"] == {"dtype": 2}
    torch.testing.assert_close(ours, logits(model, "eager", input_ids=ids), rtol=1e-4, atol=1e-4)


# -- the op: flydsl::hf_attention, its backward, profiles, compile, the CPU rule -----------------


@pytest.fixture
def plain(monkeypatch, tmp_path):
    """No global hooks (``torch_flydsl.disable()``): the route alone decides, by the
    eligibility rule (a CPU tensor runs FlyDSL's CPU backend with no ``enable()``)."""
    import torch_flydsl
    from torch_flydsl import gates

    gates.write_table(tmp_path / "no_local_rules.json", [])
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(tmp_path / "no_local_rules.json"))
    torch_flydsl.disable()
    tft.register()
    torch_flydsl.reset_stats()
    yield torch_flydsl
    torch_flydsl.reset_stats()


def _op_inputs(seed, sq=7, sk=11, mask=False, sinks=True):
    """bf16 ``q (2, 4, sq, 16)``, ``k`` / ``v (2, 2, sk, 16)`` (GQA), an int8 ``(2, sq, sk)``
    visibility with left padding in batch 1, gpt-oss-like sinks."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, sq, 16, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, sk, 16, generator=g).bfloat16() for _ in range(2))
    m = None
    if mask:
        vis = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        m = vis.expand(2, sq, sk).clone()
        m[1, :, :3] = False
        m = m.to(torch.int8)
    s = (torch.randn(4, generator=g) * 1.5).bfloat16() if sinks else None
    return q, k, v, m, s


def _ref_grads(q, k, v, m, s, dout, causal, softcap=0.0):
    """The op's math in float64 through autograd (``library.hf.attention_reference``)."""
    from torch_flydsl.library.hf import attention_reference

    ins = [t.double().requires_grad_() for t in (q, k, v)]
    sd = s.double().requires_grad_() if s is not None else None
    out, _ = attention_reference(*ins, m, sd, 0.25, causal, softcap)
    grads = torch.autograd.grad(out, [*ins, *([sd] if sd is not None else [])], dout.double())
    return out, grads


@pytest.mark.parametrize(
    "mask,causal,softcap", [(True, False, 0.0), (False, True, 0.0), (False, False, 5.0)],
    ids=["mask", "causal", "softcap"],
)  # fmt: skip
def test_op_gradients_match_the_reference(plain, mask, causal, softcap):
    """``flydsl::hf_attention`` forward and backward (FlyDSL's kernels, sinks' gradient in
    torch) against the same math in float64: out, dq, dk, dv and dsinks, bf16 tolerance."""
    q, k, v, m, s = _op_inputs(1, mask=mask)
    q, k, v, s = (t.requires_grad_() for t in (q, k, v, s))
    out, lse = torch.ops.flydsl.hf_attention(q, k, v, m, s, 0.25, causal, softcap)
    assert out.shape == (2, 7, 4, 16) and lse.shape == (2, 4, 7) and lse.dtype == torch.float32
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).bfloat16()
    grads = torch.autograd.grad(out, (q, k, v, s), dout)
    st = plain.stats()
    assert st["hf.attention"]["hits"] == 1 and st["hf.attention_backward"]["hits"] == 1
    ref, rgrads = _ref_grads(q.detach(), k.detach(), v.detach(), m, s.detach(), dout, causal,
                             softcap)  # fmt: skip
    assert rel_err(out, ref) <= 2e-2
    for a, r in zip(grads, rgrads):
        assert a.shape == r.shape and a.dtype == torch.bfloat16
        assert rel_err(a, r) <= 2e-2


def test_opcheck():
    """torch.library's own checks of the op: schema, fake implementation (shapes and strides
    of both outputs against the real ones), autograd registration, AOT dispatch."""
    q, k, v, m, s = _op_inputs(2, mask=True)
    for t in (q, k, v, s):
        t.requires_grad_()
    torch.library.opcheck(torch.ops.flydsl.hf_attention.default, (q, k, v, m, s, 0.25, False, 0.0))
    dout = torch.randn(2, 7, 4, 16).bfloat16()
    out, lse = torch.ops.flydsl.hf_attention(q.detach(), k.detach(), v.detach(), m, s.detach(),
                                              0.25, False, 0.0)  # fmt: skip
    torch.library.opcheck(
        torch.ops.flydsl.hf_attention_backward.default,
        (dout, q.detach(), k.detach(), v.detach(), out, lse, m, s.detach(), 0.25, False, 0.0),
    )


def gpt_oss_every_expert():
    """gpt-oss with every expert taken (top-4 of 4): bf16 noise cannot flip a routing
    choice, which would move the gradients by far more than the attention's rounding."""
    return gpt_oss(top_k=4)


@pytest.mark.parametrize("make", [llama, gpt_oss_every_expert], ids=["llama", "gpt_oss"])
def test_training_step_runs_flydsl_without_enable(plain, make):
    """A training step of a model with ``attn_implementation="flydsl"`` and no
    ``torch_flydsl.enable()``: every layer's attention runs FlyDSL forward and backward on
    the CPU (the eligibility rule), and the gradients agree with ``"eager"``'s as a whole and
    per parameter (gpt-oss's sinks: 5e-2 of their largest) within bf16 tolerance."""
    model = make().train()
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0
    # no loss on the padding, nor on what padded positions predict (the label one later):
    # their rows see no key, where eager averages every value and the kernels give 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)

    def grads(impl):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        return {
            n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None
        }

    ours = grads("flydsl")
    st = plain.stats()
    assert st["hf.attention"] == {"calls": 2, "hits": 2, "fallbacks": {}}
    assert st["hf.attention_backward"]["hits"] == 2
    want = grads("eager")
    assert ours.keys() == want.keys()
    num = sum(float((ours[n] - want[n]).square().sum()) for n in want)
    den = sum(float(want[n].square().sum()) for n in want)
    assert (num / den) ** 0.5 <= 2e-2  # ~5e-3 measured, as sdpa's against eager's
    for n in want:  # every parameter (a 4-element router bias: ~7e-2 of its largest)
        assert rel_err(ours[n], want[n]) <= (5e-2 if n.endswith("sinks") else 0.1), n


def test_profiles_name_the_op(plain):
    """torch.profiler names the call ``flydsl::hf_attention`` (and its backward), so a
    profile tells FlyDSL attention time from ATen's by name, with no wrapper."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v, m, s = _op_inputs(3, mask=True)
    q.requires_grad_()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out, _ = torch.ops.flydsl.hf_attention(q, k, v, m, s, 0.25, False, 0.0)
        out.float().sum().backward()
    names = {e.name for e in prof.events()}
    assert {"flydsl::hf_attention", "flydsl::hf_attention_backward"} <= names


def test_compiles_as_one_node_with_its_backward(plain):
    """Under torch.compile (AOTAutograd, fullgraph) the route is one opaque node forward and
    one backward, no graph break; the results are the eager route's."""
    import torch._dynamo

    class Attn(torch.nn.Module):
        is_causal = True
        training = True

    mod = Attn()
    q, k, v, _, s = _op_inputs(4)

    def f(q, k, v, s):
        out, _ = tft.attention_forward(mod, q, k, v, None, scaling=0.25, s_aux=s)
        return out.float().square().sum()

    def run(fn):
        ins = [t.clone().requires_grad_() for t in (q, k, v, s)]
        return torch.autograd.grad(fn(*ins), ins)

    want = run(f)
    torch._dynamo.reset()
    try:
        got = run(torch.compile(f, backend="aot_eager", fullgraph=True))
    finally:
        torch._dynamo.reset()
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r)
    assert plain.stats()["hf.attention_backward"]["hits"] == 2
