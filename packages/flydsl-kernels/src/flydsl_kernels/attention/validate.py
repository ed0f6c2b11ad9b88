"""Checks of the attention API's numbers and index tensors, before any launch.

The kernels trust every index they read: ``cu_seqlens_*`` offsets, ``block_table`` page ids,
``cache_seqlens`` and ``cache_batch_idx`` (their loads and stores carry no bounds check, so
that sizes do not stay live in scalar registers). A bad one would read or write outside the
operands, so each is checked here first, and the error names the argument, says what was
wrong and what is supported:

* ``TypeError``: a wrong type or dtype (``softcap="5"``, ``cu_seqlens_q`` int64);
* ``ValueError``: a wrong shape or value (``cu_seqlens_k`` decreasing, ``max_seqlen_q`` below
  the longest sequence, ``cache_seqlens`` negative, ``softcap=nan``);
* ``IndexError``: an index outside what it indexes (a ``block_table`` page id past the pool,
  a ``cache_batch_idx`` past the cache's batch), as torch's indexing raises;
* ``RuntimeError``: ``cache_seqlens`` (plus the appended ``k``/``v``) past the cache's
  capacity, flash-attn's own check and type (``mha_fwd_kvcache``), naming ``block_table`` for
  a paged cache and ``k_cache`` for a dense one; ``k``/``v`` appended without
  ``cache_seqlens`` (flash-attn's "seqlens_k must also be passed in").

Where the values are read. Shapes, dtypes and devices are checked on every call, for free.
Index *values* are read on the host where that costs no device sync: tensors on the CPU (the
CPU backends; Python ints from ``tolist``, a few microseconds). Tensors on a GPU are not
copied to the host, except where flash-attn itself syncs (``flash_attn_with_kvcache`` with a
paged cache reads ``max(cache_seqlens)``): there the checks reduce to a few flags on the
device, read back in that one sync, and a failure re-runs the host checks on a copy for the
message. Everywhere else on a GPU (varlen, a dense cache, and any call while a CUDA graph is
captured) the flags feed ``torch._assert_async``: no host sync, and a bad index stops the
stream with a device-side assert before any attention kernel reads it. Meta and fake tensors
(shape propagation) have no values to check.
"""

from __future__ import annotations

import math
import operator

import torch

from flydsl_core import cdiv

from .. import supported
from . import configs
from .index_check import BLOCK as INDEX_BLOCK
from .index_check import paged_index_check_kernel
from .mods import MAX_MOD_TENSORS, as_mask_mod, as_score_mod

SUPPORTED_DTYPES = supported.ATTENTION
MAX_HEAD_DIM = supported.ATTENTION_MAX_HEAD_DIM
#: read CPU index tensors on the host (tests turn it off to run the device path on the CPU)
HOST_VALUES = True
_INT32_MAX = 2**31 - 1


# -- numbers -----------------------------------------------------------------------------------------


def real(x, name: str, what: str, *, none_ok: bool = False) -> float | None:
    """``x`` as a float: an int, a float or a 0-d tensor (not a bool or a string)."""
    if x is None and none_ok:
        return None
    if isinstance(x, (bool, str, bytes)) or not hasattr(x, "__float__"):
        raise TypeError(f"{what}: {name} must be a float, got {type(x).__name__} {x!r}")
    if isinstance(x, torch.Tensor) and x.numel() != 1:
        raise TypeError(f"{what}: {name} must be a float, got a tensor of shape {list(x.shape)}")
    return float(x)


def softmax_scale(x, what: str) -> float | None:
    """None (``1 / sqrt(head_dim)``) or a finite float; zero and below are legal (uniform and
    inverted attention, as SDPA computes them)."""
    s = real(x, "softmax_scale", what, none_ok=True)
    if s is not None and not math.isfinite(s):
        raise ValueError(f"{what}: softmax_scale must be finite (or None for 1/sqrt(d)), got {s}")
    return s


def softcap(x, what: str) -> float:
    """A finite float >= 0 (0 disables it)."""
    c = real(x, "softcap", what)
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"{what}: softcap must be a finite float >= 0 (0 disables it), got {c}")
    return c


def integer(x, name: str, what: str, *, lo: int = 0) -> int:
    """``x`` as an int >= ``lo`` (an int, or anything with ``__index__``; not a bool)."""
    try:
        if isinstance(x, bool):
            raise TypeError
        n = operator.index(x)
    except TypeError:
        raise TypeError(f"{what}: {name} must be an int, got {type(x).__name__} {x!r}") from None
    if n < lo:
        raise ValueError(f"{what}: {name} must be >= {lo}, got {n}")
    return n


def window(window_size, sq: int, sk: int, what: str) -> tuple[int, int]:
    """flash-attn's ``(left, right)``: ints >= -1 (-1 unbounded). A bound that hides no key
    (``left >= sk - 1``, ``right >= sq - 1`` for the longest ``sq`` / ``sk``) is unbounded, so
    any int, 2**31 included, is taken, and the kernels' int32 window arithmetic cannot
    overflow."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(
            f"{what}: window_size must be a pair of ints, got {window_size!r}"
        ) from None
    left = integer(left, "window_size[0]", what, lo=-1)
    right = integer(right, "window_size[1]", what, lo=-1)
    if left >= max(sk - 1, 0):
        left = -1
    if right >= max(sq - 1, 0):
        right = -1
    return left, right


def config(cfg, what: str, *, forward_only: bool = False):
    """``(forward kwargs, backward kwargs)`` of ``config``: None, a ``configs.Config`` (the
    forward's) or a dict with keys ``fwd`` / ``bwd_dkdv`` / ``bwd_dq`` of Configs."""
    if cfg is None:
        return {}, {}
    if isinstance(cfg, configs.Config):
        return {"config": cfg}, {}
    keys = ("fwd",) if forward_only else ("fwd", "bwd_dkdv", "bwd_dq")
    if isinstance(cfg, dict):
        bad = [k for k in cfg if k not in ("fwd", "bwd_dkdv", "bwd_dq")]
        wrong = [k for k, c in cfg.items() if c is not None and not isinstance(c, configs.Config)]
        if not bad and not wrong:
            return {"config": cfg.get("fwd")}, {
                "dkdv_config": cfg.get("bwd_dkdv"),
                "dq_config": cfg.get("bwd_dq"),
            }
        why = f"unknown keys {bad}" if bad else f"{wrong[0]!r} is {type(cfg[wrong[0]]).__name__}"
        raise TypeError(
            f"{what}: config must be None, an attention.configs.Config or a dict of them with "
            f"keys {', '.join(keys)}; got a dict with {why}"
        )
    raise TypeError(
        f"{what}: config must be None, an attention.configs.Config or a dict of them with keys "
        f"{', '.join(keys)}; got {type(cfg).__name__} {cfg!r}"
    )


# -- tensor operands -------------------------------------------------------------------------------


def dropout(dropout_p):
    if dropout_p:
        raise NotImplementedError(
            f"FlyDSL attention does not implement dropout (dropout_p={dropout_p}); it supports "
            "dropout_p=0.0 only (inference, and training without attention dropout)"
        )


def qkv(q, k, v, what, rank):
    for n, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: {n} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{what} supports bf16, fp16 and fp32 q, k, v; {n} is {t.dtype}")
        if t.dim() != rank:
            raise ValueError(f"{what}: {n} must be {rank}-D, got shape {list(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{what}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{what}: q, k, v must be on one device")
    H, Hk = q.shape[-2], k.shape[-2]
    if v.shape[-2] != Hk:
        raise ValueError(f"{what}: k has {Hk} heads, v {v.shape[-2]}")
    if Hk == 0 or H % Hk:
        raise ValueError(
            f"{what}: nheads ({H}) must be a multiple of nheads_k ({Hk}) (MHA, GQA or MQA)"
        )
    D, Dv = q.shape[-1], v.shape[-1]
    if k.shape[-1] != D:
        raise ValueError(f"{what}: q has head dim {D}, k {k.shape[-1]}")
    if not (0 < D <= MAX_HEAD_DIM and 0 < Dv <= MAX_HEAD_DIM):
        raise ValueError(
            f"{what}: head dims up to {MAX_HEAD_DIM} are supported, got q/k {D} and v {Dv}"
        )


def alibi(alibi_slopes, batch, H, Hk, device):
    """flash-attn's ``(nheads,)`` or ``(batch, nheads)`` fp32 slopes as ``(batch, Hk, G)``."""
    if alibi_slopes is None:
        return None
    a = alibi_slopes
    if a.dtype != torch.float32 or a.device != device:
        raise TypeError(
            f"alibi_slopes must be fp32 on the inputs' device, got {a.dtype} on {a.device}"
        )
    if tuple(a.shape) == (H,):
        a = a[None].expand(batch, H)
    elif tuple(a.shape) != (batch, H):
        raise ValueError(
            f"alibi_slopes must be (nheads,) = ({H},) or (batch, nheads) = ({batch}, {H}), "
            f"got {list(a.shape)}"
        )
    return a.unflatten(1, (Hk, H // Hk))


def sinks(sinks, H, Hk, device):
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise TypeError("sinks must be a float tensor of shape (nheads,)")
    if tuple(sinks.shape) != (H,) or sinks.device != device:
        raise ValueError(
            f"sinks must be (nheads,) = ({H},) on the inputs' device, got {list(sinks.shape)}"
        )
    return sinks.unflatten(0, (Hk, H // Hk))[None]


def mods(score_mod, mask_mod, mod_tensors, device):
    sm, mm = as_score_mod(score_mod), as_mask_mod(mask_mod)
    mt = tuple(mod_tensors or ())
    if len(mt) > MAX_MOD_TENSORS:
        raise ValueError(f"at most {MAX_MOD_TENSORS} mod_tensors, got {len(mt)}")
    for t in mt:
        if not isinstance(t, torch.Tensor) or t.device != device:
            raise TypeError("mod_tensors must be tensors on the inputs' device")
    return sm, mm, mt


def paged_cache(k_cache, v_cache, block_table, batch, device, what) -> int:
    """The page size of a paged cache ``(num_pages, page_size, nheads_k, d)``, after the
    shapes of the cache and its ``block_table (batch, max_pages)`` int32."""
    if k_cache.dim() != 4:
        raise ValueError(
            f"{what}: a paged k_cache is (num_pages, page_size, nheads_k, d), got "
            f"{list(k_cache.shape)}"
        )
    if v_cache.dim() != 4 or v_cache.shape[:2] != k_cache.shape[:2]:
        raise ValueError(
            f"{what}: a paged v_cache has k_cache's pages and page size, (num_pages, "
            f"page_size) = {tuple(k_cache.shape[:2])}; got {list(v_cache.shape)}"
        )
    int32_tensor(block_table, "block_table", what, (batch, None), device, "(batch, max_pages)")
    P = k_cache.shape[1]
    if P < 1 or P & (P - 1):
        raise ValueError(
            f"{what}: paged KV cache: page sizes that are powers of two are supported (16 to "
            f"256 tested), got {P}"
        )
    return P


def cache_seqlens(cache_seqlens, B, sk_max, snew, device, what):
    """``(seqlens (B,) int32 for the kernels, the same as an int or None where it is one)``."""
    if cache_seqlens is None:
        if snew:
            raise RuntimeError(
                f"{what}: appending k and v needs cache_seqlens (where each sequence's new "
                "tokens go); got None"
            )
        n = sk_max
    elif isinstance(cache_seqlens, torch.Tensor):
        return int32_tensor(cache_seqlens, "cache_seqlens", what, (B,), device, "(batch,)"), None
    else:
        n = integer(cache_seqlens, "cache_seqlens", what)
    return torch.full((B,), n, dtype=torch.int32, device=device), n


# -- index tensors: structure ------------------------------------------------------------------------


def int32_tensor(t, name: str, what: str, shape: tuple, device, desc: str) -> torch.Tensor:
    """``t`` an int32 tensor of ``shape`` (entries None: any size) on ``device``; ``desc``
    names the dimensions in the message."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: {name} must be an int32 tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{what}: {name} must be an int32 tensor, got {t.dtype}")
    if t.dim() != len(shape) or any(n is not None and t.shape[i] != n for i, n in enumerate(shape)):
        want = ", ".join("*" if n is None else str(n) for n in shape)
        raise ValueError(
            f"{what}: {name} must have shape {desc} = ({want}{',' * (len(shape) == 1)}), got "
            f"{list(t.shape)}"
        )
    if t.device != device:
        raise ValueError(f"{what}: {name} is on {t.device}, the inputs on {device}")
    return t


def _has_values(t: torch.Tensor) -> bool:
    """Not a meta or fake tensor (shape propagation: there are no values to check)."""
    if type(t) is torch.Tensor:  # the common case, without the fake-tensor test's 2 us
        return not t.is_meta
    from torch._subclasses.fake_tensor import is_fake

    return not (t.is_meta or is_fake(t))


def _on_host(t: torch.Tensor) -> bool:
    return HOST_VALUES and t.is_cpu


# -- index tensors: values on the host ---------------------------------------------------------------


def _cu_host(c: list, name: str, total, max_name: str, max_s: int, what: str) -> list:
    """The per-sequence lengths of cumulative offsets ``c`` (a list), after flash-attn's rules."""
    if c[0] != 0:
        raise ValueError(f"{what}: {name}[0] must be 0 (cumulative sequence offsets), got {c[0]}")
    if c != sorted(c):  # linear on sorted input, in C: the cheapest full check
        i = next(i for i in range(1, len(c)) if c[i] < c[i - 1])
        raise ValueError(
            f"{what}: {name} must be non-decreasing (cumulative sequence offsets); "
            f"{name}[{i}] = {c[i]} is below {name}[{i - 1}] = {c[i - 1]}"
        )
    if total is not None and c[-1] != total:
        raise ValueError(
            f"{what}: {name}[-1] must equal the total tokens {total} (the inputs' first "
            f"dimension), got {c[-1]}"
        )
    lens = list(map(operator.sub, c[1:], c))
    longest = max(lens, default=0)
    if longest > max_s:
        b = lens.index(longest)
        raise ValueError(
            f"{what}: {max_name} = {max_s} is below the longest sequence of {name} "
            f"({longest} tokens, sequence {b}); give at least {longest}"
        )
    return lens


def _capacity_host(lens: list, snew: int, cap: int, paged: bool, what: str, scalar=False):
    """``lens`` (per sequence, or ``scalar``: one int for all) >= 0 and ``+ snew <= cap``."""
    if lens and min(lens) < 0:
        b = next(b for b, n in enumerate(lens) if n < 0)
        name = "cache_seqlens" if scalar else f"cache_seqlens[{b}]"
        raise ValueError(f"{what}: cache_seqlens must be >= 0, got {name} = {lens[b]}")
    top = max(lens, default=0) + snew
    if top > cap:
        b = lens.index(top - snew)
        name = "cache_seqlens" if scalar else f"cache_seqlens[{b}]"
        got = f"{name} = {top - snew}" + (f" + {snew} appended tokens = {top}" if snew else "")
        if paged:
            raise RuntimeError(
                f"{what}: paged KV cache: {got} exceeds the capacity addressable by "
                f"block_table ({cap} = max_pages * page_size); allocate more columns in "
                "block_table"
            )
        raise RuntimeError(
            f"{what}: {got} exceeds the capacity of k_cache / v_cache ({cap} positions per "
            "sequence, their dimension 1)"
        )


def _pages_host(bt: torch.Tensor, lens: list, page: int, pool: int, what: str) -> None:
    """Every page id a sequence of ``lens[b]`` keys reads: in ``[0, pool)``. The whole table
    is checked first (one ``aminmax``); rows padded past their pages (-1, say) take the exact
    per-row check."""
    if bt.numel() == 0 or not lens:
        return
    lo, hi = torch.aminmax(bt)
    if lo.item() >= 0 and hi.item() < pool:
        return
    need = [cdiv(n, page) for n in lens]
    hit = None
    if bt.numel() <= 4096:  # Python over the rows' used entries: a few us
        hit = next(
            (
                (b, j)
                for b, row in enumerate(bt.tolist())
                for j, pid in enumerate(row[: need[b]])
                if not 0 <= pid < pool
            ),
            None,
        )
    else:  # a big padded table: a handful of tensor ops instead of a Python loop over it
        dev = bt.device  # the table's (a GPU's): a CPU index would not mix with it
        cols = (
            torch.arange(bt.shape[1], device=dev)[None, :] < torch.tensor(need, device=dev)[:, None]
        )
        bad = (cols & ((bt < 0) | (bt >= pool))).nonzero()
        hit = tuple(bad[0].tolist()) if bad.numel() else None
    if hit is not None:
        b, j = hit
        raise IndexError(
            f"{what}: block_table[{b}, {j}] = {int(bt[b, j])} is not a page of the cache "
            f"(page ids are 0 to {pool - 1}: the first dimension of k_cache / v_cache); "
            f"sequence {b} reads its first {need[b]} entries"
        )


def _batch_idx_host(idx: list, n: int, what: str) -> None:
    for b, x in enumerate(idx):
        if not 0 <= x < n:
            raise IndexError(
                f"{what}: cache_batch_idx[{b}] = {x} is outside the cache's batch (0 to "
                f"{n - 1}: the first dimension of k_cache / v_cache)"
            )


# -- index tensors: values on the device -------------------------------------------------------------


def _cu_flags(cu, total, max_s, flags):
    d = cu.diff()
    flags.append(cu[0] != 0)
    if d.numel():
        lo, hi = torch.aminmax(d)
        flags += [lo < 0, hi > max_s]
    if total is not None:
        flags.append(cu[-1] != total)


def _pages_flags(bt, lens, snew, page, pool, flags):
    """``lens``: the ``(B,)`` key counts before the ``snew`` appended tokens, or one int."""
    if bt.numel() == 0:
        return
    if isinstance(lens, int):
        used = bt[:, : cdiv(lens + snew, page)]
        flags.append(((used < 0) | (used >= pool)).any())
        return
    need = torch.div(lens + (snew + page - 1), page, rounding_mode="floor")
    cols = torch.arange(bt.shape[1], device=bt.device)[None, :] < need[:, None]
    flags.append((cols & ((bt < 0) | (bt >= pool))).any())


def _settle(flags, sync: bool, recheck, what: str) -> None:
    """Device flags (True: broken): read back in one sync and re-checked on the host for the
    message, or asserted on the device with no sync."""
    if not flags:
        return
    bad = torch.stack([f.reshape(()) for f in flags]).any()
    capturing = bad.is_cuda and torch.cuda.is_current_stream_capturing()
    if sync and not capturing:
        if bool(bad):
            recheck()
            raise AssertionError("unreachable: the device and host checks disagree")
        return
    torch._assert_async(
        ~bad,
        f"{what}: an index input (cu_seqlens, max_seqlen, cache_seqlens, cache_batch_idx or "
        "block_table) breaks its rule; move the index tensors to the CPU to get the exact "
        "error, or see docs/errors.md",
    )


# -- the checks each function runs -------------------------------------------------------------------


def varlen(
    cu_q, cu_k, max_q, max_k, total_q, total_k, what, *, block_table=None, page=0, pool=0
) -> None:
    """``cu_seqlens_q`` / ``cu_seqlens_k`` (validated int32 ``(B + 1,)`` tensors): start at 0,
    non-decreasing, end at the total tokens (``total_k`` None: a paged cache, no total), no
    sequence longer than ``max_seqlen_*``; with a paged cache, each sequence's pages in the
    pool and within ``block_table``'s columns."""
    if not _has_values(cu_q):
        return
    if _on_host(cu_q):
        _cu_host(cu_q.tolist(), "cu_seqlens_q", total_q, "max_seqlen_q", max_q, what)
        lens = _cu_host(cu_k.tolist(), "cu_seqlens_k", total_k, "max_seqlen_k", max_k, what)
        if block_table is not None:
            cap = block_table.shape[1] * page
            if max(lens, default=0) > cap:
                b = lens.index(max(lens))
                raise RuntimeError(
                    f"{what}: paged KV cache: sequence {b} has {lens[b]} keys (cu_seqlens_k), "
                    f"past the capacity addressable by block_table ({cap} = max_pages * "
                    f"page_size); allocate more columns in block_table"
                )
            _pages_host(block_table, lens, page, pool, what)
        return
    flags: list = []
    _cu_flags(cu_q, total_q, max_q, flags)
    _cu_flags(cu_k, total_k, max_k, flags)
    if block_table is not None:
        lens_t = cu_k.diff()
        if lens_t.numel():
            flags.append(lens_t.max() > block_table.shape[1] * page)
        _pages_flags(block_table, lens_t, 0, page, pool, flags)
    _settle(flags, False, None, what)


def kvcache(
    seqlens,
    snew,
    cap,
    what,
    *,
    block_table=None,
    page=0,
    pool=0,
    batch_idx=None,
    batch_cache=0,
    batch=0,
    target=None,
) -> None:
    """``cache_seqlens`` (a validated ``(B,)`` int32 tensor, or one int for every sequence of
    the ``batch``): >= 0 and, with ``snew`` appended tokens, within ``cap`` positions; the pages
    those positions read (paged) and the ``cache_batch_idx`` entries (dense) in range. A paged
    cache on a GPU syncs once, as flash-attn does. ``target`` is the call's: the check's kernel
    runs where the attention kernels do (the default target of a machine with a GPU is the
    GPU's, wrong for index tensors on the CPU)."""
    paged = block_table is not None
    probe = block_table if paged else batch_idx if batch_idx is not None else seqlens
    if isinstance(probe, torch.Tensor) and not _has_values(probe):
        return

    def host(seqlens=seqlens, block_table=block_table, batch_idx=batch_idx):
        scalar = isinstance(seqlens, int)
        lens = [seqlens] * batch if scalar else seqlens.tolist()
        _capacity_host(lens, snew, cap, paged, what, scalar)
        if paged:
            _pages_host(block_table, [n + snew for n in lens], page, pool, what)
        if batch_idx is not None:
            _batch_idx_host(batch_idx.tolist(), batch_cache, what)

    if not isinstance(probe, torch.Tensor) or _on_host(probe):
        host()
        return

    def recheck():
        cpu = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t  # noqa: E731
        host(cpu(seqlens), cpu(block_table), cpu(batch_idx))

    if (
        paged
        and batch_idx is None
        and isinstance(seqlens, torch.Tensor)
        and seqlens.numel()
        and cap + page <= _INT32_MAX
        and not (probe.is_cuda and torch.cuda.is_current_stream_capturing())
    ):
        # one launch and the one sync (index_check's module doc); under a graph capture, the
        # torch ops below assert on the device instead
        bad = torch.empty(seqlens.shape[0], dtype=torch.int32, device=seqlens.device)
        paged_index_check_kernel[(seqlens.shape[0],)](
            seqlens, block_table, bad, block_table.shape[1], cap - snew, snew, page, pool,
            BLOCK=INDEX_BLOCK, target=target,
        )  # fmt: skip
        if any(bad.tolist()):
            recheck()
            raise AssertionError("unreachable: the device and host checks disagree")
        return
    flags: list = []
    if isinstance(seqlens, int):
        if batch:
            _capacity_host([seqlens], snew, cap, paged, what, True)
    elif seqlens.numel():
        lo, hi = torch.aminmax(seqlens)
        flags += [lo < 0, hi > cap - snew]
    if paged:
        _pages_flags(block_table, seqlens, snew, page, pool, flags)
    if batch_idx is not None and batch_idx.numel():
        lo, hi = torch.aminmax(batch_idx)
        flags += [lo < 0, hi >= batch_cache]
    _settle(flags, paged, recheck, what)
