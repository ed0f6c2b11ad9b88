"""A traced mod's tiles fitted to the target's registers at launch (``attention.fit``), checked
by cross-compiling for gfx950 on the CPU: the public API's launches are recorded instead of
run (``api._run``), then compiled for the target and their resources read.

The mod is heavier than the tables' probes (``model.MOD_PROBES``): a learned relative bias
gathered from a table, an ALiBi-like slope per head and a softcap over both, with its
gradient. With the plans' tiles (Triton 3.9) its causal gfx950 dK/dV d128 kernel spilled 6
SGPRs and its forward d192/128 one SGPR.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import flydsl_core as fly
from flydsl_kernels.attention import (
    ScoreMod,
    api,
    fit,
    flash_attn_func,
    flash_attn_with_kvcache,
    model,
    plan,
    reference,
)

S = 256
H = 16
TARGET = "gfx950"


def _heavy(score, b, h, q_idx, kv_idx, table, slopes):
    s = score + table.gather(h, q_idx - kv_idx + (S - 1)).load().to(fly.fp32)
    s = s - slopes.gather(h).load() * fly.abs(q_idx - kv_idx).to(fly.fp32)
    return fly.tanh(s * 0.02) * 50.0


def _heavy_grad(score, out, grad_out, b, h, q_idx, kv_idx, table, slopes):
    t = out * 0.02
    return grad_out * (1.0 - t * t)


HEAVY = ScoreMod(_heavy, _heavy_grad)
_RUN = api._run  # the launches' runner, before a test records them instead


def _heavy_torch(table, slopes):
    def mod(s, b, h, q, kv):
        t = s + table.double()[h, q - kv + (S - 1)] - slopes.double()[h] * (q - kv).abs()
        return torch.tanh(t * 0.02) * 50.0

    return mod


@pytest.fixture
def recorded(monkeypatch):
    """The launches the API makes, recorded instead of run; the fit's memo emptied."""
    ran = []
    monkeypatch.setattr(api, "_run", lambda launch, tgt: ran.append(launch))
    monkeypatch.setattr(fit, "_FITTED", {})
    return ran


def _inputs(d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, S, H, d, generator=g, dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(1, S, H, d, generator=g, dtype=torch.bfloat16).requires_grad_()
    v = torch.randn(1, S, H, dv, generator=g, dtype=torch.bfloat16).requires_grad_()
    table = torch.randn(H, 2 * S - 1, generator=g)
    slopes = torch.rand(H, generator=g)
    return q, k, v, (table, slopes)


def _short(ck):
    return model.shortfall(ck, TARGET, model.OCCUPANCY_FLOOR)


def _fit_of(kind):
    """(the plan's tile, the tile launched) of the fit's one ``kind`` pick"""
    (tile, out), *more = [(k[2], v) for k, v in fit._FITTED.items() if k[0] == kind]
    assert not more
    return tile, out


SPECS = (fly.TensorSpec("fp32", (H, 2 * S - 1)), fly.TensorSpec("fp32", (H,)))


def test_a_heavy_mods_backward_launches_a_clean_dkdv_tile(recorded):
    q, k, v, mt = _inputs(128, 128)
    o = flash_attn_func(q, k, v, causal=True, score_mod=HEAVY, mod_tensors=mt, target=TARGET)
    o.float().sum().backward()
    fwd, _, dkdv, dq = recorded
    tile, out = _fit_of("bwd_dkdv")
    p = plan.Problem(1, S, S, H, H, 128, 128, causal=True, score_mod=HEAVY)
    assert out != tile
    launched = model.backward_launch(p, TARGET, "bwd_dkdv", out, SPECS)
    assert (dkdv.constexprs, dkdv.options) == (launched.constexprs, launched.options)
    # the plan's dK/dV tile falls short with this mod (SGPR spills); the launched one does not
    assert _short(model.backward_launch(p, TARGET, "bwd_dkdv", tile, SPECS).compile(TARGET))
    assert all(_short(launch.compile(TARGET)) is None for launch in (fwd, dkdv, dq))


def test_a_heavy_mods_forward_launches_a_clean_tile(recorded):
    q, k, v, mt = _inputs(192, 128)
    flash_attn_func(q, k, v, causal=True, score_mod=HEAVY, mod_tensors=mt, target=TARGET)
    (fwd,) = recorded
    tile, out = _fit_of("fwd")
    p = plan.Problem(1, S, S, H, H, 192, 128, causal=True, score_mod=HEAVY)
    assert out != tile
    fp = plan.plan_forward(p, TARGET, config=out, splits=1, persistent=0)
    launched = model.forward_launches(fp, SPECS)[0]
    assert (fwd.constexprs, fwd.options) == (launched.constexprs, launched.options)
    fp = plan.plan_forward(p, TARGET, config=tile, splits=1, persistent=0)
    assert _short(model.forward_launches(fp, SPECS)[0].compile(TARGET))
    assert _short(fwd.compile(TARGET)) is None


def test_a_clean_tile_a_given_tile_and_the_cpu_are_left_as_planned(recorded):
    q, k, v, mt = _inputs(128, 128)
    light = ScoreMod(lambda score, b, h, q_idx, kv_idx: score * 0.5 + 1.0)
    flash_attn_func(q, k, v, causal=True, score_mod=light, target=TARGET)
    tile, out = _fit_of("fwd")
    assert out == tile  # clean as planned: no change
    # a tile the caller gives is launched as given, unchecked
    given = replace(tile, BN=16 if tile.BN != 16 else 32)
    flash_attn_func(q, k, v, causal=True, score_mod=HEAVY, mod_tensors=mt, target=TARGET,
                    config=given)  # fmt: skip
    assert recorded[-1].constexprs["C"].BN == given.BN != tile.BN and len(fit._FITTED) == 1
    assert not fit.fits("cpu-reference") and not fit.fits("cpu-interpret") and fit.fits("sm90")


def test_flydsl_attn_fit_0_launches_the_planned_tile(recorded, monkeypatch):
    monkeypatch.setenv("FLYDSL_ATTN_FIT", "0")
    assert not fit.fits(TARGET)
    q, k, v, mt = _inputs(128, 128)
    o = flash_attn_func(q, k, v, causal=True, score_mod=HEAVY, mod_tensors=mt, target=TARGET)
    o.float().sum().backward()
    p = plan.Problem(1, S, S, H, H, 128, 128, causal=True, score_mod=HEAVY)
    planned = model.backward_launch(p, TARGET, "bwd_dkdv", None, SPECS)
    assert recorded[2].constexprs == planned.constexprs and not fit._FITTED


def test_the_pick_is_kept_and_a_tile_nothing_mends_runs_as_planned(recorded, caplog):
    p = plan.Problem(1, S, S, H, H, 128, 128, causal=True, score_mod=HEAVY)
    tile = plan.plan_forward(p, TARGET).config
    fp = plan.plan_forward(p, TARGET, config=tile, splits=1, persistent=0)
    launch = model.forward_launches(fp, SPECS)[0]
    rep = launch.compile(TARGET).executable.report
    spilling = SimpleNamespace(executable=SimpleNamespace(report=replace(rep, vgpr_spill_count=3)))
    calls = []

    def compile_with(c):
        calls.append(c)
        return spilling

    with caplog.at_level(logging.WARNING, logger=fit.__name__):
        assert fit.traced_tile("fwd", p, TARGET, tile, launch, compile_with) == tile
    assert f"none of the {len(calls) - 1} tiles the model tried compiles clean" in caplog.text
    assert len(calls) > 2  # the plan's tile, then the model's changes
    n = len(calls)
    assert fit.traced_tile("fwd", p, TARGET, tile, launch, compile_with) == tile and len(calls) == n
    # a longer sequence is the same kernel (kept); fp32 operands at the same tile are not
    longer = replace(launch, args=tuple(4 * S if a == S else a for a in launch.args))
    assert fit.traced_tile("fwd", p, TARGET, tile, longer, compile_with) and len(calls) == n
    fp32 = model.forward_launches(replace(fp, problem=replace(p, dtype="fp32")), SPECS)[0]
    fit.traced_tile("fwd", replace(p, dtype="fp32"), TARGET, tile, fp32, compile_with)
    assert len(calls) > n


@pytest.mark.parametrize("kind, d, dv", [("bwd_dkdv", 128, 128), ("fwd", 192, 128)])
def test_the_fitted_tiles_compute_the_reference(recorded, monkeypatch, kind, d, dv):
    # the tile the fit launches on gfx950 (the tests above), launched by the API on the CPU
    # reference backend in the plan's place, against the float64 reference with the mod in torch
    q, k, v, mt = _inputs(d, dv)
    o = flash_attn_func(q, k, v, causal=True, score_mod=HEAVY, mod_tensors=mt, target=TARGET)
    o.float().sum().backward()
    tile, out = _fit_of(kind)
    assert out != tile
    asked = []

    def fitted(kd, p, target, t, launch, build):
        asked.append(kd)
        return out if kd == kind else t

    monkeypatch.setattr(api, "_run", _RUN)
    monkeypatch.setattr(fit, "fits", lambda target: True)
    monkeypatch.setattr(fit, "traced_tile", fitted)
    g = torch.Generator().manual_seed(7)
    n, h, hk = 37, 4, 2
    qs = torch.randn(2, n, h, d, generator=g).to(torch.bfloat16).requires_grad_()
    ks = torch.randn(2, n, hk, d, generator=g).to(torch.bfloat16).requires_grad_()
    vs = torch.randn(2, n, hk, dv, generator=g).to(torch.bfloat16).requires_grad_()
    table, slopes = torch.randn(h, 2 * S - 1, generator=g) * 3, torch.rand(h, generator=g)
    out_, lse, _ = flash_attn_func(
        qs, ks, vs, causal=True, score_mod=HEAVY, mod_tensors=(table, slopes),
        return_attn_probs=True,
    )  # fmt: skip
    ins64 = [t.detach().double().requires_grad_() for t in (qs, ks, vs)]
    ro, rl = reference.attention(*ins64, causal=True, score_mod=_heavy_torch(table, slopes))
    torch.testing.assert_close(out_.double(), ro, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-4, atol=1e-4)
    do = torch.randn(out_.shape, generator=g).to(torch.bfloat16)
    grads = torch.autograd.grad(out_, (qs, ks, vs), do)
    rgrads = torch.autograd.grad(ro, ins64, do.double())
    for name, a, r in zip(("dq", "dk", "dv"), grads, rgrads):
        torch.testing.assert_close(a.double(), r, rtol=2e-2, atol=2e-2, msg=name)
    assert kind in asked


def test_a_heavy_mods_paged_decode_launches_a_clean_tile(recorded):
    # one query per sequence over pages of 16 keys under gpt-oss's window: the plan's gfx950
    # d64 decode tile spilled 6 SGPRs with this mod; the fit's change is planned again with
    # the page cap (plan.retile_forward), as the plan caps its own tile
    g = torch.Generator().manual_seed(3)
    b, page, pages, hk, d = 2, 16, 16, 4, 64
    q = torch.randn(b, 1, H, d, generator=g).to(torch.bfloat16)
    kc = torch.randn(b * pages, page, hk, d, generator=g).to(torch.bfloat16)
    vc = torch.randn(b * pages, page, hk, d, generator=g).to(torch.bfloat16)
    table = torch.randperm(b * pages, generator=g).to(torch.int32).reshape(b, pages)
    lens = torch.tensor([pages * page, 77], dtype=torch.int32)
    mt = (torch.randn(H, 2 * S - 1, generator=g), torch.rand(H, generator=g))
    flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, block_table=table, causal=True, window_size=(127, 0),
        score_mod=HEAVY, mod_tensors=mt, target=TARGET, num_splits=1,
    )  # fmt: skip
    (launch,) = recorded
    tile, out = _fit_of("decode")
    assert out != tile and _short(launch.compile(TARGET)) is None
    keys = launch.constexprs["C"].BN
    assert keys <= page or out.klanes  # a tile past a page loads K in lane order
