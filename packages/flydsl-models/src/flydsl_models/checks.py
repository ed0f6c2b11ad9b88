"""Every option checked before the first model is built: one line, exit status 2.

``check(args, spec)`` looks at the parsed options and the resolved model
(``models.ModelSpec``: a config, not yet a model) and raises ``UsageError``
naming the option and what it accepts. Nothing here builds a model, touches
a GPU beyond asking torch whether one is present, or leaves a file behind
(the ``--out`` probe removes its own).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class UsageError(ValueError):
    """A bad option or option combination (``flydsl-eval`` prints it in one line, exit 2)."""


#: options that count something and must be at least 1 (``--profile-steps`` may be 0)
_POSITIVE = (
    "layers",
    "hidden",
    "intermediate",
    "moe_intermediate",
    "heads",
    "kv_heads",
    "head_dim",
    "experts",
    "top_k",
    "vocab",
    "batch",
    "prompt_len",
    "gen_len",
    "repeats",
    "tp",
    "threads",
    "train_steps",
    "train_batch",
    "train_seq_len",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_values(args) -> None:
    """The options' own ranges (no model needed)."""
    for name in _POSITIVE:
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise UsageError(f"{_flag(name)} {v}: must be at least 1")
    if args.profile_steps < 0:
        raise UsageError(f"--profile-steps {args.profile_steps}: must be 0 or more")
    if getattr(args, "train_lr", 1.0) <= 0:
        raise UsageError(f"--train-lr {args.train_lr}: must be positive")
    if args.tp_reference and args.tp == 1:
        raise UsageError(
            "--tp-reference compares a tensor-parallel run with one process: add --tp N (N >= 2)"
        )
    if args.vocab is not None and args.vocab < 2:
        raise UsageError(f"--vocab {args.vocab}: must be at least 2 (token 0 is never drawn)")


def check_device(device: str) -> None:
    """``cpu``, or ``cuda[:N]`` with such a GPU present."""
    import torch

    if device == "cpu":
        return
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise UsageError(f"--device {device}: expected cpu or cuda[:N]")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise UsageError(f"--device {device}: no GPU is visible to torch here (use --device cpu)")
    if index and int(index) >= n:
        raise UsageError(f"--device {device}: torch sees {n} GPU(s), cuda:0 to cuda:{n - 1}")


def check_world(tp: int) -> None:
    """``--tp N`` runs under torchrun with N processes (``WORLD_SIZE``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if tp > 1 and world != tp:
        raise UsageError(
            f"--tp {tp} needs {tp} processes: run `torchrun --nproc-per-node {tp} -m "
            f"flydsl_models.eval --tp {tp} ...` (WORLD_SIZE is {world})"
        )
    if tp == 1 and world > 1:
        raise UsageError(f"{world} processes (WORLD_SIZE) but --tp 1: add --tp {world}")


def check_out(out: str) -> None:
    """``--out`` can be created and written (probed now, not after the run)."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".flydsl-eval-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def _get(d: dict, *keys):
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


def check_model(args, spec, *, mx: bool) -> None:
    """The resolved config against the workload and the arms (``spec``: ``models.ModelSpec``)."""
    d = spec.config_dict
    heads = _get(d, "num_attention_heads")
    kv = _get(d, "num_key_value_heads") or heads
    hidden = _get(d, "hidden_size")
    experts = _get(d, "num_experts", "num_local_experts")
    top_k = _get(d, "num_experts_per_tok", "experts_per_token")
    where = f"--model {spec.name}"
    if heads and kv and heads % kv:
        raise UsageError(
            f"{where}: {heads} attention heads cannot be shared by {kv} key/value heads "
            "(--heads must be a multiple of --kv-heads)"
        )
    if heads and hidden and d.get("head_dim") is None and hidden % heads:
        raise UsageError(
            f"{where}: hidden size {hidden} is not a multiple of {heads} heads and the config "
            "has no head_dim (set --head-dim, or --hidden a multiple of --heads)"
        )
    if experts is not None and top_k is not None and top_k > experts:
        raise UsageError(
            f"{where}: top-k {top_k} is more than the {experts} experts (--top-k <= --experts)"
        )
    if args.mx_experts == "on" and experts is None:
        raise UsageError(
            f"--mx-experts on: {where} ({spec.model_type}) has no MoE experts; the MX route is for "
            "MoE models (gpt-oss, Qwen3-MoE)"
        )
    if mx and spec.source != "checkpoint":
        k_sizes = {
            "hidden size": hidden,
            "expert intermediate size": _get(d, "moe_intermediate_size", "intermediate_size"),
        }
        for what, k in k_sizes.items():
            if k is not None and k % 32:
                raise UsageError(
                    f"{where}: {what} {k} is not a multiple of 32; the MXFP4 experts need 32-element "
                    "blocks (choose --hidden / --moe-intermediate multiples of 32, or --mx-experts off)"
                )
    positions = _get(d, "max_position_embeddings")
    need = args.prompt_len + args.gen_len
    if positions is not None and need > positions:
        raise UsageError(
            f"--prompt-len {args.prompt_len} + --gen-len {args.gen_len} = {need} tokens: {where} has "
            f"{positions} positions (max_position_embeddings)"
        )
    train_len = getattr(args, "train_seq_len", None)
    if train_len and "train" in args.arm_names and positions is not None and train_len > positions:
        raise UsageError(f"--train-seq-len {train_len}: {where} has {positions} positions")
    if args.tp > 1:
        _check_tp(args.tp, spec, heads, kv)


def _check_tp(tp: int, spec, heads, kv) -> None:
    """transformers' ``tp_plan="auto"`` splits heads, KV heads and the MLP columns evenly."""
    d = spec.config_dict
    sizes = {
        "attention heads (--heads)": heads,
        "key/value heads (--kv-heads)": kv,
        "intermediate size (--intermediate)": d.get("intermediate_size"),
        "expert intermediate size (--moe-intermediate)": d.get("moe_intermediate_size"),
    }
    for what, n in sizes.items():
        if n is not None and n % tp:
            raise UsageError(
                f"--tp {tp}: the model's {n} {what} cannot be split evenly over {tp} processes "
                f"(choose sizes that are multiples of {tp})"
            )
