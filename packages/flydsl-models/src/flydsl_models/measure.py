"""What an evaluation measures per arm: logits and greedy tokens, prefill / decode speed, a profile.

Decoding is a plain greedy loop over transformers' ``DynamicCache`` (prefill
the prompt, then one token per step), the same loop in every arm, so the
arms differ only in the kernels they run.

Tolerances (``TOLERANCE``), relative to the reference's largest |logit|,
per dtype: a route that keeps transformers' cast order differs from ATen
only in the order of fp32 sums (a last-bit difference that flips a 16-bit
rounding now and then), which grows through the layers. fp32: 1e-4; fp16:
1e-2; bf16: 3e-2 (bf16 keeps 8 mantissa bits, 2^-8 = 0.4% per rounding).
Top-1 agreement must be at least ``TOP1_MIN`` = 99% of the prompt's positions.
A position where the arm's top-1 token is within one unit in the last place
(of the model dtype, at the reference's top logit) of the reference's top-1
counts as agreeing, and is reported as a tie (``top1_ties``): the reference's
logits are rounded to that dtype, so two tokens that close are tied at the
logits' own resolution, and any change of summation order (Inductor's fused
kernels keep fp32 where eager rounds) picks either; with random weights such
ties are common.

Quantized routes (the MX experts: activations to mxfp8 e4m3, weights MXFP4) are
held to the same tolerances, against a reference that applies the same
quantization (``mxref.py``: the off arm with its experts computed on the
quantize-dequantized operands in PyTorch), so the check tests our kernels and
not the format. The format's own error (that reference against the bf16 off
arm) is reported beside it, not judged: e4m3 keeps 3 mantissa bits (up to 6%
per element), and on a random model, whose logits are flat, it flips near-tie
tokens and expert choices.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
TOP1_MIN = 0.99


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cache_kw(model) -> str:
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class Runner:
    """Prefill and decode steps of one arm (``forward``: the model or its compiled form)."""

    def __init__(self, forward, model):
        self.forward = forward
        self.model = model
        self.cache_kw = _cache_kw(model)
        self.device = next(model.parameters()).device

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.no_grad()
    def prefill(self, ids, cache, all_logits=False):
        out = self.forward(
            input_ids=ids,
            use_cache=True,
            logits_to_keep=0 if all_logits else 1,
            **{self.cache_kw: cache},
        )
        return out.logits

    @torch.no_grad()
    def step(self, tokens, cache):
        out = self.forward(
            input_ids=tokens, use_cache=True, logits_to_keep=1, **{self.cache_kw: cache}
        )
        return out.logits[:, -1]

    def greedy(self, ids, n: int):
        """``(prefill logits fp32 [B, P, V], tokens [B, n], step logits fp32 [n, B, V])``."""
        cache = self.new_cache()
        logits = self.prefill(ids, cache, all_logits=True).float()
        last = logits[:, -1]
        tokens, steps = [], []
        for i in range(n):
            steps.append(last)
            tok = last.argmax(-1)
            tokens.append(tok)
            if i + 1 < n:
                last = self.step(tok[:, None], cache).float()
        return logits.cpu(), torch.stack(tokens, 1).cpu(), torch.stack(steps).cpu()

    def timed_generation(self, ids, n: int) -> tuple[float, float]:
        """Seconds for the prefill (last logits only, as generation computes) and for ``n`` steps."""
        cache = self.new_cache()
        _sync(self.device)
        t0 = time.perf_counter()
        last = self.prefill(ids, cache)[:, -1]
        _sync(self.device)
        t1 = time.perf_counter()
        for _ in range(n):
            last = self.step(last.argmax(-1)[:, None], cache)
        _sync(self.device)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1


def timing(runner: Runner, ids, gen_len: int, repeats: int, progress=None) -> dict:
    """Medians over ``repeats`` of prefill and decode (the warm-up is measured separately)."""
    prefill, decode = [], []
    for _ in range(repeats):
        p, d = runner.timed_generation(ids, gen_len)
        prefill.append(p)
        decode.append(d)
        if progress is not None:
            progress()
    b, s = ids.shape
    mp, md = statistics.median(prefill), statistics.median(decode)
    return {
        "repeats": repeats,
        "prefill_s": prefill,
        "decode_s": decode,
        "prefill_median_s": mp,
        "decode_median_s": md,
        "prefill_tokens_per_s": b * s / mp if mp > 0 else None,
        "decode_tokens_per_s": b * gen_len / md if md > 0 and gen_len else None,
    }


def warmup(runner: Runner, ids, steps: int = 2) -> float:
    """Seconds of one prefill and ``steps`` decode steps: first compiles (FlyDSL, torch.compile)."""
    t0 = time.perf_counter()
    runner.timed_generation(ids, steps)
    return time.perf_counter() - t0


def _margin(logits_row: torch.Tensor) -> float:
    top = logits_row.topk(2).values
    return float(top[0] - top[1])


def compare(ref, got, dtype: torch.dtype, *, reference: str = "off") -> dict:
    """Correctness of an arm's greedy outputs ``got`` against ``ref`` (the outputs of the
    arm named ``reference``): errors, margins and the thresholds they are judged by."""
    (rl, rt, rs), (gl, gt, gs) = ref, got
    tol = TOLERANCE.get(dtype, 3e-2)
    diff = (gl - rl).abs()
    scale = float(rl.abs().max()) or 1.0
    max_abs = float(diff.max())
    same_top = gl.argmax(-1) == rl.argmax(-1)
    rf = rl.float()
    top = rf.max(-1).values
    chosen = rf.gather(-1, gl.argmax(-1, keepdim=True)).squeeze(-1)
    exp = torch.floor(torch.log2(top.abs().clamp_min(torch.finfo(dtype).tiny)))
    ulp = torch.finfo(dtype).eps * torch.pow(2.0, exp)
    ties = ~same_top & (top - chosen <= ulp)
    top1 = float((same_top | ties).float().mean())
    out = {
        "reference": reference,
        "logits_max_abs_error": max_abs,
        "logits_max_rel_error": max_abs / scale,
        "logits_ref_max_abs": scale,
        "tolerance_rel": tol,
        "tolerance_basis": str(dtype).replace("torch.", ""),
        "logits_ok": max_abs / scale <= tol,
        "top1_agreement": top1,
        "top1_min": TOP1_MIN,
        "top1_ok": top1 >= TOP1_MIN,
        "top1_ties": int(ties.sum()),
        "top1_flips": int((~same_top & ~ties).sum()),
        "positions": int(same_top.numel()),
        "decode_tokens": int(gt.shape[1]),
    }
    same = (gt == rt).all(0)
    if bool(same.all()):
        out["decode"] = {"identical": True}
    else:
        step = int((~same).nonzero()[0])
        row = int((gt[:, step] != rt[:, step]).nonzero()[0])
        out["decode"] = {
            "identical": False,
            "first_divergence_step": step,
            "batch_row": row,
            "off_token": int(rt[row, step]),
            "arm_token": int(gt[row, step]),
            "off_margin": _margin(rs[step, row]),  # the reference's top-1 minus top-2 logit there
            "arm_margin": _margin(gs[step, row]),
        }
    out["ok"] = out["logits_ok"] and out["top1_ok"]
    return out


@contextlib.contextmanager
def phase(name: str):
    from .coverage import PHASE_PREFIX

    with torch.autograd.profiler.record_function(PHASE_PREFIX + name):
        yield


@contextlib.contextmanager
def profiling(model, *, module_context: bool, device: torch.device):
    """``(prof, marks)``: torch.profiler around the block, with the module ranges, and
    ``marks.overrides`` filled from the stats when it ends."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    import torch_flydsl

    from .coverage import Marks, module_ranges, override_shares

    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    marks = Marks()
    ctx = module_ranges(model) if module_context else contextlib.nullcontext()
    before = torch_flydsl.stats()
    with ctx, tprofile(activities=acts) as prof:
        yield prof, marks
    marks.overrides = override_shares(before, torch_flydsl.stats())


def profile(runner: Runner, ids, steps: int, *, module_context: bool):
    """``(kineto results, marks)`` of one prefill and ``steps`` decode steps, in phase ranges."""
    cache = runner.new_cache()
    with profiling(runner.model, module_context=module_context, device=runner.device) as (
        prof,
        marks,
    ):
        with phase("prefill"):
            last = runner.prefill(ids, cache)[:, -1]
            _sync(runner.device)
        with phase("decode"):
            for _ in range(steps):
                last = runner.step(last.argmax(-1)[:, None], cache)
            _sync(runner.device)
    return prof.profiler.kineto_results, marks
