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


def gpt_oss():
    cfg = GptOssConfig(
        hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
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
def registered(cpu_backend):
    tft.register()
    return cpu_backend


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
