"""Gradients w.r.t. the tensors a score mod reads (learned biases), deterministically.

A score mod that reads ``bias[idx(b, h, q, kv)]`` contributes ``dS * d mod / d bias[idx]`` to
``bias.grad[idx]`` for every score element, ``dS = P * (dP - delta)`` the gradient w.r.t. the
modded logit. A ``GradSite`` is one such read: ``fn(score, out, grad_out, b, h, q_idx, kv_idx,
*tensors)`` gives ``grad_out * d mod / d value`` (``grad_out = dS``), and ``deps`` says which of
``(b, h, q_idx, kv_idx)`` the index depends on.

``attn_bwd_mod_grad_kernel`` reduces the contributions over what the index does not depend on,
so the result is a small dense grid over what it does (``(B?, H?, Sq?, Sk?)``, only the
dependent dimensions), with no atomics: a program owns one (query tile, key tile) and the
(batch, head) pairs of its slice of the dependent ones, loops over the independent (batch,
head) pairs in a fixed order, accumulates in registers, and sums its tile over the rows / keys
the index ignores; per-tile partials are summed on the host in a fixed order (``torch.sum``).
The caller scatters the grid into the tensor's gradient through the index (a deterministic
sorted reduction, ``segment_sum``). Grid ``(cdiv(Sq, BM), cdiv(Sk, BN), B? * H?)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import flydsl_core as fly

from .._target import tensor_target
from . import configs
from .backward import _bwd_scores, _load_q1, _load_row
from .common import LOG2E, NEG_INF, _load_kv, chunks
from .plan import Launch, sparse_tiles


class GradSite:
    """One read of a captured tensor in a score mod, for its gradient (see the module doc)."""

    def __init__(self, fn: Callable, deps: tuple, *, name=None):
        if not callable(fn) or len(deps) != 4:
            raise TypeError("GradSite(fn, deps): a function and four bools (b, h, q_idx, kv_idx)")
        self.fn = fn
        self.deps = tuple(bool(d) for d in deps)
        self.name = name or getattr(fn, "__name__", "site")

    def apply(self, score, out, grad_out, b, h, q_idx, kv_idx, tensors):
        ts = [t for t in tensors[:4] if t is not None]
        g = self.fn(score, out, grad_out, b, h, q_idx, kv_idx, *ts)
        return fly.broadcast_to(fly.cast(g, fly.fp32), score.shape)

    def __eq__(self, other):
        return isinstance(other, GradSite) and (self.fn, self.deps) == (other.fn, other.deps)

    def __hash__(self):
        return hash((GradSite, self.fn, self.deps))

    def cache_key(self):
        from flydsl_core.cache import source_fingerprint

        return {"site": source_fingerprint(self.fn), "deps": list(self.deps)}

    def __repr__(self):
        return f"GradSite({self.name}, deps={self.deps})"


@dataclass(frozen=True)
class ModGrad:
    """Compile-time facts of one site's kernel."""

    BM: int
    BN: int
    D: int
    DV: int
    site: Any
    SOFTCAP: bool = False
    score_mod: Any = None
    mask_mod: Any = None
    STATE: bool = False  # a block-state map (0 skipped, 1 partial, 2 full) per (Q, KV) block
    SQ_BLK: int = 0
    SKV_BLK: int = 0
    ALIBI = False  # backward._bwd_scores reads it


@fly.kernel
def attn_bwd_mod_grad_kernel(
    q, k, v, do, ld, part, state, mt0, mt1, mt2, mt3, B, H, Sq, Sk, Hk, G, scale, softcap,
    C: fly.constexpr,
):  # fmt: skip
    """One site's gradient grid, one (query tile, key tile, dependent (b, h)) per program."""
    mt = (mt0, mt1, mt2, mt3)
    BM, BN = C.BM, C.BN
    db, dh, dq, dk = C.site.deps
    qt = fly.program_id(0)
    kt = fly.program_id(1)
    pd = fly.program_id(2)
    i0 = qt * BM
    n0 = kt * BN
    i = i0 + fly.arange(0, BM)
    j = n0 + fly.arange(0, BN)
    rm = i < Sq
    km = j < Sk
    acc = fly.zeros((BM, BN), fly.fp32)
    HD = H if dh else 1
    nb = 1 if db else B
    nh = 1 if dh else H

    def tile(b, h):
        hk = h // G
        g = h % G
        qts = [_load_q1(q, b, i0, hk, g, c0, cs, BM, C.D, rm) for c0, cs in chunks(C.D)]
        dots = [_load_q1(do, b, i0, hk, g, c0, cs, BM, C.DV, rm) for c0, cs in chunks(C.DV)]
        lrow = _load_row(ld, b, hk, g, 0, i0, BM, rm)
        drow = _load_row(ld, b, hk, g, 1, i0, BM, rm)
        s = None
        for (c0, cs), qtl in zip(chunks(C.D), qts):
            kt_ = _load_kv(k, b, n0, hk, c0, cs, BN, C.D, 0, None, km)
            d_ = fly.dot(qtl, kt_.T)
            s = d_ if s is None else s + d_
        z, zin = _bwd_scores(s, C, scale, softcap, None, i[:, None], j[None, :], 0, b, h, mt)
        vis = rm[:, None] & km[None, :]
        if C.mask_mod is not None:
            mm = C.mask_mod.apply(b, h, i[:, None], j[None, :], mt)
            if C.STATE:
                st = state[b, h, i0 // C.SQ_BLK, n0 // C.SKV_BLK].load()
                mm = mm | (st == 2)
            vis = vis & mm
        z = fly.where(vis, z, NEG_INF)
        p = fly.exp2(z - lrow[:, None])
        dp = None
        for (c0, cs), dt in zip(chunks(C.DV), dots):
            vt = _load_kv(v, b, n0, hk, c0, cs, BN, C.DV, 0, None, km)
            d_ = fly.dot(dt, vt.T)
            dp = d_ if dp is None else dp + d_
        ds = p * (dp - drow[:, None])
        _, z1, z2 = zin
        c = C.site.apply(z1, z2, ds, b, h, i[:, None], j[None, :], mt)
        acc.set(acc + fly.where(vis, c, 0.0))

    for bl in fly.range(0, nb):
        for hl in fly.range(0, nh):
            b = pd // HD if db else bl
            h = pd % HD if dh else hl
            if C.STATE:
                st = state[b, h, i0 // C.SQ_BLK, n0 // C.SKV_BLK].load()
                with fly.if_(st != 0):
                    tile(b, h)
            else:
                tile(b, h)

    if dq and dk:
        part[pd, fly.ds(i0, BM), fly.ds(n0, BN)].store(acc, rm[:, None] & km[None, :])
    elif dq:
        part[kt, pd, fly.ds(i0, BM)].store(fly.sum(acc, 1), rm)
    elif dk:
        part[qt, pd, fly.ds(n0, BN)].store(fly.sum(acc, 0), km)
    else:
        total = fly.sum(fly.sum(acc, 1), 0)
        part[qt, kt, fly.ds(pd, 1)].store(fly.broadcast_to(total, (1,)))


def site_grids(dout, q, k, v, out, lse, sites, *, softmax_scale, softcap=0.0, score_mod=None,
               mask_mod=None, mod_tensors=(), block_state=None, dlse=None, target=None,
               table=None) -> list:  # fmt: skip
    """Per site, the dense gradient grid over its dependent dimensions (``(B, H, Sq, Sk)`` with
    the others left out), fp32. Tensors in flash-attn's layout: q/do/out ``(B, Sq, H, D)``,
    k/v ``(B, Sk, Hk, D)`` (any strides, batch broadcast by stride 0 allowed), ``lse``
    ``(B, H, Sq)`` natural log (``+inf`` for rows with no visible key), ``dlse`` its gradient
    (folded into delta). ``block_state``: ``(state (B, H, Q blocks, KV blocks) int32, (BQ,
    BKV))`` of a BlockMask (0 skipped, 1 partial: the mask mod decides, 2 full)."""
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    DV = v.shape[-1]
    G = H // Hk
    tgt = tensor_target(q, target)
    from .._target import table_target

    tbl = table if table is not None else table_target(q, target)
    cfg = configs.select("bwd_dq", max(D, DV), tbl)
    state, blk = (None, (0, 0)) if block_state is None else block_state
    if state is not None:
        cfg = sparse_tiles(cfg, blk)
    BM, BN = cfg.BM, cfg.BN
    # the backward's per-row terms: the LSE in base 2 and delta (minus the LSE's gradient)
    ld = torch.empty((B, Hk, G, 2, Sq), dtype=torch.float32, device=q.device)
    lse_ = lse.float().view(B, Hk, G, Sq)
    ld[:, :, :, 0] = lse_ * LOG2E
    delta = (dout.float() * out.float()).sum(-1).permute(0, 2, 1).reshape(B, Hk, G, Sq)
    if dlse is not None:
        delta = delta - dlse.float().reshape(B, Hk, G, Sq)
    ld[:, :, :, 1] = delta
    q5 = q.unflatten(2, (Hk, G))
    do5 = dout.to(q.dtype).unflatten(2, (Hk, G))
    mt = tuple(mod_tensors) + (None,) * (4 - len(mod_tensors))
    nq, nk = -(-Sq // BM), -(-Sk // BN)
    grids = []
    for site in sites:
        db, dh, dq, dk = site.deps
        npd = (B if db else 1) * (H if dh else 1)
        if dq and dk:
            part = torch.zeros((npd, Sq, Sk), dtype=torch.float32, device=q.device)
        elif dq:
            part = torch.zeros((nk, npd, Sq), dtype=torch.float32, device=q.device)
        elif dk:
            part = torch.zeros((nq, npd, Sk), dtype=torch.float32, device=q.device)
        else:
            part = torch.zeros((nq, nk, npd), dtype=torch.float32, device=q.device)
        C = ModGrad(
            BM=BM, BN=BN, D=D, DV=DV, site=site, SOFTCAP=bool(softcap), score_mod=score_mod,
            mask_mod=mask_mod, STATE=state is not None, SQ_BLK=blk[0], SKV_BLK=blk[1],
        )  # fmt: skip
        args = (q5, k, v, do5, ld, part, state, *mt, B, H, Sq, Sk, Hk, G, float(softmax_scale),
                float(softcap) if softcap else 1.0)  # fmt: skip
        if B and H and Sq and Sk:
            Launch(attn_bwd_mod_grad_kernel, (nq, nk, npd), args, {"C": C},
                   cfg.options(tgt)).run(tgt)  # fmt: skip
        if dq and dk:
            grid = part
        elif dq or dk:
            grid = part.sum(0)
        else:
            grid = part.sum((0, 1))
        shape = [n for n, d in zip((B, H, Sq, Sk), site.deps) if d]
        grids.append(grid.reshape(shape))
    return grids


@fly.kernel
def segment_sum_kernel(vals, starts, out, N, BS: fly.constexpr):
    """``out[s] = sum(vals[starts[s]:starts[s + 1]])`` in order, ``BS`` segments per program."""
    s0 = fly.program_id(0) * BS
    s = s0 + fly.arange(0, BS)
    m = s < N
    lo = starts[s].load(m, 0)
    hi = starts[s + 1].load(m, 0)
    acc = fly.zeros((BS,), fly.fp32)
    longest = fly.max(hi - lo, 0)
    for t in fly.range(0, longest):
        live = (lo + t) < hi
        acc.set(acc + vals[lo + t].load(live, 0.0).to(fly.fp32))
    out[fly.ds(s0, BS)].store(acc, m)


def segment_sum(values, index, size, *, target=None):
    """``out[n] = sum of values[e] where index[e] == n`` (``out`` of ``size`` elements, fp32),
    in a fixed order: a stable sort by index, then each segment summed in order by
    ``segment_sum_kernel`` (no atomics; the same bits every run)."""
    values = values.reshape(-1).float()
    index = index.reshape(-1).long()
    out = torch.zeros(size, dtype=torch.float32, device=values.device)
    if values.numel() == 0 or size == 0:
        return out
    order = torch.sort(index, stable=True)
    sv = values[order.indices].contiguous()
    counts = torch.bincount(order.values, minlength=size)
    starts = torch.zeros(size + 1, dtype=torch.int32, device=values.device)
    starts[1:] = torch.cumsum(counts, 0).to(torch.int32)
    tgt = tensor_target(values, target)
    BS = 64
    Launch(segment_sum_kernel, (math.ceil(size / BS),), (sv, starts, out, size),
           {"BS": BS}, {"num_warps": 4}).run(tgt)  # fmt: skip
    return out


__all__ = [
    "GradSite",
    "ModGrad",
    "attn_bwd_mod_grad_kernel",
    "segment_sum",
    "segment_sum_kernel",
    "site_grids",
]
