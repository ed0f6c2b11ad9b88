"""``flydsl-eval``: does a transformers model run correctly, and faster, with FlyDSL on?

    uv run flydsl-eval                                   # the default: a small Llama on the CPU
    uv run flydsl-eval --model qwen3-30b-a3b --layers 2 --hidden 256 --experts 16
    uv run flydsl-eval --model llama-3.1-8b --device cuda --arms off,eager,compile
    torchrun --nproc-per-node 2 -m flydsl_models.eval --tp 2 --model ...

For each arm (``arms.py``) it runs greedy decoding and compares logits and
tokens with the ``off`` arm, times prefill and decode (medians of repeats,
warm-up / compile time apart), profiles one generation for op coverage
(``coverage.py``), and writes ``results.json``, ``report.md`` and two plots
to ``--out`` (``report.py``). Exit status 1 when an arm that ran fails its
correctness checks, 0 otherwise (an unavailable arm is reported, not failed).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time

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


def parser() -> argparse.ArgumentParser:
    from .arms import ARMS
    from .models import DEFAULT, PRESETS

    p = argparse.ArgumentParser(
        prog="flydsl-eval",
        description="End-to-end transformers evaluation, FlyDSL on vs off: correctness, speed, op coverage.",
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
        default=",".join(ARMS),
        help=f"comma-separated subset of {','.join(ARMS)} (off is always run)",
    )
    p.add_argument(
        "--mx-experts",
        default="auto",
        choices=("auto", "on", "off"),
        help="MXFP4 experts route: auto = when the model's checkpoint is MXFP4 (gpt-oss)",
    )
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
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _progress(console, disable: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=disable,
        transient=False,
    )


def run(args, console) -> dict:
    """Run the evaluation ``args`` describes; returns the results dict (``report.py``)."""
    import torch
    import transformers

    import torch_flydsl

    from . import arms as arms_mod
    from . import measure, models, tp

    t_start = time.perf_counter()
    dtype = getattr(torch, DTYPES[args.dtype])
    overrides = {n: getattr(args, n) for n, _ in _SIZE_OPTIONS}
    spec = models.resolve(args.model, overrides)
    arm_names = arms_mod.parse(args.arms)
    mx = {"on": True, "off": False}.get(args.mx_experts)  # None: auto
    if mx is None:
        from torch_flydsl.transformers import is_mxfp4

        mx = is_mxfp4(spec.config())
    dist = (
        tp.init(args.tp, args.device)
        if args.tp > 1
        else {"rank": 0, "world": 1, "device": args.device}
    )
    rank, device = dist["rank"], dist["device"]
    if args.threads or not device.startswith("cuda"):
        torch.set_num_threads(args.threads or 1)
    quiet = args.no_progress or rank != 0

    results: dict = {
        "format": "flydsl_models.results/1",
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
    with _progress(console, quiet) as prog:
        build = prog.add_task(f"build {spec.name}", total=1)
        if args.tp > 1:
            ckpt, temporary = tp.shared_checkpoint(spec, dtype, "cpu", args.seed, rank)
            model = tp.load(ckpt, dtype, args.tp)
        else:
            model = models.build(spec, dtype, device, args.seed)
        prog.advance(build)
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

        state: dict = {}
        ref = None
        tp_outputs: dict = {}
        for name in arm_names:
            arm = arms_mod.prepare(name, model, patch_state=state, mx_experts=mx)
            entry = {"available": arm.available, "description": _DESCRIPTIONS[name]}
            results["arms"][name] = entry
            if not arm.available:
                entry["reason"] = arm.reason
                if rank == 0:
                    console.print(f"[yellow]arm {name} unavailable[/]: {arm.reason}")
                continue
            try:
                outputs = _measure_arm(args, name, arm, model, ids, entry, prog)
            except Exception as e:
                if name == "off":
                    raise  # nothing to compare against
                log.warning("arm %s failed", name, exc_info=True)
                entry["error"] = f"{type(e).__name__}: {e}"
                continue
            if name == "off":
                ref = outputs
            else:
                mx_ran = arm.patch is not None and arm.patch.counts()["mx_experts"] > 0
                entry["correctness"] = measure.compare(ref, outputs, dtype, mx=mx_ran)
            if args.tp > 1:
                tp_outputs[name] = outputs
        p = state.pop("patch", None)
        if p is not None:
            p.undo()
        if "compile" in results["arms"] and results["arms"]["compile"]["available"]:
            torch._dynamo.reset()  # the compiled graphs hold guards on the undone forwards
        if args.tp > 1 and args.tp_reference:
            results["tp"]["reference"] = _tp_reference(
                args, ckpt, dtype, device, ids, tp_outputs, mx, rank, prog
            )
    if args.tp > 1:
        tp.finish(ckpt, temporary, rank)
    results["elapsed_s"] = time.perf_counter() - t_start
    results["ok"] = all(
        a.get("correctness", {}).get("ok", True) and "error" not in a
        for a in results["arms"].values()
    ) and all(c["ok"] for c in (results["tp"].get("reference") or {}).values())
    results["rank"] = rank
    return results


def _measure_arm(args, name, arm, model, ids, entry, prog):
    """Warm-up, greedy outputs, timing, profile and stats of one arm into ``entry``."""
    import torch_flydsl

    from . import coverage, measure

    runner = measure.Runner(arm.forward, model)
    torch_flydsl.reset_stats()
    task = prog.add_task(f"{name}: warm-up{' + compile' if name == 'compile' else ''}", total=1)
    entry["warmup_s"] = measure.warmup(runner, ids)
    prog.advance(task)
    task = prog.add_task(f"{name}: greedy decode ({args.gen_len} tokens)", total=1)
    outputs = runner.greedy(ids, args.gen_len)
    prog.advance(task)
    task = prog.add_task(f"{name}: timing", total=args.repeats)
    entry["timing"] = measure.timing(
        runner, ids, args.gen_len, args.repeats, lambda: prog.advance(task)
    )
    task = prog.add_task(f"{name}: profile", total=1)
    context = name != "compile"  # module hooks would be traced into the compiled graph
    events = measure.profile(runner, ids, args.profile_steps, module_context=context)
    gpu = runner.device.type == "cuda"
    entry["coverage"] = coverage.attribute(events, gpu=gpu, module_context=context).as_dict()
    prog.advance(task)
    entry["stats"] = {k: v for k, v in torch_flydsl.stats().items() if v["calls"]}
    if arm.patch is not None:
        entry["routes"] = arm.patch.as_dict()
    return outputs


_DESCRIPTIONS = {
    "off": "transformers as built: ATen everywhere, no FlyDSL",
    "eager": "torch_flydsl.transformers.patch(model): RMSNorm (+ fused attention residual add), MoE router and experts on FlyDSL kernels",
    "compile": "the eager routes + torch.compile(model, backend='flydsl') for the linear layers",
}


def _tp_reference(args, ckpt, dtype, device, ids, outputs, mx, rank, prog) -> dict | None:
    """Rank 0 runs the checkpoint unsharded, per arm, and compares the sharded logits with it."""
    from torch_flydsl.transformers import patch

    from . import measure, tp

    out = None
    if rank == 0:
        task = prog.add_task("tp reference: single process", total=len(outputs))
        single = tp.load_single(ckpt, dtype, "cpu" if device == "cpu" else device)
        out = {}
        for name, got in outputs.items():
            p = patch(single, mx_experts=mx) if name != "off" else None
            ref = measure.Runner(single, single).greedy(
                ids.to(next(single.parameters()).device), args.gen_len
            )
            if p is not None:
                p.undo()
            out[name] = measure.compare(ref, got, dtype, mx=mx and name != "off")
            prog.advance(task)
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

    from .report import print_console, write_all

    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    console = Console(stderr=False)
    try:
        results = run(args, console)
    except ValueError as e:  # a bad option: say what was wrong, no traceback
        console.print(f"[red]flydsl-eval: {e}[/]", soft_wrap=True)
        return 2
    if results.get("rank", 0) == 0:
        paths = write_all(results, args.out)
        print_console(results, console, paths)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
