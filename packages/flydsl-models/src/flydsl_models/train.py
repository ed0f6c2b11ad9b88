"""The ``train`` arm: N optimizer steps of the same model, FlyDSL off and on, loss curves compared.

Every variant builds the model afresh from the same seed, in train mode, and runs
``--train-steps`` AdamW steps (``--train-lr``, betas (0.9, 0.95), no weight decay)
on the same batches of ``corpus``, a synthetic corpus this module makes: sequences
of a seeded Markov chain over a 64-token sub-vocabulary, each token followed by one
of 4 successors. A model learns it within a few steps (the loss falls from
ln(vocab) towards ln(4)), so the curves move and a wrong gradient shows.

Variants (``VARIANTS``; ``on`` ones follow the arms listed beside ``train``):

* ``off``: ATen (inside ``torch_flydsl.disabled()``), the model's own attention.
* ``eager``: everything routed that has a backward, through public APIs:
  ``torch_flydsl.enable()`` (the eager overrides: ``F.rms_norm`` and its backward,
  ``torch._grouped_mm`` forward and backward), attention through
  ``attn_implementation="flydsl"`` (FlyDSL's attention forward and backward), MoE
  experts through transformers' ``"grouped_mm"`` implementation (it calls
  ``torch._grouped_mm``), and the RMSNorm modules torch-flydsl's ``patch``
  recognizes calling ``F.rms_norm``: patch's own RMSNorm route is a forward-only
  custom op, which falls back to ATen when autograd records.
* ``compile``: the eager variant under ``torch.compile(model, backend="flydsl")``:
  the linear layers' GEMMs in the forward and the backward graphs (and the experts'
  ``_grouped_mm``) are rewritten into FlyDSL kernels; attention stays FlyDSL's eager
  call (a graph break around it); RMSNorm inside the graphs is Inductor's.

Agreement (README, "Training tolerance"): the largest relative difference between a
variant's loss and off's over the steps, at most ``TOLERANCE[dtype]``; and the first
step's gradients (every variant starts from the same weights), estimated from random
projections (``sketch``), within ``GRAD_TOLERANCE[dtype]`` as a whole and per parameter.
The loss curves catch a variant that diverges (a NaN, a wrong forward); they barely
move when one gradient is wrong (zeroing every ``q_proj`` gradient of the tiny Llama
moves 8 steps' loss by 1.2e-4), so the gradients are compared directly.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
import types

import torch

log = logging.getLogger("flydsl_models")

VARIANTS = ("off", "eager", "compile")
#: largest relative loss difference against off over the run, per model dtype
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-3}
#: first-step gradients, per model dtype: (the whole gradient's relative difference, the
#: largest relative difference of one parameter's); README, "Training tolerance"
GRAD_TOLERANCE = {
    torch.bfloat16: (5e-2, 0.25),
    torch.float16: (5e-2, 0.25),
    torch.float32: (1e-3, 1e-2),
}
SKETCH = 16  # relative spread of the estimate ~ 1/sqrt(2 * SKETCH) = 18%
SUB_VOCAB = 64
SUCCESSORS = 4
BETAS = (0.9, 0.95)


def corpus(vocab: int, steps: int, batch: int, seq_len: int, seed: int) -> torch.Tensor:
    """``[steps, batch, seq_len]`` token ids: a seeded Markov chain over a sub-vocabulary of
    ``min(64, vocab - 1)`` tokens (never id 0), each with ``SUCCESSORS`` equally likely
    successors."""
    g = torch.Generator().manual_seed(seed)
    n = max(1, min(SUB_VOCAB, vocab - 1))
    tokens = torch.randperm(vocab - 1, generator=g)[:n] + 1
    succ = torch.randint(0, n, (n, SUCCESSORS), generator=g)
    x = torch.empty(steps, batch, seq_len, dtype=torch.long)
    x[:, :, 0] = torch.randint(0, n, (steps, batch), generator=g)
    for i in range(1, seq_len):
        pick = torch.randint(0, SUCCESSORS, (steps, batch), generator=g)
        x[:, :, i] = succ[x[:, :, i - 1], pick]
    return tokens[x]


def _route_norms(model, stack: contextlib.ExitStack) -> list[str]:
    """Point the RMSNorm modules torch-flydsl's ``patch`` recognizes (with ATen's or
    Llama's numerics) at ``F.rms_norm``, whose override has a FlyDSL backward; returns
    their names. ``stack`` restores them."""
    from torch_flydsl.transformers import patch

    p = patch(model, fuse_residual=False, router=False, experts=False)
    names = [r.module for r in p.replaced if r.route == "rms_norm" and "gemma" not in r.detail]
    p.undo()
    mods = dict(model.named_modules())
    for name in names:
        m = mods[name]
        eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))

        def forward(self, x, eps=float(eps)):
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, eps)

        m.forward = types.MethodType(forward, m)
        stack.callback(m.__dict__.pop, "forward", None)
    return names


def _setup(variant: str, model, stack: contextlib.ExitStack) -> tuple[object, list[str]]:
    """``(the callable to train, what was routed)`` for ``variant``."""
    import torch_flydsl
    from torch_flydsl.transformers import ATTENTION_IMPLEMENTATION, register

    from .arms import BACKEND, compile_options

    if variant == "off":
        stack.enter_context(torch_flydsl.disabled())
        return model, []
    dev = "cpu" if next(model.parameters()).device.type == "cpu" else "cuda"
    torch_flydsl.enable(device=dev)
    torch_flydsl.enable(ops=["rms_norm"], device=dev)  # opt-in on the CPU key
    stack.callback(torch_flydsl.disable, device=dev)
    register()
    routes = []
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    routes.append(
        f"attention: attn_implementation={ATTENTION_IMPLEMENTATION!r} (forward and backward)"
    )
    if any(hasattr(m, "num_experts") and hasattr(m, "down_proj") for m in model.modules()):
        model.set_experts_implementation("grouped_mm")
        routes.append(
            "experts: transformers' 'grouped_mm' -> torch._grouped_mm override (forward and backward)"
        )
    norms = _route_norms(model, stack)
    if norms:
        routes.append(
            f"RMSNorm: {len(norms)} modules -> F.rms_norm override (forward and backward)"
        )
    if variant == "eager":
        return model, routes
    routes.append(
        f"torch.compile(backend={BACKEND!r}): GEMMs of the forward and backward graphs; "
        "RMSNorm inside the graphs is Inductor's"
    )
    devtype = next(model.parameters()).device.type
    return torch.compile(model, backend=BACKEND, options=compile_options(devtype)), routes


def _step(fwd, model, opt, batch, grads: dict | None = None) -> float:
    out = fwd(input_ids=batch, labels=batch)
    out.loss.backward()
    if grads is not None:
        grads.update(sketch(model))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(out.loss.detach())


def sketch(model) -> dict[str, list[float]]:
    """``{parameter: [norm, <g, r_1>, ..., <g, r_k>]}`` of the current gradients, ``r_i`` seeded
    Gaussian directions (``SKETCH`` of them, the same for every variant): the gradients' size
    and ``SKETCH`` random projections, from which ``compare_grads`` estimates
    ``||g_on - g_off||`` (``E <d, r>^2 = ||d||^2``) without keeping a copy of them."""
    out = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        if p.grad is None:
            continue
        g = p.grad.detach().float().flatten()
        gen = torch.Generator(device=g.device).manual_seed(1000 + i)
        dots = [
            float(torch.randn(g.numel(), generator=gen, device=g.device) @ g) for _ in range(SKETCH)
        ]
        out[name] = [float(g.norm()), *dots]  # one direction at a time: memory of one gradient
    return out


def compare_grads(off: dict, on: dict, dtype) -> dict:
    """First-step gradients (the same weights in every variant) against off's: the whole
    gradient's relative difference ``||g_on - g_off|| / ||g_off||`` (all parameters as one
    vector), and the largest per parameter; each against its tolerance (``GRAD_TOLERANCE``)."""
    tol_all, tol_one = GRAD_TOLERANCE.get(dtype, GRAD_TOLERANCE[torch.bfloat16])
    worst, where = 0.0, None
    d2 = g2 = 0.0
    missing = sorted(set(off) ^ set(on))
    for name, (n_off, *p_off) in off.items():
        if name not in on:
            continue
        p_on = on[name][1:]
        d = math.sqrt(sum((a - b) ** 2 for a, b in zip(p_on, p_off)) / len(p_off))
        d2 += d * d
        g2 += n_off * n_off
        rel = d / n_off if n_off else (0.0 if d == 0 else float("inf"))
        if not math.isfinite(rel) or rel > worst:
            worst, where = (rel if math.isfinite(rel) else float("inf")), name
    whole = math.sqrt(d2 / g2) if g2 else 0.0
    ok = math.isfinite(whole) and whole <= tol_all and worst <= tol_one and not missing
    return {
        "rel_diff": whole,
        "tolerance_rel": tol_all,
        "max_param_rel_diff": worst,
        "parameter": where,
        "param_tolerance_rel": tol_one,
        "missing": missing,
        "ok": ok,
    }


def _profile_step(fwd, model, opt, batch, module_context: bool):
    """Coverage of one more step (after the compared ones), phases forward / backward /
    optimizer."""
    from . import coverage
    from .measure import phase, profiling

    dev = next(model.parameters()).device
    with profiling(model, module_context=module_context, device=dev) as (prof, marks):
        with phase("forward"):
            out = fwd(input_ids=batch, labels=batch)
        with phase("backward"):
            out.loss.backward()
        with phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    gpu = dev.type == "cuda"
    return coverage.attribute(
        prof.profiler.kineto_results, gpu=gpu, module_context=module_context, marks=marks
    ).as_dict()


def run_variant(variant, spec, dtype, device, data, lr, seed, progress) -> dict:
    """Train a fresh model of ``spec`` on ``data`` (``[steps, B, S]``) as ``variant``."""
    import torch_flydsl

    from . import models

    entry: dict = {"variant": variant}
    with contextlib.ExitStack() as stack:
        with progress.phase(f"train {variant}: build"):
            model = models.build(spec, dtype, device, seed).train()
            fwd, routes = _setup(variant, model, stack)
        entry["routes"] = routes
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS, weight_decay=0.0)
        torch_flydsl.reset_stats()
        losses, times = [], []
        grads: dict = {}
        data = data.to(device)
        warm = " + compile" if variant == "compile" else ""
        with progress.phase(f"train {variant}: {len(data)} steps{warm}", total=len(data)) as ph:
            for batch in data:
                t0 = time.perf_counter()
                losses.append(_step(fwd, model, opt, batch, grads if not losses else None))
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                ph.advance()
        entry["losses"] = losses
        entry["grad_sketch"] = grads
        entry["step_s"] = times
        entry["warmup_s"] = times[0]
        steady = times[1:] or times
        tokens = data.shape[1] * data.shape[2]
        med = statistics.median(steady)
        entry["tokens_per_s"] = tokens / med if med > 0 else None
        entry["stats"] = {k: v for k, v in torch_flydsl.stats().items() if v["calls"]}
        with progress.phase(f"train {variant}: profile a step"):
            entry["coverage"] = _profile_step(
                fwd, model, opt, data[-1], module_context=variant != "compile"
            )
        if variant == "compile":
            torch._dynamo.reset()
    return entry


def compare(off: list[float], on: list[float], dtype) -> dict:
    """The largest relative loss difference over the steps, and whether it is in tolerance."""
    tol = TOLERANCE.get(dtype, 2e-2)
    rel = [abs(b - a) / max(abs(a), 1e-12) for a, b in zip(off, on)]
    finite = all(math.isfinite(x) for x in on)
    worst = max(rel) if rel else 0.0
    return {
        "max_rel_diff": worst if finite else float("inf"),
        "step_of_max": rel.index(worst) + 1 if rel else None,
        "tolerance_rel": tol,
        "ok": finite and worst <= tol,
    }


def run(args, spec, dtype, device, variants, progress) -> dict:
    """The train arm's results: per variant its curve, speed, routes, backward coverage."""
    data = corpus(
        spec.config().get_text_config().vocab_size,
        args.train_steps,
        args.train_batch,
        args.train_seq_len,
        args.seed + 2,
    )
    out = {
        "steps": args.train_steps,
        "batch": args.train_batch,
        "seq_len": args.train_seq_len,
        "lr": args.train_lr,
        "optimizer": f"AdamW(lr={args.train_lr:g}, betas={BETAS}, weight_decay=0)",
        "corpus": f"Markov chain over {SUB_VOCAB} tokens, {SUCCESSORS} successors each (seed {args.seed + 2})",
        "tolerance_rel": TOLERANCE.get(dtype, 2e-2),
        "variants": {},
    }
    for v in variants:
        try:
            out["variants"][v] = run_variant(
                v, spec, dtype, device, data, args.train_lr, args.seed, progress
            )
        except Exception as e:
            if v == "off":
                raise
            log.warning("train variant %s failed", v, exc_info=True)
            out["variants"][v] = {"variant": v, "error": f"{type(e).__name__}: {e}"}
    off = out["variants"]["off"]
    for v, entry in out["variants"].items():
        if v != "off" and "losses" in entry:
            entry["agreement"] = compare(off["losses"], entry["losses"], dtype)
            entry["gradients"] = compare_grads(off["grad_sketch"], entry["grad_sketch"], dtype)
    for entry in out["variants"].values():
        entry.pop("grad_sketch", None)  # compared; too big to keep in results.json
    out["ok"] = all(
        "error" not in e
        and e.get("agreement", {}).get("ok", True)
        and e.get("gradients", {}).get("ok", True)
        for e in out["variants"].values()
    )
    return out
