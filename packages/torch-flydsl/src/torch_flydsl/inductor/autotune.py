"""``mode="max-autotune"``: time FlyDSL against ATen per static dense GEMM shape, at compile time.

Only on a GPU (``torch.cuda.is_available()`` and a CUDA node): on the CPU, or for a symbolic
shape, the gate table alone decides. The two candidates are the ``flydsl_kernels.gemm`` API
(its own config choice for the shape) and the ATen op on the same random operands (shapes,
strides and dtypes of the node's inputs), timed interleaved in one process as medians of
CUDA-event timings (``calibrate.paired_medians``). A node whose ATen time is lower stays ATen's
(``compile:<op>`` fallback ``autotune``). Results are cached per (arch, op, dtype, shapes,
strides) in memory and in ``<FlyDSL cache dir>/torch_autotune.json``. Tiles are not
searched: the choice is FlyDSL's default config or ATen.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from pathlib import Path

import torch

log = logging.getLogger("torch_flydsl")

DENSE = ("mm", "addmm", "bmm", "baddbmm")
REPS = 10
_cache: dict[str, bool] = {}
_lock = threading.Lock()


def cache_path() -> Path:
    from flydsl_core.settings import default_cache_dir

    return Path(default_cache_dir()) / "torch_autotune.json"


def _load() -> None:
    if _cache:
        return
    with contextlib.suppress(OSError, ValueError):  # no cache yet, or an unreadable one
        _cache.update(json.loads(cache_path().read_text()))


def _store(key: str, wins: bool) -> None:
    _cache[key] = wins
    try:
        p = cache_path()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(_cache, indent=1))
        tmp.replace(p)
    except OSError as e:
        log.warning("torch_flydsl: cannot write the autotune cache: %s", e)


def _real(v):
    if not isinstance(v, torch.Tensor):
        return v
    t = torch.empty_strided(
        tuple(int(s) for s in v.shape),
        tuple(int(s) for s in v.stride()),
        dtype=v.dtype,
        device=v.device,
    )
    return t.normal_() if t.is_floating_point() else t.zero_()


def _static(vals) -> bool:
    return not any(
        isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in (*v.shape, *v.stride()))
        for v in vals
    )


def flydsl_wins(ov, vals, settings) -> bool:
    """Whether the node keeps its FlyDSL rewrite (see the module docstring)."""
    if ov.op not in DENSE or not torch.cuda.is_available():
        return True
    if not isinstance(vals[0], torch.Tensor) or vals[0].device.type != "cuda" or not _static(vals):
        return True
    from .. import eligibility
    from ..calibrate import paired_medians
    from ..dispatch import aten_overload
    from ..ops._kernels import kernel

    arch = eligibility.resolve_arch(vals[0].device.index)
    desc = [
        (tuple(v.shape), tuple(v.stride()), str(v.dtype))
        if isinstance(v, torch.Tensor)
        else repr(v)
        for v in vals
    ]
    key = json.dumps([arch, ov.op, desc])
    with _lock:
        _load()
        if key in _cache:
            return _cache[key]
        real = [_real(v) for v in vals]
        op = aten_overload(ov.op)
        if ov.op in ("mm", "bmm"):
            a, b = real
            c, alpha, beta = None, 1.0, 0.0
        else:
            c, a, b, beta, alpha = real
        device = vals[0].device
        with torch.cuda.device(device):
            ours, theirs = paired_medians(
                lambda: kernel("gemm")(a, b, c=c, alpha=alpha, beta=beta),
                lambda: op(*real),
                REPS,
            )
        wins = ours < theirs
        log.info(
            "torch_flydsl autotune %s %s: FlyDSL %.4f ms, ATen %.4f ms", ov.op, desc, ours, theirs
        )
        _store(key, wins)
        return wins
