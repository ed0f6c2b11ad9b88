"""FlyIR: printing, verification and tracing determinism."""

from __future__ import annotations

import os
import re

import pytest
import torch

import flydsl_core as fly
from flydsl_core import dtypes as dt
from flydsl_core import settings
from flydsl_core.exc import VerifyError
from flydsl_core.ir import (
    Block,
    Function,
    Op,
    Param,
    TensorType,
    TileType,
    Value,
    print_function,
    verify,
)

pytestmark = pytest.mark.cpu
GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


@fly.kernel
def scale_rows(x: fly.Tensor, out: fly.Tensor, alpha: float, BLOCK: fly.constexpr):
    row = fly.program_id(0)
    v = x[row].tile((BLOCK,), 0).load()
    out[row].tile((BLOCK,), 0).store(v * alpha)


def _golden(name: str, text: str, golden_dir: str = GOLDEN):
    """``text`` must equal the golden file ``name``; ``FLYDSL_ACCEPT=1`` (re)writes it. A
    missing golden fails: writing it silently would let a deleted golden pass."""
    path = os.path.join(golden_dir, name)
    if settings.get("FLYDSL_ACCEPT"):
        with open(path, "w") as f:
            f.write(text + "\n")
    if not os.path.exists(path):
        pytest.fail(f"golden file {path} is missing; run with FLYDSL_ACCEPT=1 to write it")
    with open(path) as f:
        assert text + "\n" == f.read(), f"{name} changed; rerun with FLYDSL_ACCEPT=1 if intended"


def test_final_ir_matches_golden():
    x = torch.randn(4, 64)
    _golden("scale_rows.ir", print_function(scale_rows.ir(x, torch.empty_like(x), 2.0, BLOCK=64)))


def test_a_missing_golden_fails_unless_accepted(tmp_path, monkeypatch):
    monkeypatch.delenv("FLYDSL_ACCEPT", raising=False)
    with pytest.raises(pytest.fail.Exception, match="missing"):
        _golden("gone.ir", "text", str(tmp_path))
    assert not (tmp_path / "gone.ir").exists()
    monkeypatch.setenv("FLYDSL_ACCEPT", "1")
    _golden("gone.ir", "text", str(tmp_path))
    assert (tmp_path / "gone.ir").read_text() == "text\n"


def test_two_traces_print_the_same():
    x = torch.randn(3, 10)
    a = str(scale_rows.ir(x, torch.empty_like(x), 2.0, BLOCK=16))
    b = str(scale_rows.ir(x, torch.empty_like(x), 2.0, BLOCK=16))
    assert a == b
    assert "kernel @scale_rows(" in a and "BLOCK=16" in a


def test_specialization_key_tracks_divisibility_and_unit_strides():
    k = scale_rows
    s16 = k.specialize(k.bind((torch.randn(2, 32), torch.empty(2, 32), 1.0), {"BLOCK": 32}))
    s17 = k.specialize(k.bind((torch.randn(2, 17), torch.empty(2, 17), 1.0), {"BLOCK": 32}))
    s16b = k.specialize(k.bind((torch.randn(5, 48), torch.empty(5, 48), 3.0), {"BLOCK": 32}))
    t = torch.randn(32, 2).T
    sT = k.specialize(k.bind((t, torch.empty(2, 32), 1.0), {"BLOCK": 32}))
    assert s16.key != s17.key
    assert s16.key == s16b.key  # values differ, facts agree
    assert sT.key != s16.key  # a transposed input has no unit inner stride
    assert dict(s16.specs["x"].stride_facts[1]) == {"value": 1}
    assert dict(s16.specs["x"].size_facts[1]) == {"div": 16}


def _fn_with(ops_builder):
    body = Block()
    x = Value(TileType(dt.int32), name="x")
    fn = Function("t", [Param("x", "scalar", x)], body)
    ops_builder(body, x)
    return fn


def test_verifier_rejects_a_value_used_outside_its_scope():
    def build(body, x):
        inner = Block()
        c = Op("constant", [], {"value": 1, "dtype": dt.int32, "shape": ()}, [TileType(dt.int32)])
        inner.append(c)
        y = Op("yield", [], {}, [])
        inner.append(y)
        cond = Op(
            "constant", [], {"value": True, "dtype": dt.bool_, "shape": ()}, [TileType(dt.bool_)]
        )
        body.append(cond)
        other = Block()
        other.append(Op("yield", [], {}, []))
        body.append(Op("if", [cond.result], {}, [], regions=[inner, other]))
        body.append(Op("add", [c.result, x], {}, [TileType(dt.int32)]))

    with pytest.raises(VerifyError, match="not visible"):
        verify(_fn_with(build))


def test_verifier_rejects_a_wrong_result_type():
    def build(body, x):
        body.append(Op("add", [x, x], {}, [TileType(dt.fp32)]))

    with pytest.raises(VerifyError, match="result types"):
        verify(_fn_with(build))


def test_verifier_rejects_a_region_without_terminator():
    def build(body, x):
        lo = Op("constant", [], {"value": 0, "dtype": dt.int32, "shape": ()}, [TileType(dt.int32)])
        body.append(lo)
        loop_body = Block([TileType(dt.int32)])
        body.append(Op("for", [lo.result, x, x], {}, [], regions=[loop_body]))

    with pytest.raises(VerifyError, match="yield"):
        verify(_fn_with(build))


def test_verifier_accepts_traced_kernels():
    x = torch.randn(3, 10)
    verify(scale_rows.ir(x, torch.empty_like(x), 2.0, BLOCK=16))


# -- ops declare their shape; every backend has a rule for every op ------------------------------


def test_every_op_declares_its_operand_slots_and_effects():
    from flydsl_core.ir.ops import EFFECTS, OPS

    for name, d in OPS.items():
        assert d.effects <= set(EFFECTS), name
        assert d.pure == (not d.effects and not d.terminator), name
    memory = {n for n, d in OPS.items() if d.reads_memory or d.writes_memory}
    assert memory == {"load", "load_at", "store", "atomic_rmw", "atomic_cas"}
    assert {n for n, d in OPS.items() if d.writes_memory} == {"store", "atomic_rmw", "atomic_cas"}
    assert OPS["load"].signature == "tensor, offsets, mask?, other?"
    assert OPS["for"].signature == "lo, hi, step, init*"


def _ops_needing_rules():
    from flydsl_core.ir.ops import OPS

    # a terminator is read by the rule of the region op whose block it ends
    return {n for n, d in OPS.items() if not d.terminator}


def test_every_op_has_a_reference_rule():
    from flydsl_core.backends.reference.interpreter import RULES

    missing = _ops_needing_rules() - set(RULES)
    assert not missing, f"ops without a cpu-reference rule: {sorted(missing)}"


def test_every_op_has_a_triton_rule():
    pytest.importorskip("triton")
    from flydsl_core.backends.triton.codegen import LOWERINGS

    missing = _ops_needing_rules() - set(LOWERINGS)
    assert not missing, f"ops without a Triton lowering rule: {sorted(missing)}"


def test_operands_are_read_by_slot():
    t = TileType(dt.int32, (4,))
    mask, other = Value(TileType(dt.bool_, (4,))), Value(t)
    ten, offs = Value(TensorType(dt.int32, 1)), Value(t)
    load = Op("load", [ten, offs, mask, other], {}, [t])
    assert load.operand("mask") is mask and load.operand("other") is other
    assert load.args.tensor is ten and load.args.offsets is offs
    load.drop_operand("mask")  # other needs the mask: both go
    assert load.operands == [ten, offs] and load.operand("mask") is None
    assert load.operand("other") is None
    with pytest.raises(KeyError, match="no operand slot"):
        load.operand("value")
    loop = Op("for", [offs, offs, offs, mask, other], {}, [])
    assert loop.operand_list("init") == [mask, other]


def test_wrong_operand_counts_are_type_errors():
    from flydsl_core.exc import TypeCheckError
    from flydsl_core.ir import infer

    i32 = TileType(dt.int32)
    with pytest.raises(TypeCheckError, match=r"add takes 2 operands \(lhs, rhs\), got 3"):
        infer("add", [i32, i32, i32], {})
    with pytest.raises(TypeCheckError, match=r"load takes 2 to 4 operands"):
        infer("load", [i32], {})


def test_optional_operands_print_with_their_slot_name():
    x = torch.randn(4, 64)
    text = print_function(scale_rows.ir(x, torch.empty_like(x), 2.0, BLOCK=64))
    assert re.search(r"= load %0, %\d+, mask=%\d+, other=%\d+ :", text)
    assert re.search(r"\n  store %5, %\d+, %\d+, mask=%\d+\n", text)
