"""``flydsl-eval``: does a transformers model run correctly, and faster, with FlyDSL on?

    uv run flydsl-eval                                   # the default: a small Llama on the CPU
    uv run flydsl-eval --model qwen3-30b-a3b --layers 2 --hidden 256 --experts 16
    uv run flydsl-eval --model llama-3.1-8b --device cuda --arms off,eager,compile
    uv run flydsl-eval --arms off,eager,train            # + training, FlyDSL off vs on
    torchrun --nproc-per-node 2 -m flydsl_models.eval --tp 2 --model ...

Every option is checked before the first model is built (``checks.py``: one line,
exit status 2). For each inference arm (``arms.py``) it runs greedy decoding and
compares logits and tokens with the ``off`` arm (a quantized route: with a
reference that applies the same quantization, ``mxref.py``), times prefill and
decode (medians of repeats, warm-up / compile time apart), and profiles one
generation for op coverage (``coverage.py``); the ``train`` arm (``train.py``)
compares loss curves. It writes ``results.json``, ``report.md`` and the plots to
``--out`` (``report.py``). Exit status 1 when an arm that ran fails its checks
(or raised), 0 otherwise (an unavailable arm is reported, not failed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import sys
import time

from .checks import UsageError

log = logging.getLogger("flydsl_models")

DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
_SIZE_OPTIONS = (
    ("layers", "number of decoder layers"),
    ("hidden", "hidden size"),
    ("intermediate", "dense MLP intermediate size"),
    ("moe_intermediate", "expert intermediate size (MoE models)"),
    ("heads", "attention heads"),
    ("kv_heads", "key/value heads"),
    ("head_dim", "head dimension"),
    ("experts", "number of experts (MoE models)"),
    ("top_k", "experts per token (MoE models)"),
    ("vocab", "vocabulary size"),
)


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument raises ``UsageError`` (one line, exit status 2) instead of
    printing the usage."""

    def error(self, message):
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    from .arms import ARMS, INFERENCE_ARMS
    from .models import DEFAULT, PRESETS

    p = Parser(
        prog="flydsl-eval",
        description="End-to-end transformers evaluation, FlyDSL on vs off: correctness, speed, "
        "op coverage, and optionally training.",
    )
    p.add_argument(
        "--model",
        default=None,
        help=f"{'|'.join(PRESETS)}, a path to a config.json, or a local checkpoint directory "
        f"(default {DEFAULT}: Llama-3.1-8B's config scaled down, random weights)",
    )
    g = p.add_argument_group("size overrides (scale a config down; random weights only)")
    for name, what in _SIZE_OPTIONS:
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None, help=what)
    p.add_argument(
        "--device", default="cpu", help="cpu (FlyDSL's CPU backend) or cuda[:N] (default cpu)"
    )
    p.add_argument(
        "--dtype", default="bf16", choices=sorted(DTYPES), help="model dtype (default bf16)"
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--gen-len", type=int, default=8, help="greedy decode steps (default 8)")
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats; medians reported (default 3)"
    )
    p.add_argument(
        "--profile-steps", type=int, default=2, help="decode steps in the profile (default 2)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU intra-op threads (default 1 on the CPU: FlyDSL's CPU backend runs one thread, and one "
        "thread keeps CPU figures stable on a shared machine; unchanged on a GPU)",
    )
    p.add_argument(
        "--arms",
        default=",".join(INFERENCE_ARMS),
        help=f"comma-separated subset of {','.join(ARMS)} (default {','.join(INFERENCE_ARMS)}; "
        "off is always run; train trains FlyDSL off and on, on as the eager and compile arms "
        "listed beside it, eager when neither is)",
    )
    p.add_argument(
        "--mx-experts",
        default="auto",
        choices=("auto", "on", "off"),
        help="MXFP4 experts route: auto = when the model's checkpoint is MXFP4 (gpt-oss)",
    )
    t = p.add_argument_group("training (the train arm)")
    t.add_argument("--train-steps", type=int, default=8, help="AdamW steps (default 8)")
    t.add_argument("--train-batch", type=int, default=4, help="sequences per step (default 4)")
    t.add_argument("--train-seq-len", type=int, default=32, help="tokens per sequence (default 32)")
    t.add_argument("--train-lr", type=float, default=3e-3, help="learning rate (default 3e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompt")
    p.add_argument(
        "--out", default="flydsl-eval-out", help="output directory (default ./flydsl-eval-out)"
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (run under torchrun)")
    p.add_argument(
        "--tp-reference",
        action="store_true",
        help="with --tp: rank 0 also runs the model unsharded and compares logits (small models)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars or lines")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def checked(args):
    """``(spec, mx)`` after every check that needs no model (``checks.py``)."""
    from . import arms as arms_mod
    from . import checks, models

    checks.check_values(args)
    args.arm_names = arms_mod.parse(args.arms)
    checks.check_device(args.device)
    checks.check_world(args.tp)
    overrides = {n: getattr(args, n) for n, _ in _SIZE_OPTIONS}
    spec = models.resolve(args.model, overrides)
    mx = {"on": True, "off": False}.get(args.mx_experts)  # None: auto
    if mx is None:
        mx = models.is_mxfp4_dict(spec.config_dict)
    checks.check_model(args, spec, mx=mx)  # ours first: they name the option
    spec.config()  # then transformers' own checks of the config, naming the file
    if int(os.environ.get("RANK", "0")) == 0:
        checks.check_out(args.out)
    return spec, mx


def run(args, console, spec=None, mx=None) -> dict:
    """Run the evaluation ``args`` describes; returns the results dict (``report.py``)."""
    if spec is None:
        spec, mx = checked(args)
    import torch
    import transformers

    import torch_flydsl

    from . import arms as arms_mod
    from . import models, tp
    from .progress import Progress, mode_for

    t_start = time.perf_counter()
    dtype = getattr(torch, DTYPES[args.dtype])
    arm_names = args.arm_names
    dist = (
        tp.init(args.tp, args.device)
        if args.tp > 1
        else {"rank": 0, "world": 1, "device": args.device}
    )
    rank, device = dist["rank"], dist["device"]
    if args.threads or not device.startswith("cuda"):
        torch.set_num_threads(args.threads or 1)
    progress = Progress(console, mode_for(console, args.no_progress or rank != 0))

    results: dict = {
        "format": "flydsl_models.results/2",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "workload": {
            "batch": args.batch,
            "prompt_len": args.prompt_len,
            "gen_len": args.gen_len,
            "repeats": args.repeats,
            "profile_steps": args.profile_steps,
            "seed": args.seed,
        },
        "arms": {},
        "tp": {"size": args.tp, "backend": dist.get("backend")},
    }
    ckpt, temporary = None, False
    with progress:
        with progress.phase(f"build {spec.name}"):
            if args.tp > 1:
                ckpt, temporary = tp.shared_checkpoint(spec, dtype, "cpu", args.seed, rank)
                model = tp.load(ckpt, dtype, args.tp)
            else:
                model = models.build(spec, dtype, device, args.seed)
        dev = next(model.parameters()).device
        vocab = model.config.get_text_config().vocab_size
        g = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(1, vocab, (args.batch, args.prompt_len), generator=g).to(dev)
        results["model"] = {
            "name": spec.name,
            "source": spec.source,
            "path": spec.path,
            "overrides": spec.overrides,
            "summary": spec.summary(),
            "dtype": str(dtype).replace("torch.", ""),
            "params": sum(p.numel() for p in model.parameters()),  # DTensor: global sizes
            "class": type(model).__name__,
            "mxfp4_experts": mx,
        }
        results["machine"] = _machine(dev, torch, transformers, torch_flydsl)

        session = arms_mod.Session(model, mx_experts=mx)
        outputs_of: dict = {}
        try:
            for name in (a for a in arm_names if a in arms_mod.INFERENCE_ARMS):
                arm = arms_mod.prepare(name, model, session)
                entry = {"available": arm.available, "description": _DESCRIPTIONS[name]}
                results["arms"][name] = entry
                if not arm.available:
                    entry["reason"] = arm.reason
                    progress.line(f"arm {name} unavailable: {arm.reason}")
                    continue
                entry["attention"] = arm.attention
                try:
                    outputs_of[name] = _measure_arm(args, name, arm, model, ids, entry, progress)
                except Exception as e:
                    if name == "off":
                        raise  # nothing to compare against
                    log.warning("arm %s failed", name, exc_info=True)
                    entry["error"] = f"{type(e).__name__}: {e}"
                    continue
                if name == "off":
                    if dtype != torch.float32 and args.tp == 1:
                        results["fp32_reference"] = _fp32_reference(
                            args, model, ids, dtype, outputs_of, progress
                        )
                    continue
                mx_ran = arm.patch is not None and arm.patch.counts()["mx_experts"] > 0
                if not mx_ran:
                    entry["correctness"] = _judge(
                        outputs_of, "off", outputs_of[name], dtype, results
                    )
                    continue
                ref = _mx_arm_reference(args, name, arm, model, ids, progress)
                entry["correctness"] = _compare(
                    ref, outputs_of[name], dtype, f"{name}, MX op by the reference"
                )
                entry["correctness_vs_off"] = _compare(
                    outputs_of["off"], outputs_of[name], dtype, "off"
                )
                if "mx_reference" not in results:
                    results["mx_reference"] = _mx_format_error(
                        args, model, session, ids, dtype, outputs_of["off"], progress
                    )
        finally:
            session.close()
            if "compile" in results["arms"] and results["arms"]["compile"]["available"]:
                torch._dynamo.reset()  # the compiled graphs hold guards on the undone forwards
        if args.tp > 1 and args.tp_reference:
            results["tp"]["reference"] = _tp_reference(
                args, ckpt, dtype, device, ids, outputs_of, mx, rank, progress
            )
        if "train" in arm_names:
            results["train"] = _train(args, spec, dtype, device, arm_names, results, progress)
    if args.tp > 1:
        tp.finish(ckpt, temporary, rank)
    results["elapsed_s"] = time.perf_counter() - t_start
    results["ok"] = (
        all(
            a.get("correctness", {}).get("ok", True) and "error" not in a
            for a in results["arms"].values()
        )
        and all(c["ok"] for c in (results["tp"].get("reference") or {}).values())
        and results.get("train", {}).get("ok", True)
    )
    results["rank"] = rank
    return results


def _compare(ref, got, dtype, reference: str) -> dict:
    from . import measure

    return measure.compare(ref, got, dtype, reference=reference)


def _measure_arm(args, name, arm, model, ids, entry, progress):
    """Warm-up, greedy outputs, timing, profile and stats of one arm into ``entry``."""
    import torch_flydsl

    from . import coverage, measure

    guard = torch_flydsl.disabled() if name == "off" else contextlib.nullcontext()
    runner = measure.Runner(arm.forward, model)
    torch_flydsl.reset_stats()
    with guard:
        with progress.phase(f"{name}: warm-up{' + compile' if name == 'compile' else ''}"):
            entry["warmup_s"] = measure.warmup(runner, ids)
        with progress.phase(f"{name}: greedy decode ({args.gen_len} tokens)"):
            outputs = runner.greedy(ids, args.gen_len)
        with progress.phase(f"{name}: timing ({args.repeats} repeats)", total=args.repeats) as ph:
            entry["timing"] = measure.timing(runner, ids, args.gen_len, args.repeats, ph.advance)
        with progress.phase(f"{name}: profile"):
            context = name != "compile"  # module hooks would be traced into the compiled graph
            events, marks = measure.profile(runner, ids, args.profile_steps, module_context=context)
            gpu = runner.device.type == "cuda"
            entry["coverage"] = coverage.attribute(
                events, gpu=gpu, module_context=context, marks=marks
            ).as_dict()
    entry["stats"] = {k: v for k, v in torch_flydsl.stats().items() if v["calls"]}
    if arm.patch is not None:
        entry["routes"] = arm.patch.as_dict()
    return outputs


#: the fp32 reference is made for models up to this many parameters (an fp32 copy of each)
FP32_REFERENCE_MAX_PARAMS = 1_000_000_000


def _fp32_reference(args, model, ids, dtype, outputs_of, progress) -> dict:
    """The off model upcast to fp32 (a copy: the same weights, exactly): how far the off arm's
    own low-precision numerics are from the model's math. An arm that disagrees with off
    beyond the thresholds still passes when it agrees with this within them (``_judge``)."""
    import copy

    import torch

    import torch_flydsl

    from . import measure

    n = sum(p.numel() for p in model.parameters())
    if n > FP32_REFERENCE_MAX_PARAMS:
        return {"skipped": f"{n / 1e9:.1f}G parameters: no fp32 copy made"}
    with progress.phase("fp32 reference: off, upcast to fp32"), torch_flydsl.disabled():
        ref = copy.deepcopy(model).float()
        outputs_of["fp32"] = measure.Runner(ref, ref).greedy(ids, args.gen_len)
        del ref
    off = measure.compare(outputs_of["fp32"], outputs_of["off"], dtype, reference="off in fp32")
    return {"off_vs_fp32": off, "dtype": str(torch.float32).replace("torch.", "")}


def _judge(outputs_of, reference, got, dtype, results) -> dict:
    """The arm against ``reference``; when that fails and an fp32 reference exists, against
    the fp32 model too: an arm within the thresholds of the model's own math passes, however
    far the off arm's low-precision numerics are from it (both shown)."""
    c = _compare(outputs_of[reference], got, dtype, reference)
    if c["ok"] or "fp32" not in outputs_of:
        return c
    f = _compare(outputs_of["fp32"], got, dtype, "off in fp32")
    c["vs_fp32"] = f
    if f["ok"]:
        c["ok"] = True
        c["verdict_basis"] = "fp32 model (off's own bf16 numerics are further from it)"
    return c


def _mx_arm_reference(args, name, arm, model, ids, progress):
    """The MX arm ``name`` again, its MX op computed by the format's reference
    (``mxref.reference_op``): the same forwards or compiled graph, the same quantization."""
    import torch_flydsl

    from . import measure, mxref

    what = f"{name}: reference run, the MX op by the format's specification"
    with progress.phase(what), mxref.reference_op():
        out = measure.Runner(arm.forward, model).greedy(ids, args.gen_len)
    torch_flydsl.reset_stats()  # the reference's calls are not the arm's
    return out


def _mx_format_error(args, model, session, ids, dtype, off_outputs, progress) -> dict:
    """The off arm with its experts on the MX route's quantization in PyTorch, against off:
    the format's own error (reported, not judged)."""
    import torch_flydsl

    from . import measure, mxref

    with progress.phase("mx format: off, experts quantize-dequantized in PyTorch"):
        session.off()  # the next arm's prepare() turns FlyDSL on again
        with torch_flydsl.disabled(), mxref.quantized_experts(model):
            outputs = measure.Runner(model, model).greedy(ids, args.gen_len)
    return {
        "description": "the experts computed on mxfp8 (e4m3) activations and MXFP4 weights, "
        "quantize-dequantized by flydsl_kernels.mx.reference (float64), fp32 GEMMs, bias in "
        "fp32, one rounding to the model dtype",
        "format_error": measure.compare(off_outputs, outputs, dtype, reference="off"),
    }


def _train(args, spec, dtype, device, arm_names, results, progress) -> dict:
    from . import train
    from .arms import compile_backend

    on = [v for v in ("eager", "compile") if v in arm_names] or ["eager"]
    variants = ["off"]
    skipped = {}
    for v in on:
        if v == "compile":
            backend, why = compile_backend()
            if backend is None:
                skipped[v] = why
                continue
        variants.append(v)
    out = train.run(args, spec, dtype, device, variants, progress)
    out["unavailable"] = skipped
    results["arms"]["train"] = {
        "available": True,
        "description": _DESCRIPTIONS["train"],
        **({"error": "a train variant failed or disagrees with off"} if not out["ok"] else {}),
    }
    return out


_DESCRIPTIONS = {
    "off": "transformers as built: ATen everywhere, no FlyDSL",
    "eager": "torch_flydsl.enable() + transformers.patch(model) (RMSNorm with the attention residual "
    "add fused, MoE router and experts) + attn_implementation='flydsl'",
    "compile": "the eager overrides and patch + torch.compile(model, backend='flydsl') (linear "
    "layers, SwiGLU); attention is the model's SDPA call on the SDPA override",
    "train": "AdamW steps FlyDSL off vs on (train.py): loss curves, tokens/s, backward coverage",
}


def _tp_reference(args, ckpt, dtype, device, ids, outputs, mx, rank, progress) -> dict | None:
    """Rank 0 runs the checkpoint unsharded, per arm, and compares the sharded logits with it."""
    from . import arms as arms_mod
    from . import measure, tp

    out = None
    if rank == 0:
        with progress.phase("tp reference: single process"):
            single = tp.load_single(ckpt, dtype, "cpu" if device == "cpu" else device)
            session = arms_mod.Session(single, mx_experts=mx)
            out = {}
            try:
                for name, got in outputs.items():
                    if name not in ("off", "eager"):
                        continue  # compile: the same kernels as eager, compiled again; too slow
                    arm = arms_mod.prepare(name, single, session)
                    ids_s = ids.to(next(single.parameters()).device)
                    ref = measure.Runner(arm.forward, single).greedy(ids_s, args.gen_len)
                    out[name] = measure.compare(ref, got, dtype, reference=f"{name}, one process")
            finally:
                session.close()
    tp.barrier()
    return out


def _machine(dev, torch, transformers, torch_flydsl) -> dict:
    gpu = dev.type == "cuda"
    st = torch_flydsl.status("cuda" if gpu else "cpu")
    return {
        "device": f"{dev} ({torch.cuda.get_device_name(dev)})" if gpu else "cpu",
        "device_kind": "GPU" if gpu else "CPU",
        "arch": st.get("arch"),
        "flydsl_target": st.get("cpu_target") or st.get("arch"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }


def main(argv=None) -> int:
    from rich.console import Console

    try:
        args = parser().parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s %(name)s: %(message)s",
        )
        spec, mx = checked(args)
    except UsageError as e:  # a bad option: one line, before any model is built
        print(f"flydsl-eval: error: {e}", file=sys.stderr)
        return 2
    console = Console(stderr=False)
    results = run(args, console, spec, mx)
    if results.get("rank", 0) == 0:
        from .report import print_console, write_all

        paths = write_all(results, args.out)
        print_console(results, console, paths)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
