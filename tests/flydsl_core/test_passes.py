"""The pass pipeline: each pass on its own, the visible pipeline, and IR dumps."""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core import dtypes as dt
from flydsl_core.exc import FlyDSLError
from flydsl_core.ir import Block, Function, Op, Param, TileType, Value, verify
from flydsl_core.passes import DEFAULT_PIPELINE, PassManager, cse, fold
from flydsl_core.passes.fold import const_value

pytestmark = pytest.mark.cpu


def _ops(fn, name):
    return [op for op in fn.walk() if op.name == name]


def _const(body, value, d=dt.int32, shape=()):
    return body.append(
        Op("constant", [], {"value": value, "dtype": d, "shape": shape}, [TileType(d, shape)])
    ).result


def _fn(build):
    body = Block()
    x = Value(TileType(dt.int32), name="x")
    out = build(body, x)
    fn = Function("t", [Param("x", "scalar", x)], body)
    return fn, out


@pytest.mark.parametrize(
    ("name", "a", "b", "want"),
    [
        ("add", 2**31 - 1, 1, -(2**31)),  # int32 wraps
        ("intdiv", -7, 2, -3),  # C division truncates
        ("mod", -7, 2, -1),
        ("mul", 3, -4, -12),
        ("shl", 1, 31, -(2**31)),
        ("lt", 3, 4, True),
    ],
)
def test_fold_integer_semantics(name, a, b, want):
    holder = {}

    def build(body, x):
        ca, cb = _const(body, a), _const(body, b)
        t = TileType(dt.bool_) if name == "lt" else TileType(dt.int32)
        r = body.append(Op(name, [ca, cb], {}, [t])).result
        holder["use"] = body.append(Op("xor", [x, x], {}, [TileType(dt.int32)]))
        return r

    fn, _ = _fn(build)
    fold(fn)
    folded = [op for op in fn.body.ops if op.name == "constant" and op.attrs["value"] == want]
    assert folded, [(op.name, op.attrs) for op in fn.body.ops]
    assert not _ops(fn, name)
    verify(fn)


def test_fold_identities_and_constant_if():
    def build(body, x):
        zero, one = _const(body, 0), _const(body, 1)
        a = body.append(Op("add", [x, zero], {}, [TileType(dt.int32)])).result
        m = body.append(Op("mul", [one, a], {}, [TileType(dt.int32)])).result
        cond = _const(body, True, dt.bool_)
        then, other = Block(), Block()
        then.append(Op("yield", [m], {}, []))
        other.append(Op("yield", [x], {}, []))
        r = body.append(Op("if", [cond, x], {}, [TileType(dt.int32)], regions=[then, other])).result
        body.append(Op("yield", [r], {}, []))  # a stand-in user of r
        return r

    fn, _ = _fn(build)
    fold(fn)
    names = [op.name for op in fn.body.ops]
    assert "add" not in names and "mul" not in names and "if" not in names
    assert fn.body.ops[-1].operands[0] is fn.params[0].value


def test_cse_merges_equal_pure_ops_but_not_loads():
    def build(body, x):
        a = body.append(Op("mul", [x, x], {}, [TileType(dt.int32)])).result
        b = body.append(Op("mul", [x, x], {}, [TileType(dt.int32)])).result
        body.append(Op("add", [a, b], {}, [TileType(dt.int32)]))

    fn, _ = _fn(build)
    cse(fn)
    assert len(_ops(fn, "mul")) == 1
    add = _ops(fn, "add")[0]
    assert add.operands[0] is add.operands[1]


def test_dce_drops_dead_pure_ops_and_keeps_stores():
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
        i = fly.program_id(0)
        v = x.tile((BLOCK,), i).load()
        _unused = fly.exp(v) * 3.0  # dead
        dead_acc = fly.zeros((), fly.fp32)
        for _ in fly.range(0, 4):
            dead_acc += 1.0  # a carried value nobody reads
        out.tile((BLOCK,), i).store(v)

    x = torch.randn(40)
    fn = k.ir(x, torch.empty_like(x), BLOCK=16)
    assert not _ops(fn, "exp")
    assert len(_ops(fn, "store")) == 1
    loops = _ops(fn, "for")
    assert not loops or not loops[0].results  # the dead carried value is gone


@fly.kernel
def kloop(a: fly.Tensor, out: fly.Tensor, BK: fly.constexpr):
    row = fly.program_id(0)
    acc = fly.zeros((BK,), fly.fp32)
    for k in fly.range(0, a.shape[1], BK):
        acc += a[row, fly.ds(k, BK)].load()
    out[row].tile((BK,), 0).store(acc)


def _range_masks(fn):
    return [op for op in fn.walk() if op.name == "range_mask"]


def test_mask_elimination_proves_k_loop_in_bounds():
    # K = 64 is a static multiple of BK = 16: the loop's loads need no K mask.
    k = fly.kernel(kloop.fn, static_dims={"a": (1,)})
    a = torch.randn(3, 64)
    fn = k.ir(a, torch.empty(3, 16), BK=16)
    loop = _ops(fn, "for")[0]
    inner = [op for op in loop.regions[0].walk() if op.name == "range_mask"]
    assert all(op.attrs["axis"] < 0 for op in inner), "only the uniform row test may remain"
    out = torch.empty(3, 16)
    k[(3,)](a, out, BK=16)
    torch.testing.assert_close(out, a.reshape(3, 4, 16).sum(1), rtol=1e-5, atol=1e-5)


def test_mask_elimination_makes_whole_tile_masks_uniform():
    # K divisible by 16 (a specialization fact) and BK = 16: a tile is all in or all out.
    a = torch.randn(3, 48)
    fn = kloop.ir(a, torch.empty(3, 16), BK=16)
    loop = _ops(fn, "for")[0]
    inner = [op for op in loop.regions[0].walk() if op.name in ("range_mask", "constant")]
    masks = [op for op in inner if op.name == "range_mask"]
    assert masks and all(op.attrs["axis"] < 0 for op in masks)


def test_mask_elimination_keeps_masks_it_cannot_prove():
    a = torch.randn(3, 50)  # 50 is not a multiple of 16
    fn = kloop.ir(a, torch.empty(3, 16), BK=16)
    loop = _ops(fn, "for")[0]
    masks = [op for op in loop.regions[0].walk() if op.name == "range_mask"]
    assert any(op.attrs["axis"] == 0 and op.attrs["length"] == 16 for op in masks)
    out = torch.empty(3, 16)
    kloop[(3,)](a, out, BK=16)
    ref = torch.nn.functional.pad(a, (0, 14)).reshape(3, 4, 16).sum(1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_specialize_turns_unit_strides_into_constants():
    a = torch.randn(3, 48)
    fn = kloop.ir(a, torch.empty(3, 16), BK=16)
    stride1 = next(p for p in fn.params if p.name == "a.stride1")
    uses = [op for op in fn.walk() if stride1.value in op.operands]
    assert not uses
    only = fly.kernel(kloop.fn, pipeline=("specialize",)).ir(a, torch.empty(3, 16), BK=16)
    assert any(const_value(op.results[0]) == 1 for op in only.body.ops if op.name == "constant")


def test_pipeline_is_a_visible_list_and_rejects_unknown_passes():
    assert DEFAULT_PIPELINE[0] == "specialize" and "eliminate-masks" in DEFAULT_PIPELINE
    assert PassManager().names == DEFAULT_PIPELINE
    with pytest.raises(FlyDSLError, match="unknown passes"):
        PassManager(["fold", "no-such-pass"])


def test_custom_pipeline_leaves_masks_alone():
    k = fly.kernel(kloop.fn, pipeline=("specialize", "dce"))
    a = torch.randn(3, 48)
    fn = k.ir(a, torch.empty(3, 16), BK=16)
    loop = _ops(fn, "for")[0]
    masks = [op for op in loop.regions[0].walk() if op.name == "range_mask"]
    assert any(op.attrs["axis"] == 0 for op in masks)


def test_dump_dir_gets_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_DUMP_DIR", str(tmp_path))
    a = torch.randn(3, 48)
    kloop.ir(a, torch.empty(3, 16), BK=16)
    (d,) = list(tmp_path.iterdir())
    names = sorted(p.name for p in d.iterdir())
    assert names[0] == "00_traced.ir"
    assert [n.split("_", 1)[1][:-3] for n in names[1:]] == list(DEFAULT_PIPELINE)
    assert "range_mask" in (d / "00_traced.ir").read_text()
