"""PyTorch references for the attention family (float64 unless told otherwise).

``attention`` is the definition every kernel is checked against: scores in float64, flash-attn's
conventions (bottom-right aligned causal / window masks, softcap before the bias, ALiBi as
``-slope * |i + sk - sq - j|``), attention sinks as an extra logit in the softmax denominator,
score / mask mods as torch functions, rows with no visible key giving a zero output and an LSE
of ``+inf`` (flash-attn's convention, which keeps the backward's ``exp(s - lse)`` at 0).
It is differentiable (autograd gives the reference gradients, sinks included).

``sdpa`` computes the same thing through ``F.scaled_dot_product_attention`` (math backend) with
an additive float mask, for the features SDPA can express (everything but softcap and score
mods; a sink is a zero key and value with the sink as its bias); the tests check the two agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _bias_mask(sq, sk, *, causal, window, alibi, device, b=None):
    """``(visible (sq, sk) bool, bias (H, sq, sk) or None)`` of one sequence."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = sk - sq
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        vis &= j <= i + off + right
    if left >= 0:
        vis &= j >= i + off - left
    bias = None
    if alibi is not None:
        slopes = alibi if alibi.dim() == 1 else alibi[b]
        bias = -slopes.double()[:, None, None] * (i + off - j).abs().double()[None]
    return vis, bias


def _one(q, k, v, scale, causal, window, softcap, alibi, sinks, score_mod, mask_mod, b, lse_log2):
    """One sequence: q (sq, H, D), k/v (sk, Hk, D) -> (out (sq, H, Dv), lse (H, sq))."""
    sq, H, _ = q.shape
    sk, Hk, _ = k.shape
    G = H // Hk
    qh = q.double().transpose(0, 1)  # (H, sq, D)
    kh = k.double().transpose(0, 1).repeat_interleave(G, 0)
    vh = v.double().transpose(0, 1).repeat_interleave(G, 0)
    s = qh @ kh.transpose(-1, -2) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    hi = torch.arange(H, device=q.device)[:, None, None]
    qi = torch.arange(sq, device=q.device)[None, :, None]
    kj = torch.arange(sk, device=q.device)[None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, hi, qi, kj)
    vis, bias = _bias_mask(sq, sk, causal=causal, window=window, alibi=alibi, device=q.device, b=b)
    if bias is not None:
        s = s + bias
    vis = vis[None].expand(H, sq, sk)
    if mask_mod is not None:
        vis = vis & mask_mod(b, hi, qi, kj).expand(H, sq, sk)
    s = s.masked_fill(~vis, float("-inf"))
    if sinks is not None:
        col = sinks.double()[:, None, None].expand(H, sq, 1)
        s = torch.cat([s, col], -1)
    # no key at all (a cache length of 0, no sink): every row is empty (output 0, LSE +inf)
    m = s.amax(-1, keepdim=True) if s.shape[-1] else s.new_full((H, sq, 1), -math.inf)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m).detach()
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    if sinks is not None:
        p = p[..., :-1]
    out = (p @ vh).transpose(0, 1)
    lse = torch.where(
        den[..., 0] > 0, m[..., 0] + torch.log(den[..., 0]), torch.full_like(m[..., 0], math.inf)
    )
    if lse_log2:
        lse = lse / math.log(2)
    return out, lse


def attention(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    score_mod=None,
    mask_mod=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    seqused_k=None,
    lse_log2=False,
):
    """flash-attn semantics in float64: ``(out, lse)``.

    Dense: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hk, D)``; lse ``(B, H, Sq)``. Varlen: packed
    ``(total, H, D)`` with ``cu_seqlens_*``; lse ``(H, total_q)``. ``seqused_k`` (dense only)
    uses the first ``seqused_k[b]`` keys of batch ``b``. ``score_mod(s, b, h, q_idx, kv_idx)``
    and ``mask_mod(b, h, q_idx, kv_idx)`` are torch functions over broadcast index tensors.
    """
    D = q.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    kw = dict(
        scale=scale,
        causal=causal,
        window=tuple(window_size),
        softcap=softcap,
        alibi=alibi_slopes,
        sinks=sinks,
        score_mod=score_mod,
        mask_mod=mask_mod,
        lse_log2=lse_log2,
    )
    if cu_seqlens_q is not None:
        outs, lses = [], []
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(len(cq) - 1):
            o, lse = _one(
                q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]], b=b, **kw
            )
            outs.append(o)
            lses.append(lse)
        H, Dv = q.shape[1], v.shape[-1]
        out = torch.cat(outs, 0) if outs else q.new_zeros(0, H, Dv, dtype=torch.float64)
        lse = torch.cat(lses, 1) if lses else q.new_zeros(H, 0, dtype=torch.float64)
        return out, lse
    B = q.shape[0]
    outs, lses = [], []
    for b in range(B):
        sk = k.shape[1] if seqused_k is None else int(seqused_k[b])
        o, lse = _one(q[b], k[b, :sk], v[b, :sk], b=b, **kw)
        outs.append(o)
        lses.append(lse)
    if not outs:
        H, Sq, Dv = q.shape[2], q.shape[1], v.shape[-1]
        return q.new_zeros(0, Sq, H, Dv, dtype=torch.float64), q.new_zeros(
            0, H, Sq, dtype=torch.float64
        )
    return torch.stack(outs), torch.stack(lses)


def sdpa(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    alibi_slopes=None,
    sinks=None,
):
    """The same as ``attention`` (dense, no softcap or mods) through
    ``F.scaled_dot_product_attention`` on the math backend in float64. Rows with no visible
    key are zeroed (SDPA's math backend leaves them NaN or uniform)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    qh, kh, vh = (t.double().transpose(1, 2) for t in (q, k, v))
    vis, _ = _bias_mask(Sq, Sk, causal=causal, window=window_size, alibi=None, device=q.device)
    mask = torch.zeros(B, H, Sq, Sk, dtype=torch.float64, device=q.device)
    mask = mask.masked_fill(~vis, float("-inf"))
    if alibi_slopes is not None:
        for b in range(B):
            mask[b] += _bias_mask(
                Sq, Sk, causal=causal, window=window_size, alibi=alibi_slopes, device=q.device, b=b
            )[1]
    if sinks is not None:
        # a zero key and a zero value whose bias is the sink: exp(sink) joins the denominator
        kh = torch.cat([kh, kh.new_zeros(B, Hk, 1, D)], 2)
        vh = torch.cat([vh, vh.new_zeros(B, Hk, 1, vh.shape[-1])], 2)
        col = sinks.double()[None, :, None, None].expand(B, H, Sq, 1)
        mask = torch.cat([mask, col], -1)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=Hk != H
        )
    dead = torch.isinf(mask).all(-1) & (mask < 0).all(-1)
    out = out.masked_fill(dead[..., None], 0.0)
    return out.transpose(1, 2)
