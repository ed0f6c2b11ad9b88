"""Report cases of the attention family: one per shipped kernel config, at model shapes.

Each case compiles its kernel through the plan (``plan.py``) with ``TensorSpec`` operands
(``model.forward_launches`` / ``backward_launch``), so the report shows exactly what the API
launches; ``check`` runs the function API on fresh random inputs (small shapes on the CPU
backends, a 1k-token slice on a GPU) against the float64 reference; on a GPU ``run`` /
``aten`` time ours and ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch

from flydsl_core import cdiv

from .. import registry
from .._target import check_device, check_target
from . import configs, plan, reference
from .api import flash_attn_func, flash_attn_with_kvcache
from .model import backward_launch, forward_launches

#: (rtol = atol) of outputs against the float64 reference, by input dtype
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _cpu(device):
    return check_target(device) is not None


def _dev(device):
    return check_device(device)


def _check_table(device, target):
    """The table a check plans with: ``target``'s on a CPU device (so its tiles, split counts
    and grids are checked without its GPU), None on a GPU (the API picks the device's)."""
    return target if _cpu(device) else None


def _err(out, ref, dtype=torch.bfloat16) -> float:
    tol = TOLERANCE[dtype]
    o, r = out.detach().double(), ref.detach().double().to(out.device)
    return float(((o - r).abs() / (tol + tol * r.abs())).max()) if o.numel() else 0.0


def _fwd_launch(p: plan.Problem, target, config=None):
    fp = plan.plan_forward(p, target, config=config)
    return fp, forward_launches(fp)


def _inputs(b, sq, sk, h, hk, d, dv, device, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g).to(dtype).to(device)
    k = torch.randn(b, sk, hk, d, generator=g).to(dtype).to(device)
    v = torch.randn(b, sk, hk, dv, generator=g).to(dtype).to(device)
    return q, k, v


def _sdpa(q, k, v, causal):
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(
        qh, kh, vh, is_causal=causal, enable_gqa=q.shape[2] != k.shape[2]
    )


def _prefill_case(name, p: plan.Problem, kind="fwd", model=""):
    left, right = p.window
    kw = {"causal": p.causal, "window_size": (left, right)}
    cfg_kind = {
        "fwd": "fwd",
        "bwd_dkdv": "bwd_dkdv",
        "bwd_dq": "bwd_dq",
        "bwd_preprocess": "bwd_dkdv",
    }[kind]
    dmax = max(p.head_dim, p.head_dim_v)

    def config(target):
        if kind == "bwd_preprocess":
            return {"BM": plan.ROWS_BM}
        return configs.select(cfg_kind, dmax, target).as_dict()

    def launch(target):
        if kind == "fwd":
            return _fwd_launch(p, target)[1][0]
        return backward_launch(p, target, kind)

    def compile_(target):
        return launch(target).compile(target)

    def check(device, target=None):
        # CPU: one KV head with its group (capped at 8) and 77 tokens; GPU: every head, 1k tokens
        if _cpu(device):
            b, sq, h, hk = 1, 77, min(p.group, 8), 1
        else:
            b, sq, h, hk = 1, 1024, p.heads_q, p.heads_k
        q, k, v = _inputs(b, sq, sq, h, hk, p.head_dim, p.head_dim_v, _dev(device), 1)
        sinks = (
            torch.randn(h, generator=torch.Generator().manual_seed(2)).to(q.device)
            if p.sinks
            else None
        )
        grad = kind != "fwd"
        if grad:
            for t in (q, k, v):
                t.requires_grad_()
        out = flash_attn_func(
            q,
            k,
            v,
            sinks=sinks,
            softcap=p.softcap,
            target=check_target(device),
            table=_check_table(device, target),
            **kw,
        )
        ref, _ = reference.attention(
            *(t.detach().double().requires_grad_(grad) for t in (q, k, v)),
            sinks=sinks,
            softcap=p.softcap,
            **kw,
        )
        err = _err(out, ref)
        if grad:
            do = torch.randn_like(out)
            ins = [q, k, v]
            ins64 = [t.detach().double().requires_grad_() for t in ins]
            r64, _ = reference.attention(*ins64, sinks=sinks, softcap=p.softcap, **kw)
            for a, r in zip(
                torch.autograd.grad(out, ins, do), torch.autograd.grad(r64, ins64, do.double())
            ):
                err = max(err, _err(a, r) / 2)  # gradients: twice the output tolerance
        return err

    def run(device):
        q, k, v = _inputs(
            p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_k, p.head_dim, p.head_dim_v, device
        )
        if kind == "fwd":
            return lambda: flash_attn_func(q, k, v, **kw)
        for t in (q, k, v):
            t.requires_grad_()
        out = flash_attn_func(q, k, v, **kw)
        do = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    def aten(device):
        q, k, v = _inputs(
            p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_k, p.head_dim, p.head_dim_v, device
        )
        if kind == "fwd":
            return lambda: _sdpa(q, k, v, p.causal)
        for t in (q, k, v):
            t.requires_grad_()
        out = _sdpa(q, k, v, p.causal)
        do = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    expressible = left < 0 and right < 0 and not p.sinks and not p.softcap
    shape = (
        f"B{p.batch} S{p.seqlen_q}x{p.seqlen_k} H{p.heads_q}/{p.heads_k} D{p.head_dim}"
        + (f"/{p.head_dim_v}" if p.head_dim_v != p.head_dim else "")
        + (" causal" if p.causal else "")
        + (f" window{p.window}" if left >= 0 or right >= 0 else "")
        + (" sinks" if p.sinks else "")
        + (f" softcap{p.softcap:g}" if p.softcap else "")
        + f" {name}"
    )
    kern = {
        "fwd": "attn_fwd_kernel",
        "bwd_dkdv": "attn_bwd_dkdv_kernel",
        "bwd_dq": "attn_bwd_dq_kernel",
        "bwd_preprocess": "attn_bwd_preprocess_kernel",
    }[kind]
    timed = kind in ("fwd", "bwd_dkdv")  # the backward's three kernels are timed once
    return registry.ReportCase(
        family="attention",
        kernel=kern,
        shape=shape,
        config=config,
        compile=compile_,
        check=check,
        run=run if timed else None,
        aten=aten if timed and expressible else None,
        baseline=(
            (lambda d: "SDPA" if kind == "fwd" else "SDPA backward (ours: all 3 kernels)")
            if timed and expressible
            else None
        ),
        notes=f"{model}; static-model default (configs.py), untimed",
    )


def _decode_case(b, ctx, h, hk, d, page, model, splits=None):
    p = plan.Problem(b, 1, ctx, h, hk, d, d, causal=True, seqused=True, page_size=page, decode=True)

    def config(target):
        fp = plan.plan_forward(p, target)
        return {**fp.config.as_dict(), "GP": fp.C.GP, "BM": fp.C.BM, "splits": fp.splits}

    def compile_(target):
        return _fwd_launch(p, target)[1][0].compile(target)

    def inputs(device, bb, cc, seed=0):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(bb, 1, h, d, generator=g).to(torch.bfloat16).to(device)
        npg = cdiv(cc, page)
        kc = torch.randn(bb * npg, page, hk, d, generator=g).to(torch.bfloat16).to(device)
        vc = torch.randn(bb * npg, page, hk, d, generator=g).to(torch.bfloat16).to(device)
        table = torch.randperm(bb * npg, generator=g).view(bb, npg).to(torch.int32).to(device)
        lens = torch.randint(max(cc // 2, 1), cc + 1, (bb,), generator=g).to(torch.int32).to(device)
        return q, kc, vc, table, lens

    def check(device, target=None):
        bb, cc = (2, 300) if _cpu(device) else (min(b, 8), min(ctx, 8192))
        q, kc, vc, table, lens = inputs(_dev(device), bb, cc, 1)
        out = flash_attn_with_kvcache(
            q,
            kc,
            vc,
            cache_seqlens=lens,
            block_table=table,
            causal=True,
            target=check_target(device),
            table=_check_table(device, target),
        )
        kd = kc[table.long()].flatten(1, 2)
        vd = vc[table.long()].flatten(1, 2)
        ref, _ = reference.attention(q, kd, vd, causal=True, seqused_k=lens.cpu())
        return _err(out, ref)

    def run(device):
        q, kc, vc, table, lens = inputs(device, b, ctx)
        return lambda: flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens, block_table=table, causal=True
        )

    def aten(device):
        q, kc, vc, table, _ = inputs(device, b, ctx)
        kd = kc[table.long()].flatten(1, 2)
        vd = vc[table.long()].flatten(1, 2)
        return lambda: _sdpa(q, kd, vd, False)

    return registry.ReportCase(
        family="attention",
        kernel="attn_fwd_kernel",
        shape=f"decode B{b} ctx{ctx} H{h}/{hk} D{d} page{page}",
        config=config,
        compile=compile_,
        check=check,
        run=run,
        aten=aten,
        baseline=lambda d_: "SDPA over the gathered dense cache",
        notes=f"{model}; GQA-packed paged decode, split-KV by configs.splits_for; untimed",
    )


def _combine_case():
    p = plan.Problem(
        1, 1, 131072, 64, 8, 128, 128, causal=True, seqused=True, page_size=64, decode=True
    )

    def compile_(target):
        return _fwd_launch(p, target)[1][1].compile(target)

    def check(device, target=None):
        q, k, v = _inputs(2, 3, 500, 8, 1, 128, 128, _dev(device), 3)
        out = flash_attn_with_kvcache(
            q,
            k,
            v,
            cache_seqlens=torch.tensor([500, 333], dtype=torch.int32, device=q.device),
            num_splits=4,
            target=check_target(device),
            table=_check_table(device, target),
        )
        ref, _ = reference.attention(q, k, v, seqused_k=torch.tensor([500, 333]))
        return _err(out, ref)

    return registry.ReportCase(
        family="attention",
        kernel="attn_combine_kernel",
        shape="split-KV combine, H64 D128 ctx131072",
        config=lambda target: {"BM": plan.ROWS_BM, "splits": plan.plan_forward(p, target).splits},
        compile=compile_,
        check=check,
        notes="the fixed-order merge of split-KV partials (deterministic)",
    )


#: prefill model shapes: (name, Problem, model)
PREFILL = (
    (
        "llama",
        plan.Problem(4, 4096, 4096, 32, 8, 128, 128, causal=True),
        "Llama-3.1-8B prefill, B*S = 16k",
    ),
    ("llama", plan.Problem(4, 4096, 4096, 32, 8, 128, 128), "Llama-3.1-8B, non-causal"),
    (
        "qwen",
        plan.Problem(2, 8192, 8192, 64, 8, 128, 128, causal=True),
        "Qwen3-32B prefill, B*S = 16k",
    ),
    (
        "gpt-oss",
        plan.Problem(4, 4096, 4096, 64, 8, 64, 64, causal=True, window=(127, 0), sinks=True),
        "gpt-oss-120b sliding layer (sinks, window 128)",
    ),
    (
        "d256",
        plan.Problem(4, 4096, 4096, 16, 8, 256, 256, causal=True, softcap=50.0),
        "Gemma-2 style, D256 softcap",
    ),
    (
        "mla",
        plan.Problem(4, 4096, 4096, 32, 32, 192, 128, causal=True),
        "DeepSeek-style 192/128 heads",
    ),
)


def _cases():
    for name, p, model in PREFILL:
        yield _prefill_case(name, p, "fwd", model)
    llama = PREFILL[0][1]
    for kind in ("bwd_preprocess", "bwd_dkdv", "bwd_dq"):
        yield _prefill_case("llama", llama, kind, "Llama-3.1-8B backward")
    gptoss = PREFILL[3][1]
    for kind in ("bwd_dkdv", "bwd_dq"):
        yield _prefill_case("gpt-oss", gptoss, kind, "gpt-oss-120b sliding layer backward")
    yield _decode_case(64, 8192, 32, 8, 128, 16, "Llama-3.1-8B decode, 64 sequences")
    yield _decode_case(1, 131072, 64, 8, 128, 64, "Llama-3.3-70B long-context decode")
    yield _decode_case(256, 1024, 64, 8, 64, 256, "gpt-oss-120b decode, 256 sequences")
    yield _combine_case()


FAMILY = registry.Family(
    "attention",
    _cases,
    description="flash attention: forward, backward, varlen, paged decode with split-KV",
    tags=("attention", "compute-bound"),
)

__all__ = ["FAMILY", "PREFILL", "TOLERANCE"]
