"""Config spaces and the tuning database (the parts that need no compiler)."""

from __future__ import annotations

import json

import pytest

from flydsl_core.autotune import Config, ConfigSpace, Entry, TuningDB, static_pick
from flydsl_core.autotune.prune import Candidate
from flydsl_core.exc import FlyDSLError

pytestmark = pytest.mark.cpu


def test_config_space_product_constraint_and_default():
    space = ConfigSpace(
        BLOCK=[64, 128, 256],
        num_warps=[4, 8],
        constraint=lambda c: c["BLOCK"] // c["num_warps"] >= 16,
    )
    configs = list(space)
    assert len(configs) == len(space) == 5  # 256/4, 256/8, 128/4, 128/8, 64/4
    assert all(c["BLOCK"] // c["num_warps"] >= 16 for c in configs)
    d = space.default()
    assert d.constexprs() == {"BLOCK": 64} and d.launch_options() == {"num_warps": 4}


def test_config_is_hashable_and_round_trips():
    c = Config.make(BLOCK_M=128, BLOCK_N=64, num_warps=8, waves_per_eu=2)
    assert Config.from_json(json.loads(json.dumps(c.to_json()))) == c
    assert {c: 1}[Config.make(waves_per_eu=2, num_warps=8, BLOCK_N=64, BLOCK_M=128)] == 1


def test_user_entries_override_shipped_ones(tmp_path):
    shipped = tmp_path / "shipped.json"
    ship = TuningDB(shipped)
    ship.record("gemm", "m64", "gfx950", Entry(Config.make(BLOCK=64), "static", {}))
    ship.record("gemm", "m128", "gfx950", Entry(Config.make(BLOCK=128), "static", {}))
    ship.save()
    user = TuningDB(tmp_path / "user.json", shipped=[shipped])
    assert user.lookup("gemm", "m64", "gfx950").config["BLOCK"] == 64
    assert user.source_of("gemm", "m64", "gfx950") == "shipped"
    user.record("gemm", "m64", "gfx950", Entry(Config.make(BLOCK=32), "timed", {"median_ms": 0.1}))
    user.save()
    again = TuningDB(tmp_path / "user.json", shipped=[shipped])
    e = again.lookup("gemm", "m64", "gfx950")
    assert (
        e.config["BLOCK"] == 32
        and e.method == "timed"
        and again.source_of("gemm", "m64", "gfx950") == "user"
    )
    assert again.lookup("gemm", "m128", "gfx950").config["BLOCK"] == 128
    assert again.lookup("gemm", "m64", "gfx942") is None


def test_unreadable_database_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(FlyDSLError, match="unreadable"):
        TuningDB(p)


def test_static_pick_prefers_occupancy_then_instructions():
    def mk(occ, n, v):
        return Candidate(Config.make(n=n), {"occupancy": occ, "instruction_count": n, "vgpr": v})

    assert static_pick([mk(2, 100, 64), mk(4, 300, 120), mk(4, 200, 128)]).config["n"] == 200
    assert static_pick([]) is None
