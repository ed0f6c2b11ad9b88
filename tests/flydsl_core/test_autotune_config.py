"""Config spaces and the static pick (the parts that need no compiler)."""

from __future__ import annotations

import json

import pytest

from flydsl_core.autotune import Config, ConfigSpace, static_pick
from flydsl_core.autotune.prune import Candidate

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


def test_static_pick_prefers_occupancy_then_instructions():
    def mk(occ, n, v):
        return Candidate(Config.make(n=n), {"occupancy": occ, "instruction_count": n, "vgpr": v})

    assert static_pick([mk(2, 100, 64), mk(4, 300, 120), mk(4, 200, 128)]).config["n"] == 200
    assert static_pick([]) is None
