"""The launch path: bound calls reuse compiles exactly when their specializations agree."""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core import backends
from flydsl_core.exc import ArgumentError
from flydsl_core.runtime.binder import generic_key, make_key_fn

pytestmark = pytest.mark.cpu


class _Recorder(backends.Backend, backends.Executable):
    """A backend that counts compiles and records launches instead of running them."""

    def __init__(self):
        self.compiles = 0
        self.launches = []

    def compile(self, fn, spec, options):
        self.compiles += 1
        return self

    def launch(self, grid, args):
        self.launches.append((grid, args))


@pytest.fixture
def rec():
    r = _Recorder()
    with backends.temporary("recorder", r):
        yield r


def _kernel():
    @fly.kernel
    def scale(x: fly.Tensor, out: fly.Tensor, n: int, alpha, BLOCK: fly.constexpr):
        i = fly.program_id(0)
        out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load() * alpha)

    return scale


def test_hits_skip_compiles_and_pass_fresh_arguments(rec):
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    k[(4,)](x, o, 64, 2.0, BLOCK=16, target="recorder")
    x2, o2 = torch.randn(64), torch.empty(64)
    k[(4,)](x2, o2, 64, 3.0, BLOCK=16, target="recorder")
    assert rec.compiles == 1
    assert (
        rec.launches[1][1][0] is x2 and rec.launches[1][1][2] == 64 and rec.launches[1][1][3] == 3.0
    )
    assert rec.launches[1][0] == (4, 1, 1)


def test_constexpr_values_are_never_confused(rec):
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    k[(4,)](x, o, 64, 2.0, 16, target="recorder")  # BLOCK passed positionally
    k[(2,)](x, o, 64, 2.0, 32, target="recorder")
    k[(2,)](x, o, 64, 2.0, BLOCK=32, target="recorder")
    assert rec.compiles == 2


def test_new_facts_compile_again(rec):
    k = _kernel()
    k[(1,)](torch.randn(64), torch.empty(64), 64, 1.0, BLOCK=16, target="recorder")
    k[(1,)](
        torch.randn(63), torch.empty(63), 63, 1.0, BLOCK=16, target="recorder"
    )  # n no longer % 16
    k[(1,)](
        torch.randn(80), torch.empty(80), 80, 1.0, BLOCK=16, target="recorder"
    )  # same facts as 64
    k[(1,)](
        torch.randn(64).to(torch.bfloat16),
        torch.empty(64, dtype=torch.bfloat16),
        64,
        1.0,
        BLOCK=16,
        target="recorder",
    )
    base = torch.randn(65)
    k[(1,)](base[1:], torch.empty(64), 64, 1.0, BLOCK=16, target="recorder")  # misaligned data
    assert rec.compiles == 4  # 64; 63; bf16; misaligned (80 shares 64's facts)


def test_generated_and_generic_keys_agree_on_equality():
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    gen = make_key_fn(k)
    calls = [
        ((x, o, 64, 2.0), {"BLOCK": 16}),
        ((x, o, 64, 5.0), {"BLOCK": 16}),
        ((x, o, 63, 2.0), {"BLOCK": 16}),
    ]
    g = [gen(*a, **kw) for a, kw in calls]
    p = [generic_key(k, a, kw) for a, kw in calls]
    assert (g[0] == g[1]) and (p[0] == p[1])
    assert (g[0] != g[2]) and (p[0] != p[2])


def test_unannotated_parameters_key_as_the_generic_key_does():
    """Unannotated parameters (attention's kernels have 30) take an inline key for None,
    tensors, ints and floats: two calls share a key exactly when the generic key says so."""

    @fly.kernel
    def anything(x, y, n, a, flag, BLOCK: fly.constexpr):
        pass

    gen = make_key_fn(anything)
    x, o = torch.randn(64), torch.empty(64)
    param = torch.nn.Parameter(torch.randn(64))  # a subclass: the generic part, same facts
    values = [
        (x, None, 64, 2.0, True), (x, None, 64, 3.0, True), (x, o, 64, 2.0, True),
        (x, None, 63, 2.0, True), (x, None, 64, 2, True), (x, None, 64, 2.0, 1),
        (x, None, 64, 2.0, False), (x[1:], None, 64, 2.0, True), (x.double(), None, 64, 2.0, True),
        (param, None, 64, 2.0, True), (x, None, 1, 2.0, True), (x, None, 2**31, 2.0, True),
        (x, (1, 2), 64, 2.0, True), (x, "s", 64, 2.0, True),
    ]  # fmt: skip
    g = [gen(*v, BLOCK=16) for v in values]
    p = [generic_key(anything, v, {"BLOCK": 16}) for v in values]
    for i in range(len(values)):
        for j in range(len(values)):
            assert (g[i] == g[j]) == (p[i] == p[j]), (values[i], values[j])
    assert g[0] == g[1] and g[0] != g[2] and g[0] != g[4]  # floats share one key; 2 is an int
    assert "_generic(" in gen.__flydsl_source__ and "_NONE if x is None" in gen.__flydsl_source__


def test_a_kernel_without_parameters_binds_and_launches(rec):
    """The generated binder has no empty argument list to trip on (``def key(, **_kw)`` was a
    SyntaxError at decoration)."""

    @fly.kernel
    def noop():
        pass

    assert make_key_fn(noop)() == (None,) and make_key_fn(noop)() != make_key_fn(noop)(a=1)
    noop[(3,)](target="recorder")
    noop[(3,)](target="recorder")
    assert rec.compiles == 1 and [g for g, _ in rec.launches] == [(3, 1, 1)] * 2


def test_keyword_tensors_and_grid_functions(rec):
    k = _kernel()
    x, o = torch.randn(40), torch.empty(40)
    k[lambda a: (fly.cdiv(a["n"], a["BLOCK"]),)](
        x=x, out=o, n=40, alpha=1.0, BLOCK=16, target="recorder"
    )
    assert rec.launches[-1][0] == (3, 1, 1)
    assert rec.launches[-1][1][0] is x


def test_grids_normalize_and_bad_grids_fail_even_after_good_ones(rec):
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    for grid, want in [
        (4, (4, 1, 1)),
        ((2, 3), (2, 3, 1)),
        ((4,), (4, 1, 1)),
        ((1, 2, 3), (1, 2, 3)),
    ]:
        for _ in range(2):  # the second call takes the cached grid
            k[grid](x, o, 64, 1.0, BLOCK=16, target="recorder")
            assert rec.launches[-1][0] == want
    k[(torch.tensor(5),)](x, o, 64, 1.0, BLOCK=16, target="recorder")
    assert rec.launches[-1][0] == (5, 1, 1)
    for bad in [(-1,), (1, 2, 3, 4), (), (1.9,), (4.0,), "a", (1, "2"), (True,), None, 2.5]:
        with pytest.raises(ArgumentError, match="a launch grid is an int or a tuple of 1 to 3"):
            k[bad](x, o, 64, 1.0, BLOCK=16, target="recorder")
    assert rec.launches[-1][0] == (5, 1, 1)  # nothing bad was launched


def test_runtime_arguments_mix_positions_and_keywords(rec):
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    for alpha in (2.0, 3.0):
        k[(4,)](x, o, alpha=alpha, n=64, BLOCK=16, target="recorder")
        got = rec.launches[-1][1]
        assert got[0] is x and got[1] is o and got[2] == 64 and got[3] == alpha


def _noop_gpu_executable(kernel, target, *tensors, **constexprs):
    """A real compiled executable for ``target`` whose device side is a recorder (no GPU)."""
    import types

    ck = kernel.compile(*tensors, target=target, **constexprs)
    exe = ck.executable
    runs = []

    def fake(real):
        return types.SimpleNamespace(
            run=lambda *a: runs.append(real),
            function=None,
            packed_metadata=None,
            launch_metadata=None,
        )

    full, fallback = fake("pointer-range"), fake("fallback")
    exe.compiled = full
    exe.without_pointer_range = lambda: fallback
    hooks = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    exe._launcher._bound = (lambda: 0, lambda dev: 0, hooks)
    return exe, runs


def test_gpu_host_checks_reject_cpu_tensors_and_pick_the_2gb_fallback():
    from flydsl_core.backends.triton.launcher import TritonLaunchError

    @fly.kernel
    def copy(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
        i = fly.program_id(0)
        out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load())

    meta = [torch.empty(256, device="meta") for _ in range(2)]
    exe, runs = _noop_gpu_executable(copy, "gfx950", *meta, BLOCK=64)
    assert exe._launcher.tensor_args == [0, 1]
    exe.launch((4, 1, 1), tuple(meta))
    assert runs == ["pointer-range"]
    with pytest.raises(TritonLaunchError, match=r"arguments \[1\] are not GPU tensors"):
        exe.launch((4, 1, 1), (meta[0], torch.empty(256)))
    # a view into a storage over 2 GiB must not use 32-bit buffer offsets
    big = torch.empty(2**31 + 1024, dtype=torch.uint8, device="meta")[:1024].view(torch.float32)
    exe.launch((4, 1, 1), (big, meta[1]))
    assert runs[-1] == "fallback"


# -- handing kernels to another framework ------------------------------------------------------------


def test_launch_sink_takes_launches_over(rec):
    from flydsl_core import launch_sink

    k = _kernel()
    x = torch.zeros(8)
    seen, inner = [], []
    with launch_sink(lambda *a: seen.append(a)):
        k[(2,)](x, x, 8, 2.0, BLOCK=4, target="recorder")
        with launch_sink(lambda *a: inner.append(a)):
            k[(3,)](x, x, 8, 2.0, BLOCK=4, target="recorder")
        k[(4,)](x, x, 8, 2.0, BLOCK=4, target="recorder")  # the outer sink is back
    assert [s[1] for s in seen] == [(2,), (4,)] and [s[1] for s in inner] == [(3,)]
    kernel, _grid, args, kwargs = seen[0]
    assert kernel is k and args[0] is x and kwargs == {"BLOCK": 4, "target": "recorder"}
    assert rec.compiles == 0 and rec.launches == []  # nothing compiled or run
    k[(1,)](x, x, 8, 2.0, BLOCK=4, target="recorder")
    assert rec.compiles == 1 and len(rec.launches) == 1  # no sink: the usual path
    # a sink is its thread's: a launch on another thread meanwhile takes the usual path
    import threading

    with launch_sink(lambda *a: seen.append(a)):
        t = threading.Thread(target=lambda: k[(5,)](x, x, 8, 2.0, BLOCK=4, target="recorder"))
        t.start()
        t.join()
    assert len(rec.launches) == 2 and rec.launches[-1][0] == (5, 1, 1) and len(seen) == 2


def test_triton_function_generates_without_compiling():
    from triton.runtime.jit import JITFunction

    from flydsl_core import TensorSpec
    from flydsl_core.runtime import store

    k = _kernel()
    compiled = []
    store.on_compile.append(lambda name, target: compiled.append(name))
    try:
        spec = TensorSpec("fp32", (None,))
        jit, gen = k.triton_function(spec, spec, 3, 2.0, BLOCK=64, target="gfx950")
        again, _ = k.triton_function(spec, spec, 3, 2.0, BLOCK=64, target="gfx950")
    finally:
        store.on_compile.pop()
    assert isinstance(jit, JITFunction) and again is jit and not compiled
    assert [p.name for p in jit.params] == [p.name for p in gen.params]
    assert {p.kind for p in gen.params} <= {"tensor", "shape", "stride", "scalar"}
    with pytest.raises(ArgumentError, match="does not generate Triton"):
        k.triton_function(spec, spec, 3, 2.0, BLOCK=64, target="cpu-reference")


def test_generated_launch_hands_out_the_source_its_options_and_arguments():
    """The public hand-over another framework uses (torch-flydsl's traced launches): the
    launch options split as a launch splits them, the generated function for the given specs,
    the options a compile would use, and its arguments read from the launch's values."""
    from flydsl_core import TensorSpec, generated_launch, split_launch_options

    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    kwargs, target, options = split_launch_options(
        k, {"BLOCK": 16, "target": "interpret", "num_warps": 2}
    )
    assert (kwargs, target, options) == ({"BLOCK": 16}, "interpret", {"num_warps": 2})
    bound = k.bind((x, o, 64, 2.0), kwargs)
    spec = TensorSpec("fp32", (None,))
    gl = generated_launch(k, {**bound, "x": spec, "out": spec}, target=target, options=options)
    assert gl.target == "cpu-interpret" and gl.options == {"num_warps": 2, "num_stages": 2}
    assert gl.runtime == ("x", "out", "n", "alpha")
    args = gl.arguments(bound)
    assert len(args) == len(gl.generated.params) == len(gl.function.params)
    assert args[0] is x and any(a is o for a in args)
    with pytest.raises(ArgumentError, match="does not generate Triton"):
        generated_launch(k, bound, target="cpu-reference")
    gpu = generated_launch(k, {**bound, "x": spec, "out": spec}, target="gfx950", options={})
    assert gpu.options == {"num_warps": 4, "num_stages": 2}  # the compile's defaults


# -- the in-process cache covers what the disk key covers (issue 14) -------------------------

_SCALE = 2.0
_OFFSETS = [1.0]


def _helper(t):
    return t * _SCALE


@fly.kernel
def _scaled(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
    i = fly.program_id(0)
    out.tile((BLOCK,), i).store(_helper(x.tile((BLOCK,), i).load()) + _OFFSETS[0])


def _run_scaled(x):
    out = torch.empty_like(x)
    _scaled[(fly.cdiv(x.numel(), 16),)](x, out, BLOCK=16, target="cpu-reference")
    return out


def test_changed_globals_helpers_and_code_are_not_served_stale(monkeypatch):
    x = torch.randn(40)
    torch.testing.assert_close(_run_scaled(x), x * 2.0 + 1.0)
    g = globals()
    monkeypatch.setitem(g, "_SCALE", 3.0)  # a global constant the kernel reads
    torch.testing.assert_close(_run_scaled(x), x * 3.0 + 1.0)
    monkeypatch.setitem(g, "_helper", lambda t: t - _SCALE)  # a redefined helper
    torch.testing.assert_close(_run_scaled(x), x - 3.0 + 1.0)
    _OFFSETS[0] = 5.0  # a mutable constant changed in place
    try:
        torch.testing.assert_close(_run_scaled(x), x - 3.0 + 5.0)
    finally:
        _OFFSETS[0] = 1.0
    _OFFSETS[0] = 5.0

    def other(t):
        return t * 10.0

    helper = g["_helper"]
    monkeypatch.setattr(helper, "__code__", other.__code__)  # a helper patched in place
    try:
        torch.testing.assert_close(_run_scaled(x), x * 10.0 + 5.0)
    finally:
        _OFFSETS[0] = 1.0


def test_closures_are_covered_and_equal_values_keep_the_compile(rec):
    factor = 2.0

    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
        i = fly.program_id(0)
        out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load() * factor)

    x, o = torch.randn(32), torch.empty(32)
    k[(2,)](x, o, BLOCK=16, target="recorder")
    factor = float("2.0")  # a new object with the same value: the same fingerprint
    k[(2,)](x, o, BLOCK=16, target="recorder")
    assert rec.compiles == 1
    factor = 4.0
    k[(2,)](x, o, BLOCK=16, target="recorder")
    assert rec.compiles == 2


def _forbid_tracing(monkeypatch):
    from flydsl_core.passes import manager
    from flydsl_core.trace import context

    def fail(*a, **k):
        raise AssertionError("traced or ran a pass on a cache hit")

    monkeypatch.setattr(context.TraceContext, "__init__", fail)
    for name in list(manager.PASSES):
        monkeypatch.setitem(manager.PASSES, name, fail)


def test_a_memory_hit_neither_traces_nor_runs_passes(rec, monkeypatch):
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    k[(4,)](x, o, 64, 2.0, BLOCK=16, target="recorder")
    _forbid_tracing(monkeypatch)
    k[(4,)](x, o, 64, 3.0, BLOCK=16, target="recorder")  # the fast path
    k.compile(x, o, 64, 3.0, BLOCK=16, target="recorder")  # the keyed path
    assert rec.compiles == 1 and len(rec.launches) == 2


@pytest.mark.compile
def test_a_disk_hit_neither_traces_nor_runs_passes(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from flydsl_core.runtime import store
    from flydsl_core.runtime.kernel import Kernel

    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(store, "PRELOADED", {})
    meta = [torch.empty(256, device="meta") for _ in range(2)]
    cold = Kernel(_scaled.fn).compile(*meta, target="gfx950", BLOCK=64)
    _forbid_tracing(monkeypatch)
    monkeypatch.setattr(store, "on_compile", [_forbid_tracing])  # and no compile either
    warm = Kernel(_scaled.fn).compile(*meta, target="MI355X", BLOCK=64)  # an alias
    assert warm.key == cold.key and warm.target == "gfx950"
    assert warm.executable.stages()["hsaco"] == cold.executable.stages()["hsaco"]


def test_tensor_parameters_given_numbers_or_none_name_the_parameter(rec):
    @fly.kernel
    def annotated(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
        out.tile((BLOCK,), 0).store(x.tile((BLOCK,), 0).load())

    @fly.kernel
    def plain(x, out, BLOCK: fly.constexpr):
        out.tile((BLOCK,), 0).store(x.tile((BLOCK,), 0).load())

    o = torch.empty(8)
    for k, bad, got in [
        (annotated, 3, "int 3"),
        (annotated, None, "None"),
        (annotated, 2.5, "float 2.5"),
        (plain, 3, "an int"),
        (plain, None, "None"),
    ]:
        with pytest.raises(
            ArgumentError,
            match=rf"parameter 'x' .*tensor.* got {got}|parameter 'x' got {got}.*tensor",
        ):
            k[(1,)](bad, o, BLOCK=8, target="cpu-reference")


def test_a_kernel_cannot_launch_or_call_another():
    @fly.kernel
    def inner(x: fly.Tensor, BLOCK: fly.constexpr):
        x.tile((BLOCK,), 0).store(x.tile((BLOCK,), 0).load())

    @fly.kernel
    def launches(x: fly.Tensor, BLOCK: fly.constexpr):
        inner[(1,)](x, BLOCK=BLOCK)

    @fly.kernel
    def calls(x: fly.Tensor, BLOCK: fly.constexpr):
        inner(x, BLOCK=BLOCK)

    x = torch.zeros(8)
    for k in (launches, calls):
        with pytest.raises(ArgumentError, match=f"kernel inner was .* inside kernel {k.name}"):
            k[(1,)](x, BLOCK=8, target="cpu-reference")
    with pytest.raises(ArgumentError, match=r"inner\[grid\]"):
        inner(x, BLOCK=8)
