"""flydsl_models.models: shipped configs, size overrides, seeded weights, checkpoints, MXFP4 experts."""

from __future__ import annotations

import json

import pytest
import torch

from flydsl_models import models

pytestmark = pytest.mark.cpu


def test_shipped_configs_hold_the_published_shapes():
    """The figures of ../shared/reference/gfx950.md's model table (published configs)."""
    llama = models.resolve("llama-3.1-8b").config_dict
    assert (llama["hidden_size"], llama["intermediate_size"], llama["num_attention_heads"]) == (
        4096,
        14336,
        32,
    )
    assert (llama["num_key_value_heads"], llama["vocab_size"], llama["num_hidden_layers"]) == (
        8,
        128256,
        32,
    )
    qwen = models.resolve("qwen3-30b-a3b").config_dict
    assert (qwen["hidden_size"], qwen["moe_intermediate_size"], qwen["num_experts"]) == (
        2048,
        768,
        128,
    )
    assert (qwen["num_experts_per_tok"], qwen["head_dim"], qwen["vocab_size"]) == (8, 128, 151936)
    oss = models.resolve("gpt-oss-20b").config_dict
    assert (oss["hidden_size"], oss["intermediate_size"], oss["num_local_experts"]) == (
        2880,
        2880,
        32,
    )
    assert (oss["num_experts_per_tok"], oss["head_dim"], oss["vocab_size"]) == (4, 64, 201088)
    assert len(oss["layer_types"]) == oss["num_hidden_layers"] == 24
    for name in models.PRESETS:
        cfg = models.resolve(name).config()  # transformers accepts every shipped config
        assert cfg.model_type == models.resolve(name).model_type
    from torch_flydsl.transformers import is_mxfp4

    assert is_mxfp4(models.resolve("gpt-oss-20b").config())
    assert not is_mxfp4(models.resolve("qwen3-30b-a3b").config())


def test_default_is_llama_scaled_down():
    spec = models.resolve(None)
    assert spec.name == models.DEFAULT and spec.model_type == "llama"
    d = spec.config_dict
    assert d["num_hidden_layers"] == 2 and d["hidden_size"] == 256 and d["vocab_size"] == 8192
    # Llama-3.1-8B's 4:1 grouped-query ratio, with KV heads that split over --tp 2
    assert (d["num_attention_heads"], d["num_key_value_heads"]) == (8, 2)
    assert d["rope_scaling"]["rope_type"] == "llama3"  # the rest is Llama-3.1-8B's
    assert models.resolve(None, {"layers": 1}).config_dict["num_hidden_layers"] == 1


def test_overrides_reach_the_model_specific_keys():
    d = models.resolve(
        "gpt-oss-20b", {"layers": 3, "experts": 6, "top_k": 2, "moe_intermediate": 64, "vocab": 300}
    ).config_dict
    assert d["num_local_experts"] == 6 and d["num_experts_per_tok"] == d["experts_per_token"] == 2
    assert d["intermediate_size"] == 64
    assert d["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert d["pad_token_id"] is None and d["eos_token_id"] is None  # beyond the new vocabulary
    q = models.resolve(
        "qwen3-30b-a3b", {"experts": 4, "moe_intermediate": 32, "layers": 2}
    ).config_dict
    assert (
        q["num_experts"] == 4 and q["moe_intermediate_size"] == 32 and q["max_window_layers"] == 2
    )
    with pytest.raises(ValueError, match="does not apply to llama"):
        models.resolve("llama-3.1-8b", {"experts": 4})
    with pytest.raises(ValueError, match="expected one of"):
        models.resolve("llama-9000")


def test_config_paths_and_checkpoints(tmp_path):
    cfg = models.resolve(None, {"hidden": 64, "intermediate": 96, "vocab": 128}).config_dict
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    spec = models.resolve(str(tmp_path / "c.json"), {"layers": 1})
    assert spec.source == "config" and spec.config_dict["num_hidden_layers"] == 1
    m = models.build(spec, torch.float32, "cpu", seed=3)
    ckpt = tmp_path / "ckpt"
    m.save_pretrained(ckpt)
    spec2 = models.resolve(str(ckpt))
    assert spec2.source == "checkpoint"
    m2 = models.build(spec2, torch.float32, "cpu")  # the real weights come back
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    with pytest.raises(ValueError, match="checkpoint"):
        models.resolve(str(ckpt), {"layers": 1})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"config\.json"):
        models.resolve(str(tmp_path / "empty"))


def test_random_weights_are_seeded():
    spec = models.resolve(None, {"hidden": 64, "intermediate": 96, "vocab": 128})
    a = models.build(spec, torch.bfloat16, "cpu", seed=1).state_dict()
    b = models.build(spec, torch.bfloat16, "cpu", seed=1).state_dict()
    c = models.build(spec, torch.bfloat16, "cpu", seed=2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_gpt_oss_experts_are_mxfp4_values():
    from flydsl_kernels.mx import reference as mxr

    spec = models.resolve(
        "gpt-oss-20b",
        {
            "layers": 1,
            "hidden": 64,
            "moe_intermediate": 64,
            "experts": 3,
            "top_k": 2,
            "heads": 2,
            "kv_heads": 1,
            "head_dim": 32,
            "vocab": 64,
        },
    )
    m = models.build(spec, torch.bfloat16, "cpu")
    assert getattr(m.config, "quantization_config", None) is None  # a saved copy loads as plain
    ex = m.model.layers[0].mlp.experts
    fp4 = torch.float4_e2m1fn_x2
    for w in (ex.gate_up_proj, ex.down_proj):
        nt = w.detach().transpose(1, 2).float().contiguous()
        q, s = mxr.to_mx(nt, fp4)
        assert torch.equal(mxr.from_mx(q, s, fp4, out_dtype=torch.float32), nt)  # exact round trip
        assert (
            len(torch.unique(nt[0, 0, :32].abs() / nt[0, 0, :32].abs().max())) <= 8
        )  # 8 magnitudes
