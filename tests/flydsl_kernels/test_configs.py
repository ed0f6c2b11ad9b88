"""Every family's configs and model have the same shape, and ``m_choice`` is the eager choice.

``configs.py`` holds the runtime decision (``TABLES`` keyed by target, ``select(kind, ...)``,
``m_choice`` where a config depends on M) and imports nothing of its family; ``model.py`` holds
the static model with one scoring API. ``m_choice(...).choose(M)`` must be what ``select``
gives for every M, and constant on each of its ranges: torch-flydsl traces one branch per
range, taking ``choose`` at the range's top.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from flydsl_kernels import FAMILIES, _target

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_the_same_shape(family):
    configs = importlib.import_module(f"flydsl_kernels.{family}.configs")
    model = importlib.import_module(f"flydsl_kernels.{family}.model")
    assert set(configs.TABLES) == set(_target.TUNED_TARGETS)
    assert next(iter(inspect.signature(configs.select).parameters)) == "kind"
    assert list(inspect.signature(model.figures).parameters) == ["ck", "kind", "cfg", "problem"]
    assert list(inspect.signature(model.score).parameters) == ["cfg", "fig"]
    for name in ("space", "rank", "main"):
        assert callable(getattr(model, name)), name
    # configs imports nothing of its family (the plan <-> configs cycles are gone)
    src = inspect.getsource(configs)
    for part in ("plan", "model", "api", "cases", "kernels"):
        assert f"from .{part} import" not in src and f"from . import {part}" not in src, part


def _constant_on_ranges(mc, select, *sizes, **kw):
    """``mc.choose(M)`` is ``select(M, *sizes, **kw)`` and the same config across each range of
    ``mc`` (checked at its ends, its middle and next to them; 300 past the last bound)."""
    lo = 0
    for hi, rep in mc.ranges():
        want = mc.choose(rep).config
        top = hi if hi is not None else rep + 300
        for m in {lo + 1, lo + 2, (lo + 1 + top) // 2, top - 1, top}:
            if lo < m <= top:
                assert mc.choose(m).config == want == select(m, *sizes, **kw), (m, lo, hi)
        lo = top


def _rows(groups):
    return lambda m: max(1, m // groups) if groups else m


@pytest.mark.parametrize("target", [None, "sm90", "gfx942", "gfx1250"])
def test_m_choice_is_the_eager_choice_and_constant_on_its_ranges(target):
    from flydsl_kernels.gemm import configs as gemm
    from flydsl_kernels.mx import configs as mx
    from flydsl_kernels.rmsnorm import configs as rms
    from flydsl_kernels.topk import configs as topk

    def dense(m, kind, n, k):
        return gemm.select(kind, m, n, k, 1, target)

    def grouped(m, rows, n, k):
        return gemm.select("grouped", rows(m), n, k, target=target)

    def mx_grouped(m, rows, n, k):
        return mx.select("grouped", rows(m), n, k, "e4m3", "e2m1", target=target)

    def mx_gemm(m, n, k):
        return mx.select("gemm", m, n, k, "e4m3", "e4m3", target=target)

    for n, k in ((48, 64), (4096, 4096), (14336, 4096)):
        for kind in ("dense", "swiglu"):
            mc = gemm.m_choice(kind, n, k, 1, target)
            assert mc.bounds[:4] == (16, 64, 128, 256)
            _constant_on_ranges(mc, dense, kind, n, k)
        for g in (0, 8):
            _constant_on_ranges(gemm.m_choice("grouped", n, k, g, target), grouped, _rows(g), n, k)
            mc = mx.m_choice("grouped", n, k, g, "e4m3", "e2m1", target=target)
            _constant_on_ranges(mc, mx_grouped, _rows(g), n, k)
        _constant_on_ranges(mx.m_choice("gemm", n, k, "e4m3", "e4m3", target=target), mx_gemm, n, k)
    for n in (8, 128, 1000):
        mc = rms.m_choice("fwd", n, torch.bfloat16, target)
        assert mc.bounds, n  # fwd_rows shrinks R for short batches
        _constant_on_ranges(mc, lambda m, n: rms.select("fwd", n, torch.bfloat16, m, target), n)
    for n, k in ((9000, 100), (262144, 1024)):
        mc = topk.m_choice("topk", n, k, torch.float32, target=target)
        assert mc.bounds, (n, k)  # radix_split below CUs / 2 rows
        _constant_on_ranges(
            mc,
            lambda m, *a, **kw: topk.select("topk", m, *a, **kw),
            n,
            k,
            torch.float32,
            target=target,
        )


def test_split_k_follows_m_in_the_eager_choice():
    """The dense GEMM's split-K is a grid decision: ``choose(M)`` gives it for M itself."""
    from flydsl_kernels.gemm import configs as gemm

    mc = gemm.m_choice("dense", 4096, 16384, 1)
    for m in (1, 16, 100, 300, 5000):
        cfg, split = mc.choose(m)
        assert split == gemm.split_k(cfg, m, 4096, 16384)
    assert mc.choose(1).split_k > 1 and mc.choose(5000).split_k == 1


def test_select_takes_the_kind_first():
    """One name per decision: the names from before the configs / model split are gone, and a
    call without the kind says what the kinds are."""
    from flydsl_kernels import topk as topk_pkg
    from flydsl_kernels.gemm import configs as gemm
    from flydsl_kernels.mx import configs as mx
    from flydsl_kernels.rmsnorm import configs as rms
    from flydsl_kernels.topk import configs as topk

    with pytest.raises(ValueError, match="kind 4096 is not one of dense"):
        gemm.select(4096, 4096, 4096, 4096)
    with pytest.raises(ValueError, match="kind 4 is not one of topk"):
        topk.select(4, 9000, 100, torch.float32)
    for mod, names in (
        (
            gemm,
            ("SHIPPED", "SHIPPED_BY_TARGET", "shipped_table", "select_swiglu", "select_grouped"),
        ),
        (mx, ("GEMM_SHIPPED_BY_TARGET", "gemm_table", "select_gemm", "select_quant")),
        (rms, ("select_forward", "select_backward", "select_dw_reduce", "tables")),
        (topk, ("Plan", "shipped", "router_config")),
        (topk_pkg, ("Plan",)),
    ):
        assert not [n for n in names if hasattr(mod, n)], mod.__name__
