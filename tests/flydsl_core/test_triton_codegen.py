"""The Triton backend's code generator: FlyIR -> readable ``@triton.jit`` source.

These tests read the generated source and the facts handed to Triton; they
neither compile nor run anything (test_triton_compile.py and
test_triton_interpret.py do).
"""

from __future__ import annotations

import ast
import os
import re

import pytest
import torch

import flydsl_core as fly
from flydsl_core.backends import get_backend
from flydsl_core.backends.triton import codegen
from flydsl_core.backends.triton.codegen import LOWERINGS
from flydsl_core.examples import matmul, softmax, vector_add
from flydsl_core.exc import CompileError, LoweringError

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
pytest.importorskip("triton")

pytestmark = pytest.mark.cpu


def source(kernel, *args, target="gfx950", **kw):
    return get_backend(target).generate(kernel.ir(*args, **kw))


def mm_gen(dtype=torch.bfloat16, shape=(128, 256, 128), target="gfx950", **tiles):
    a, b = matmul.make_inputs(shape, dtype)
    c = torch.empty(shape[0], shape[2], dtype=dtype)
    tiles = tiles or {"BM": 64, "BN": 64, "BK": 32}
    return source(matmul.KERNEL, a, b, c, target=target, **tiles)


def kernel_body(src: str) -> str:
    return src[src.index("@triton.jit\ndef ") :]


def last_jit_function(src: str) -> ast.FunctionDef:
    fns = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)]
    return fns[-1]


# -- rules (that every op has one is tested in test_ir.py) ------------------------------------


def test_a_missing_rule_names_the_op_and_the_backend(monkeypatch):
    monkeypatch.delitem(LOWERINGS, "exp")
    x = torch.randn(3, 50)
    with pytest.raises(LoweringError) as err:
        source(softmax.KERNEL, x, torch.empty_like(x), BLOCK=64)
    assert "'exp'" in str(err.value) and "triton" in str(err.value)
    assert err.value.loc is not None and err.value.loc.file.endswith("softmax.py")


def test_a_failing_rule_names_the_op(monkeypatch):
    def broken(cx, op):
        raise RuntimeError("boom")

    monkeypatch.setitem(LOWERINGS, "reduce", broken)
    x = torch.randn(3, 50)
    with pytest.raises(LoweringError, match=r"failed to lower op 'reduce'.*boom"):
        source(softmax.KERNEL, x, torch.empty_like(x), BLOCK=64)


def test_non_power_of_two_tiles_are_a_lowering_error():
    @fly.kernel
    def k(x: fly.Tensor):
        x.tile((10,), 0).store(fly.arange(0, 10).to(fly.fp32))

    with pytest.raises(LoweringError, match=r"power-of-two"):
        source(k, torch.empty(10))


def test_rules_register_once():
    with pytest.raises(LoweringError, match="registered twice"):
        codegen.lower("add")(lambda cx, op: None)


# -- readable source ----------------------------------------------------------------------------


def test_source_is_a_real_jit_function_named_after_the_params():
    gen = mm_gen()
    fn = last_jit_function(gen.source)
    assert fn.name == "matmul"
    assert [d.attr for d in fn.decorator_list] == ["jit"]
    # Used tensors, sizes and strides only: the unit strides were specialized away.
    assert [a.arg for a in fn.args.args] == [p.name for p in gen.params]
    names = [p.name for p in gen.params]
    assert names[:4] == ["a_ptr", "a_size0", "a_size1", "a_stride0"]
    assert "a_stride1" not in names and "c_stride1" not in names
    assert "tl.constexpr" not in gen.source
    # One statement per op, with the printed IR's value numbers and kernel line comments.
    assert re.search(r"v\d+ = tl\.program_id\(0\)  # matmul\.py:\d+", gen.source)
    assert "for v21 in tl.range(0, a_size1, 32, num_stages=2):" in gen.source


def test_value_names_follow_the_printed_ir():
    a, b = matmul.make_inputs((64, 64, 64))
    ir = matmul.KERNEL.ir(a, b, torch.empty(64, 64), BM=32, BN=32, BK=32)
    printed = str(ir)
    m = re.search(r"(%\d+) = dot (%\d+), (%\d+)", printed)
    gen = get_backend("gfx950").generate(ir)
    r, x, y = (s.replace("%", "v") for s in m.groups())
    assert f"{r} = tl.dot({x}, {y}, " in gen.source


def test_source_is_written_to_a_real_file_and_imports(tmp_path, monkeypatch):
    from flydsl_core.backends.triton.compiler import import_source, write_source

    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path))
    gen = mm_gen()
    path = write_source(gen)
    assert path.parent == tmp_path / "triton_src"
    assert path.read_text() == gen.source
    mod = import_source(path)
    import inspect

    assert "\ndef matmul(a_ptr" in inspect.getsource(getattr(mod, gen.name).fn)


def test_param_names_do_not_clash_with_generated_names():
    @fly.kernel
    def k(tl: fly.Tensor, v3: fly.Tensor, range: float):
        v3.tile((16,), 0).store(tl.tile((16,), 0).load() * range)

    gen = source(k, torch.empty(16), torch.empty(16), 2.0)
    names = [p.name for p in gen.params]
    assert names == ["tl_ptr", "tl_size0", "v3_ptr", "v3_size0", "range_arg"]
    compile(gen.source, "<generated>", "exec")


# -- masks and index math ---------------------------------------------------------------------------


def test_masks_only_where_the_ir_has_them():
    # K = 256 is a multiple of BK = 16 (the divisibility facts know 16): a's K mask, whose
    # extent is the loop bound, is proven away; b's K extent is another tensor's size, so
    # its mask stays, but uniform (a scalar test); the M and N ones stay as row/column vectors.
    shape, tiles = (100, 256, 100), {"BM": 64, "BN": 64, "BK": 16}
    a, b = matmul.make_inputs(shape, torch.bfloat16)
    ir = matmul.KERNEL.ir(a, b, torch.empty(100, 100, dtype=torch.bfloat16), **tiles)
    range_masks = [op for op in ir.walk() if op.name == "range_mask"]
    assert len(range_masks) == 5  # a's rows, b's K (uniform) and columns, c's rows and columns
    assert [op.attrs["axis"] for op in range_masks].count(-1) == 1
    body = kernel_body(get_backend("gfx950").generate(ir).source)
    assert body.count("< a_size0") == 1 and body.count("< b_size1") == 1
    assert "< a_size1" not in body
    assert re.search(r"v\d+ = v\d+ < b_size0\n", body), "b's K mask is a scalar test"
    loads = re.findall(r"tl\.load\(([^\n]*)\)", body)
    assert len(loads) == 2 and all("mask=" in x for x in loads)


def test_a_view_without_bounds_checks_has_no_mask():
    @fly.kernel
    def k(x: fly.Tensor, y: fly.Tensor, B: fly.constexpr):
        i = fly.program_id(0)
        y.tile((B,), i).store(x.tile((B,), i).load(bounds_check=False) + 1, bounds_check=False)

    body = kernel_body(source(k, torch.empty(64), torch.empty(64), B=16).source)
    assert "mask" not in body and "tl.where" not in body


def test_uniform_masks_stay_scalar_and_broadcasts_are_lazy():
    x = torch.randn(37, 1000)
    body = kernel_body(source(softmax.KERNEL, x, torch.empty_like(x), BLOCK=1024).source)
    # the row test is one scalar comparison, not a 1024-wide one
    assert re.search(r"v\d+ = v\d+ < x_size0\n", body)
    assert "broadcast_to" not in body  # implicit broadcasting does it


def test_2d_masks_are_row_and_column_vectors():
    body = kernel_body(mm_gen(shape=(100, 200, 100)).source)
    assert re.search(r"tl\.arange\(0, 64\)\[:, None\] < a_size0", body)
    assert re.search(r"tl\.arange\(0, 32\)\[None, :\] < a_size1", body)


def test_int32_offsets_stay_int32():
    body = kernel_body(mm_gen().source)
    assert "int64" not in body


def test_int64_offsets_when_the_spec_says_so():
    a = fly.TensorSpec(torch.float32, (1 << 20,), index_bits=64)
    gen = source(vector_add.KERNEL, a, a, a, BLOCK=1024)
    sig = {p.name: p.sig for p in gen.params}
    assert sig == {
        "x_ptr": "*fp32",
        "x_size0": "i64",
        "y_ptr": "*fp32",
        "y_size0": "i64",
        "out_ptr": "*fp32",
        "out_size0": "i64",
    }


# -- facts handed to Triton ------------------------------------------------------------------------


def test_divisibility_and_pointer_range_attrs():
    gen = mm_gen()  # 128x256 @ 256x128 bf16: every size and leading stride is a multiple of 16
    attrs = {gen.params[i].name: a for (i,), a in gen.attrs().items()}
    assert attrs["a_ptr"] == [["tt.divisibility", 16], ["tt.pointer_range", 32]]
    assert attrs["a_stride0"] == [["tt.divisibility", 16]]
    assert attrs["a_size1"] == [["tt.divisibility", 16]]
    # without pointer_range (the fallback compile for tensors over 2 GiB)
    assert all(["tt.pointer_range", 32] not in a for a in gen.attrs(pointer_range=False).values())
    # NVIDIA has no buffer ops
    nv = mm_gen(target="sm90")
    assert not nv.uses_pointer_range
    assert {nv.params[i].name: a for (i,), a in nv.attrs().items()}["a_ptr"] == [
        ["tt.divisibility", 16]
    ]


def test_sizes_without_facts_get_no_attrs():
    gen = mm_gen(shape=(70, 96, 50))
    attrs = {gen.params[i].name: a for (i,), a in gen.attrs().items()}
    assert "a_size0" not in attrs  # 70
    assert attrs["a_size1"] == [["tt.divisibility", 16]]  # 96


def test_loop_carried_scalars_get_multiple_of_hints():
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, n: int, B: fly.constexpr):
        off = fly.zeros((), fly.int32)
        acc = fly.zeros((B,), fly.fp32)
        for _ in fly.range(0, n):
            acc += x[fly.ds(off, B)].load(bounds_check=False)
            off += B
        out.tile((B,), 0).store(acc, bounds_check=False)

    body = kernel_body(source(k, torch.empty(64), torch.empty(16), 3, B=16).source)
    assert re.search(r"(v\d+) = tl\.multiple_of\(\1, 16\)", body)


# -- op lowerings ------------------------------------------------------------------------------------


def test_maximum_propagates_nan_and_max_reduces_through_it():
    @fly.kernel
    def k(x: fly.Tensor, y: fly.Tensor, out: fly.Tensor, s: fly.Tensor):
        a = x.tile((16,), 0).load()
        out.tile((16,), 0).store(fly.maximum(a, y.tile((16,), 0).load()))
        s[0].store(fly.max(a, 0))

    gen = source(k, torch.empty(16), torch.empty(16), torch.empty(16), torch.empty(1))
    assert "tl.maximum(v" in gen.source and "propagate_nan=tl.PropagateNan.ALL" in gen.source
    assert "tl.reduce(v" in gen.source and "_fly_max_nan" in gen.source


def test_integer_division_and_modulo_are_truncating():
    @fly.kernel
    def k(x: fly.Tensor, y: fly.Tensor, q: fly.Tensor, r: fly.Tensor):
        a, b = x.tile((16,), 0).load(), y.tile((16,), 0).load()
        q.tile((16,), 0).store(a // b)
        r.tile((16,), 0).store(a % b)

    t = torch.empty(16, dtype=torch.int32)
    body = kernel_body(source(k, t, t, t, t).source)
    # Triton's // and % on integers are sdiv/srem: C semantics, which FlyIR has
    assert re.search(r"v\d+ // v\d+", body) and re.search(r"v\d+ % v\d+", body)


def test_fp8_casts_clamp_before_converting():
    @fly.kernel
    def k(x: fly.Tensor, y: fly.Tensor):
        y.tile((16,), 0).store(x.tile((16,), 0).load().to(fly.fp8e4m3))

    gen = source(k, torch.empty(16), torch.empty(16, dtype=torch.float8_e4m3fn))
    assert (
        "tl.clamp(v" in gen.source
        and "-448.0, 448.0, propagate_nan=tl.PropagateNan.ALL).to(tl.float8e4nv)" in gen.source
    )


def test_sort_packs_keys_with_indices():
    @fly.kernel
    def k(x: fly.Tensor, v: fly.Tensor, i: fly.Tensor):
        a, idx = fly.sort(x.tile((16,), 0).load(), 0, return_indices=True)
        v.tile((16,), 0).store(a)
        i.tile((16,), 0).store(idx)

    src = source(k, torch.empty(16), torch.empty(16), torch.empty(16, dtype=torch.int32)).source
    assert "tl.sort(" in src and "<< 32" in src and "tl.gather(" in src


def test_for_stages_and_unroll():
    @fly.kernel
    def k(x: fly.Tensor, n: int):
        acc = fly.zeros((16,), fly.fp32)
        for i in fly.range(0, n, stages=3, unroll=2):
            acc += i
        x.tile((16,), 0).store(acc)

    src = source(k, torch.empty(16), 7).source
    assert "in tl.range(0, n, 1, num_stages=3, loop_unroll_factor=2):" in src


def test_while_recomputes_its_condition():
    @fly.kernel
    def k(out: fly.Tensor, n: int):
        i = fly.zeros((), fly.int32)
        s = fly.zeros((), fly.int32)
        for _ in fly.while_(lambda: i * i < n):  # noqa: B023
            s += i
            i += 1
        out[0].store(s)

    body = kernel_body(source(k, torch.empty(1, dtype=torch.int32), 50).source)
    cond = re.findall(r"(_cond\d+) = (v\d+(?:_\d+)?)", body)
    assert len(cond) == 2 and cond[0][0] == cond[1][0]
    assert f"while {cond[0][0]}:" in body
    assert cond[0][1] != cond[1][1]  # the second copy's temporaries have fresh names


def test_if_assigns_its_results_in_both_branches():
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor):
        t = x.tile((16,), 0).load()
        s = fly.sum(t, 0)
        r = fly.zeros((16,), fly.fp32)
        with fly.if_(s > 0):
            r.set(t * 2)
        with fly.else_():
            r.set(-t)
        out.tile((16,), 0).store(r)

    body = kernel_body(source(k, torch.empty(16), torch.empty(16)).source)
    m = re.search(r"if (v\d+):.*?\n(.*?)\n    else:\n(.*?)\n    (?! )", body, re.S)
    assert m, body
    res = re.findall(r"(v\d+) = ", m.group(2))[-1]
    assert re.findall(r"(v\d+) = ", m.group(3))[-1] == res


# -- targets ---------------------------------------------------------------------------------------------


def test_gpu_source_does_not_upcast_dot_operands():
    gen = mm_gen(torch.bfloat16)
    dots = re.findall(r"tl\.dot\([^\n]*", gen.source)
    assert dots and all(".to(tl.float32)" not in d for d in dots)
    assert "input_precision" not in dots[0]  # bf16 operands: the precision knob is fp32's


def upcast_dot_operands(src: str) -> bool:
    """Every tl.dot's two operands are values converted to fp32 just before."""
    dots = re.findall(r"tl\.dot\((v\d+), (v\d+)", src)
    return bool(dots) and all(
        re.search(rf"\n\s*{x} = v\d+\.to\(tl\.float32\)", src) for d in dots for x in d
    )


def test_interpret_source_upcasts_16_bit_dot_operands():
    for dtype in (torch.bfloat16, torch.float16):
        assert upcast_dot_operands(mm_gen(dtype, target="cpu-interpret").source)
    dots = re.findall(r"tl\.dot\([^\n]*", mm_gen(torch.float32, target="cpu-interpret").source)
    assert ".to(" not in dots[0] and 'input_precision="ieee"' in dots[0]


def test_tf32_only_where_the_target_allows_it():
    @fly.kernel
    def k(a: fly.Tensor, b: fly.Tensor, c: fly.Tensor):
        c.tile((32, 32), (0, 0)).store(
            fly.dot(
                a.tile((32, 32), (0, 0)).load(),
                b.tile((32, 32), (0, 0)).load(),
                input_precision="tf32",
            )
        )

    t = torch.empty(32, 32)
    assert 'input_precision="tf32"' in source(k, t, t, t, target="sm90").source
    assert 'input_precision="tf32"' in source(k, t, t, t, target="gfx942").source
    assert 'input_precision="ieee"' in source(k, t, t, t, target="gfx950").source


def test_triton_options():
    from flydsl_core.backends.triton.compiler import triton_options
    from flydsl_core.targets import get_target

    assert triton_options(get_target("gfx950"), None) == {"num_warps": 4, "num_stages": 2}
    assert triton_options(get_target("sm90"), {}) == {"num_warps": 4, "num_stages": 3}
    amd = {
        "num_warps": 8,
        "waves_per_eu": 2,
        "matrix_instr_nonkdim": 16,
        "kpack": 1,
        "schedule_hint": "none",
    }
    assert triton_options(get_target("gfx942"), amd) == {"num_stages": 2, **amd}
    with pytest.raises(CompileError, match="waves_per_eu"):
        triton_options(get_target("sm90"), {"waves_per_eu": 2})
    assert triton_options(get_target("sm90"), {"maxnreg": 128})["maxnreg"] == 128


def test_one_triton_backend_class_serves_every_triton_target():
    from flydsl_core.backends.triton import TritonBackend

    for name in ("gfx950", "gfx942", "gfx1250", "sm90", "cpu-interpret"):
        b = get_backend(name)
        assert type(b) is TritonBackend and b.target.name == name
        assert b.stores == (name != "cpu-interpret")
    assert get_backend("MI355X") is get_backend("gfx950")  # aliases name the same target
