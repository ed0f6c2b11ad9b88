"""Which model an evaluation runs: shipped configs, size overrides, seeded random weights, checkpoints.

The shipped configs (``configs/*.json``) hold the models' published
``config.json`` values; nothing is downloaded. ``--model`` takes a preset
name, a path to a ``config.json``, or a local checkpoint directory (a
``config.json`` beside weight files: its real weights are loaded). Size
overrides scale a config down for a small machine and are applied to the
model-specific keys (``OVERRIDE_KEYS``); the default model is Llama-3.1-8B's
config scaled down that way (``DEFAULT``).

Weights built from a config are random and seeded. gpt-oss ships its
experts in MXFP4 (``quantization_config.quant_method == "mxfp4"``): its random
expert weights are rounded to MXFP4 values (OCP MX, E8M0 scale per 32 along
K), so the ``off`` arm computes on what a gpt-oss checkpoint holds and the MX
route's re-quantization of those weights is exact.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from importlib import resources
from pathlib import Path

import torch

from .checks import UsageError

log = logging.getLogger("flydsl_models")

#: shipped configs (published values), by preset name
PRESETS = {
    "llama-3.1-8b": "llama-3.1-8b.json",
    "qwen3-30b-a3b": "qwen3-30b-a3b.json",
    "gpt-oss-20b": "gpt-oss-20b.json",
}
#: the no-argument default: Llama-3.1-8B's architecture scaled down to run in seconds on a CPU
DEFAULT = "llama-tiny"
DEFAULT_BASE = "llama-3.1-8b"
DEFAULT_OVERRIDES = {
    "layers": 2,
    "hidden": 256,
    "intermediate": 896,  # 3.5 x hidden, as 14336 / 4096
    "heads": 8,
    "kv_heads": 2,  # Llama-3.1-8B's 4:1 grouped-query ratio; 2 KV heads split over --tp 2
    "vocab": 8192,
}

#: generic override -> the config keys it sets, per model_type ("*" for any other)
OVERRIDE_KEYS = {
    "layers": {"*": ("num_hidden_layers",)},
    "hidden": {"*": ("hidden_size",)},
    "intermediate": {"*": ("intermediate_size",)},
    "moe_intermediate": {
        "qwen3_moe": ("moe_intermediate_size",),
        "gpt_oss": ("intermediate_size",),
    },
    "heads": {"*": ("num_attention_heads",)},
    "kv_heads": {"*": ("num_key_value_heads",)},
    "head_dim": {"*": ("head_dim",)},
    "experts": {"qwen3_moe": ("num_experts",), "gpt_oss": ("num_local_experts",)},
    "top_k": {
        "qwen3_moe": ("num_experts_per_tok",),
        "gpt_oss": ("num_experts_per_tok", "experts_per_token"),
    },
    "vocab": {"*": ("vocab_size",)},
}
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model*.safetensors.index.json")


@dataclasses.dataclass
class ModelSpec:
    """A resolved ``--model``: where its config came from, the config, the overrides applied."""

    name: str
    source: str  # "preset", "config" or "checkpoint"
    path: str | None
    config_dict: dict
    overrides: dict

    def config(self):
        """transformers' config object; a config transformers rejects is a ``UsageError``
        naming where it came from."""
        from transformers import AutoConfig

        d = dict(self.config_dict)
        model_type = d.pop("model_type")
        try:
            return AutoConfig.for_model(model_type, **d)
        except Exception as e:  # transformers' and huggingface_hub's validators raise several kinds
            why = " ".join(str(e).split())  # one line
            raise UsageError(
                f"--model {self.path or self.name}: transformers rejects the config: {why}"
            ) from None

    @property
    def model_type(self) -> str:
        return self.config_dict["model_type"]

    def summary(self) -> dict:
        d = self.config_dict
        keys = (
            "model_type",
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_experts",
            "num_local_experts",
            "num_experts_per_tok",
            "vocab_size",
        )
        return {k: d[k] for k in keys if d.get(k) is not None}


def _read_json(path: Path) -> dict:
    """A config file's dict; a file that is not a JSON object is a ``UsageError`` naming it."""
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(
            f"--model {path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--model {path}: cannot read it ({e})") from None
    if not isinstance(d, dict):
        raise UsageError(
            f"--model {path}: a config.json holds a JSON object, not {type(d).__name__}"
        )
    if "model_type" not in d:
        raise UsageError(f"--model {path}: the config has no model_type")
    return d


def _preset_dict(name: str) -> dict:
    text = resources.files("flydsl_models").joinpath("configs", PRESETS[name]).read_text()
    return json.loads(text)


def resolve(model: str | None, overrides: dict | None = None) -> ModelSpec:
    """The ``ModelSpec`` of ``--model`` (None: ``DEFAULT``) with size ``overrides`` applied."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if model in (None, DEFAULT):
        d = _preset_dict(DEFAULT_BASE)
        return ModelSpec(
            DEFAULT,
            "preset",
            None,
            apply_overrides(d, {**DEFAULT_OVERRIDES, **overrides}),
            {**DEFAULT_OVERRIDES, **overrides},
        )
    if model in PRESETS:
        return ModelSpec(
            model, "preset", None, apply_overrides(_preset_dict(model), overrides), overrides
        )
    p = Path(model).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise UsageError(
                f"--model {model}: a directory needs a config.json (a local checkpoint)"
            )
        has_weights = any(any(p.glob(g)) for g in _WEIGHT_FILES)
        d = _read_json(cfg)
        if has_weights:
            if overrides:
                raise UsageError(
                    f"--model {model} is a checkpoint: its real weights fix the sizes, so size "
                    f"overrides ({', '.join(sorted(overrides))}) cannot apply; point --model at its "
                    "config.json to build a scaled-down model with random weights instead"
                )
            return ModelSpec(p.name, "checkpoint", str(p), d, {})
        return ModelSpec(p.name, "config", str(cfg), apply_overrides(d, overrides), overrides)
    if p.is_file() and p.suffix == ".json":
        return ModelSpec(
            p.stem, "config", str(p), apply_overrides(_read_json(p), overrides), overrides
        )
    raise UsageError(
        f"--model {model!r}: expected one of {', '.join(PRESETS)}, a path to a config.json, or a "
        "local checkpoint directory (nothing is downloaded)"
    )


def apply_overrides(d: dict, overrides: dict) -> dict:
    """``d`` with the generic size ``overrides`` written to its model-specific keys."""
    d = dict(d)
    mt = d.get("model_type")
    if mt is None:
        raise UsageError("the config has no model_type")
    for name, value in overrides.items():
        keys = OVERRIDE_KEYS.get(name)
        if keys is None:
            raise UsageError(
                f"unknown size override {name!r}: expected one of {', '.join(OVERRIDE_KEYS)}"
            )
        targets = keys.get(mt, keys.get("*"))
        if targets is None:
            raise UsageError(f"--{name.replace('_', '-')} does not apply to {mt} models")
        for k in targets:
            d[k] = int(value)
    if "layers" in overrides and isinstance(d.get("layer_types"), list):
        # gpt-oss alternates sliding and full attention: keep the pattern for the new depth
        pattern = d["layer_types"]
        d["layer_types"] = [pattern[i % len(pattern)] for i in range(int(overrides["layers"]))]
    if "layers" in overrides and "max_window_layers" in d:
        d["max_window_layers"] = min(d["max_window_layers"], int(overrides["layers"]))
    vocab = d.get("vocab_size")
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        v = d.get(k)
        ids = v if isinstance(v, list) else [v]
        if vocab and any(isinstance(i, int) and i >= vocab for i in ids):
            d[k] = None  # a scaled-down vocabulary has no such token
    return d


def is_mxfp4_dict(d: dict) -> bool:
    """``is_mxfp4`` of a config dict (before transformers builds the config)."""
    q = d.get("quantization_config")
    return isinstance(q, dict) and str(q.get("quant_method", "")).lower() == "mxfp4"


def is_mxfp4(config) -> bool:
    q = getattr(config, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method)).lower() == "mxfp4"


def build(spec: ModelSpec, dtype: torch.dtype, device: str, seed: int = 0, *, tp_size: int = 1):
    """The model of ``spec`` in eval mode on ``device``: seeded random weights, or the checkpoint's."""
    from transformers import AutoModelForCausalLM

    if spec.source == "checkpoint":
        kw = {"dtype": dtype}
        if tp_size > 1:
            from transformers.distributed import DistributedConfig

            kw["distributed_config"] = DistributedConfig(tp_plan="auto", tp_size=tp_size)
        model = AutoModelForCausalLM.from_pretrained(spec.path, **kw)
        if tp_size == 1:
            model = model.to(device)
        return model.eval()
    config = spec.config()
    mx = is_mxfp4(config)
    if mx:
        # from_config builds float experts (transformers quantizes only in from_pretrained), and a
        # saved copy must load as a plain checkpoint: the config loses its quantization_config and
        # the MXFP4 rounding below makes the experts the values a checkpoint holds
        del config.quantization_config
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if mx:
        round_experts_to_mxfp4(model)
    return model.eval()


@torch.no_grad()
def round_experts_to_mxfp4(model) -> int:
    """Round every experts module's 3-D weights to MXFP4 values along K; returns how many."""
    from flydsl_kernels.mx import from_mx, reference, to_mx

    fp4 = torch.float4_e2m1fn_x2
    n = 0
    for m in model.modules():
        if not hasattr(type(m).forward, "__wrapped__") or not hasattr(m, "is_transposed"):
            continue
        for name in ("gate_up_proj", "up_proj", "down_proj"):
            w = getattr(m, name, None)
            if not isinstance(w, torch.Tensor) or w.dim() != 3:
                continue
            nt = w.transpose(1, 2) if m.is_transposed else w  # K last: the MX blocks run along K
            if nt.shape[-1] % 32:
                raise ValueError(
                    f"{name}: K = {nt.shape[-1]} is not a multiple of 32; MXFP4 needs 32-element blocks "
                    "(choose --hidden / --moe-intermediate multiples of 32)"
                )
            x = nt.float().contiguous()
            if x.is_cpu:  # the float64 spec: vectorized, faster than the CPU kernel backend here
                q, s = reference.to_mx(x, fp4)
                back = reference.from_mx(q, s, fp4, out_dtype=torch.float32)
            else:
                q, s = to_mx(x, fp4)
                back = from_mx(q, s, fp4, out_dtype=torch.float32)
            nt.copy_(back.to(w.dtype))
            n += 1
    return n
