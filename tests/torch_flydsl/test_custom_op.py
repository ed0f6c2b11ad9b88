"""``torch_flydsl.custom_op``: user FlyDSL kernels as torch ops (eager, fake, torch.compile,
torch.export, AOTInductor, autograd) and the errors for misuse.

Every numeric check compares with a PyTorch reference on fresh random data, at awkward
shapes (M = 1, N = 1, N not a power of two nor a multiple of the block, empty): fp32 within
1e-6 relative (one division and one product per element, both rounded once as torch's),
bf16 within one bf16 ulp (1e-2).

The compile path on this machine (no GPU): Inductor generates C++ for CPU graphs and calls
the op as an extern kernel there, as the ``flydsl::`` GEMM ops; the traced path, the FlyDSL
launches as ``wrap_triton`` kernels, is checked on fake CUDA tensors for gfx950 (the kernel
in the graph) and on CPU tensors traced for ``cpu-interpret`` (Inductor's output code holds
the kernel; AOTAutograd's graph runs through Triton's interpreter).
"""

from __future__ import annotations

import contextlib
import os
import typing

import pytest
import torch

import flydsl_core as fly
import torch_flydsl
from torch_flydsl import graph_launch

from ._graphs import RunTriton, StubDriver, fake, fake_mode

pytestmark = pytest.mark.cpu

BF16 = torch.bfloat16


# -- the kernels and ops under test (the README's example) ----------------------------------------


@fly.kernel
def scale_rows(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
    """``out[r] = x[r] / max(|x[r]|)`` (rows of zeros stay zero)."""
    row = fly.program_id(0)
    peak = fly.zeros((BLOCK,), fly.fp32)
    for j in fly.range(0, x.shape[1], BLOCK):
        t = x[row, fly.ds(j, BLOCK)].load(other=0.0).to(fly.fp32)
        peak.set(fly.maximum(peak, fly.abs(t)))
    s = 1.0 / fly.maximum(fly.max(peak, 0), 1e-30)
    for j in fly.range(0, x.shape[1], BLOCK):
        t = x[row, fly.ds(j, BLOCK)].load().to(fly.fp32)
        out[row, fly.ds(j, BLOCK)].store(t * s)


@fly.kernel
def mul_rows(x: fly.Tensor, s: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
    """``out[r] = x[r] * s[r]``."""
    row = fly.program_id(0)
    f = s[fly.ds(row, 1)].load().to(fly.fp32)
    for j in fly.range(0, x.shape[1], BLOCK):
        t = x[row, fly.ds(j, BLOCK)].load().to(fly.fp32)
        out[row, fly.ds(j, BLOCK)].store(t * f)


@torch_flydsl.custom_op("flydsl_test::scale_rows", mutates_args=())
def scale_rows_op(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    scale_rows[(x.shape[0],)](x, out, BLOCK=64)
    return out


@torch_flydsl.custom_op("flydsl_test::scale_rows_", mutates_args=("x",))
def scale_rows_inplace(x: torch.Tensor) -> None:
    scale_rows[(x.shape[0],)](x, x, BLOCK=64)


@torch_flydsl.custom_op("flydsl_test::mul_rows", mutates_args=())
def mul_rows_op(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    mul_rows[(x.shape[0],)](x, s, out, BLOCK=32)
    return out


def _mul_rows_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _mul_rows_backward(ctx, grad):
    x, s = ctx.saved_tensors
    gx = mul_rows_op(grad, s) if ctx.needs_input_grad[0] else None  # FlyDSL again
    gs = (grad * x).sum(1) if ctx.needs_input_grad[1] else None
    return gx, gs


mul_rows_op.register_autograd(_mul_rows_backward, setup_context=_mul_rows_setup)


def ref_scale(x):
    xf = x.float()
    peak = xf.abs().amax(1, keepdim=True) if x.shape[1] else xf.sum(1, keepdim=True)
    return (xf * (1.0 / peak.clamp_min(1e-30))).to(x.dtype)


def _close(out, ref, dtype=torch.float32):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).mul(3).to(dtype)


SHAPES = [(7, 100), (1, 1), (1, 129), (33, 64), (5, 3), (0, 17)]


@pytest.fixture(autouse=True)
def _fresh():
    torch.manual_seed(0)
    torch_flydsl.reset_stats()
    yield


def _no_compile_caches():
    import torch._functorch.config as functorch_config
    from torch._inductor import config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


@contextlib.contextmanager
def _cpu_traced(arch="gfx950"):
    """CPU tensors traced into ``cpu-interpret`` Triton kernels, with a driver that names a
    target for Inductor's analysis of user kernels (a machine without a GPU has none)."""
    import triton

    prev, prev_target = triton.runtime.driver._active, graph_launch.CPU_TRACE_TARGET
    triton.runtime.driver.set_active(StubDriver(arch))
    graph_launch.CPU_TRACE_TARGET = "cpu-interpret"
    try:
        yield
    finally:
        triton.runtime.driver._active = prev
        graph_launch.CPU_TRACE_TARGET = prev_target


# -- eager -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("shape", SHAPES)
def test_eager_matches_pytorch(shape, dtype):
    x = _rand(*shape, dtype=dtype)
    _close(scale_rows_op(x), ref_scale(x), dtype)
    assert torch_flydsl.stats()["flydsl_test::scale_rows"]["hits"] == 1


def test_eager_on_a_strided_view():
    x = _rand(9, 150)[::2, 10:]  # rows 300 elements apart, columns from 10
    _close(scale_rows_op(x), ref_scale(x))


def test_mutating_op_writes_its_argument():
    x = _rand(6, 90)
    want = ref_scale(x)
    assert scale_rows_inplace(x) is None
    _close(x, want)


def test_opcheck():
    """torch.library's own checks: schema, autograd registration, fake tensor, AOT dispatch."""
    for op, args in (
        (scale_rows_op, (_rand(5, 70),)),
        (mul_rows_op, (_rand(4, 33), _rand(4))),
        (scale_rows_inplace, (_rand(3, 20),)),
    ):
        res = torch.library.opcheck(op, args)
        assert set(res.values()) == {"SUCCESS"}, res


# -- fake tensors --------------------------------------------------------------------------------------


def test_fake_shapes_are_derived_from_the_body():
    mode = fake_mode()
    xf = fake(mode, _rand(11, 40, dtype=BF16), dynamic=(0,))
    with mode:
        out = scale_rows_op(xf)
    assert out.shape == xf.shape and out.dtype == BF16 and out.device == xf.device
    assert isinstance(out.shape[0], torch.SymInt)  # the symbolic batch dim carried through
    assert torch_flydsl.stats().get("flydsl_test::scale_rows", {}).get("hits", 0) == 0  # no run


def test_register_fake_replaces_the_derived_one():
    @torch_flydsl.custom_op("flydsl_test::scale_rows_faked", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        scale_rows[(x.shape[0],)](x, out, BLOCK=64)
        return out

    seen = []

    @op.register_fake
    def _(x):
        seen.append(x.shape)
        return torch.empty_like(x)

    mode = fake_mode()
    with mode:
        assert op(fake(mode, _rand(3, 5))).shape == (3, 5)
    assert seen == [(3, 5)]
    x = _rand(3, 5)
    _close(op(x), ref_scale(x))  # eager still runs the body


# -- torch.compile --------------------------------------------------------------------------------------


def _count_graphs_and_breaks(fn, backend, inputs):
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cnt = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, backend=cnt, fullgraph=True, dynamic=True)
    outs = [compiled(*a) for a in inputs]
    return outs, cnt.frame_count, sum(counters["graph_break"].values())


def test_compile_fullgraph_calls_the_op_from_inductor_output_code():
    """CPU: Inductor calls the op as an extern kernel (its output code names it); one graph
    serves every M, no graph break, results equal eager's."""
    from torch._inductor.graph import GraphLowering

    def f(x):
        return scale_rows_op(x * 2) + 1

    codes = []
    xs = [_rand(m, 100) for m in (7, 2, 33)]
    with _no_compile_caches(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(GraphLowering, "save_output_code", staticmethod(codes.append))
        outs, graphs, breaks = _count_graphs_and_breaks(f, "inductor", [(x,) for x in xs])
    assert breaks == 0 and graphs == 1
    for x, out in zip(xs, outs):
        _close(out, ref_scale(x * 2) + 1)
    assert any("torch.ops.flydsl_test.scale_rows.default(" in c for c in codes)


class _Stop(Exception):
    pass


def test_inductor_output_code_holds_the_flydsl_triton_kernel(monkeypatch):
    """Traced for Triton (here ``cpu-interpret``, as ``graph_launch.CPU_TRACE_TARGET`` does for
    the GEMM ops), the launch is a user Triton kernel in Inductor's output code: FlyDSL's
    generated ``@triton.jit`` source. Inductor then compiles it for the graph's device, which
    a CPU has no Triton backend for: the test stops there."""
    from torch._inductor.graph import GraphLowering
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    codes, compiled = [], []

    def precompile(self, *a, **k):
        compiled.append(self.fn.__name__)
        raise _Stop

    monkeypatch.setattr(GraphLowering, "save_output_code", staticmethod(codes.append))
    monkeypatch.setattr(CachingAutotuner, "precompile", precompile)
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    # compile_threads=1: compile in this process, where the stand-in precompile is (a pool of
    # compile workers, which Inductor may start, would compile for real and fail: no GPU)
    with (
        _no_compile_caches(),
        _cpu_traced(),
        torch._inductor.config.patch(compile_threads=1),
        pytest.raises(Exception) as stop,
    ):
        torch.compile(lambda x: scale_rows_op(x) * 2, fullgraph=True)(_rand(7, 100))
    assert isinstance(stop.value, _Stop) or "_Stop" in repr(stop.value)
    (code,) = codes
    assert "async_compile.triton('scale_rows'" in code and "@triton.jit" in code
    assert "def scale_rows(x_ptr," in code and "tl.store(out_ptr" in code
    assert "flydsl_test.scale_rows" not in code  # the op itself is gone: its kernel is there
    assert compiled == ["scale_rows"]


@pytest.mark.parametrize("inplace", [False, True])
def test_traced_kernels_run_through_tritons_interpreter(inplace):
    """AOTAutograd's graph (the launches as ``triton_kernel_wrapper_functional`` nodes of
    FlyDSL's kernels; an in-place op functionalized) run by Triton's interpreter equals
    PyTorch, at every M of one dynamic graph."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)
        return lambda *a: RunTriton(gm).run(*a)

    def f(x):
        if inplace:
            y = x.clone()
            scale_rows_inplace(y)
            return y * 2
        return scale_rows_op(x) * 2

    RunTriton.launches = []
    xs = [(_rand(m, 100),) for m in (7, 3, 33)]
    with _no_compile_caches(), _cpu_traced():
        outs, n, breaks = _count_graphs_and_breaks(f, aot_autograd(fw_compiler=fw), xs)
    assert breaks == 0 and n == 1
    for (x,), out in zip(xs, outs):
        _close(out, ref_scale(x) * 2)
    assert RunTriton.launches == ["scale_rows"] * 3
    ops = {nd.target for g in graphs for nd in g.graph.nodes}
    assert torch.ops.higher_order.triton_kernel_wrapper_functional in ops
    assert not any("flydsl_test" in str(o) for o in ops)


def test_traced_for_gfx950_on_fake_cuda_tensors():
    """A CUDA graph (fake tensors, no GPU): the launch is FlyDSL's gfx950 Triton kernel with
    the launch options Inductor reads, and the symbolic row count reaches the grid."""
    import triton
    from torch._dispatch.python import enable_python_dispatcher
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.functional_tensor import dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    prev = triton.runtime.driver._active
    triton.runtime.driver.set_active(StubDriver("gfx950"))
    try:
        mode = fake_mode()
        xf = fake(mode, _rand(9, 100, dtype=BF16), (0,), "cuda")
        with graph_launch.assume_arch("gfx950"), mode, enable_python_dispatcher():
            gm = make_fx(dispatch_functionalize(scale_rows_op), tracing_mode="real")(xf)
    finally:
        triton.runtime.driver._active = prev
    (node,) = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
    assert kernel.fn.__name__ == "scale_rows" and "tl.load" in kernel.fn.src
    assert isinstance(node.kwargs["grid"][0][0], torch.fx.Node)  # the symbolic M
    assert node.kwargs["tensors_to_clone"] == ["out_ptr"]


def test_compile_caches_key_on_the_flydsl_sources():
    """AOTAutograd's cache hashes a triton_op's kernels' sources; ours stand for the body's
    FlyDSL kernels and the compiler, so another kernel behind the same body is another key."""
    from torch._inductor.codegen.wrapper import (
        user_defined_triton_kernel_transitive_closure_source_code as source_of,
    )
    from torch._library.triton import get_triton_kernels_for_op

    def key(name):
        (jit,) = list(get_triton_kernels_for_op(name))
        return source_of(jit)

    @fly.kernel
    def other(x: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
        out[fly.program_id(0), fly.ds(0, BLOCK)].store(
            x[fly.program_id(0), fly.ds(0, BLOCK)].load()
        )

    def body(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        k[(x.shape[0],)](x, out, BLOCK=64)
        return out

    k = scale_rows
    torch_flydsl.custom_op("flydsl_test::keyed_a", body, mutates_args=())
    a = key("flydsl_test::keyed_a")
    assert a == key("flydsl_test::keyed_a") and "flydsl_custom_op_" in a
    k = other  # the same body over another kernel
    torch_flydsl.custom_op("flydsl_test::keyed_b", body, mutates_args=())
    b = key("flydsl_test::keyed_b")
    assert a.split("def ")[1] != b.split("def ")[1]


def test_compiled_graphs_with_the_op_are_cached(monkeypatch, tmp_path):
    """With AOTAutograd's and Inductor's caches on, a second compile of the same program is a
    cache hit (the key above is computed, the op is cacheable) and still computes right."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    x = _rand(6, 70)
    with (
        functorch_config.patch(enable_autograd_cache=True),
        inductor_config.patch(fx_graph_cache=True),
    ):
        for _ in range(2):
            torch._dynamo.reset()
            counters.clear()
            out = torch.compile(lambda t: scale_rows_op(t) - 1, fullgraph=True)(x)
            _close(out, ref_scale(x) - 1)
        assert counters["aot_autograd"]["autograd_cache_hit"] == 1


# -- torch.export and AOTInductor ---------------------------------------------------------------------


class _Model(torch.nn.Module):
    def forward(self, x, s):
        return mul_rows_op(scale_rows_op(x), s) + 1


def test_export_keeps_the_op_and_round_trips(tmp_path):
    x, s = _rand(6, 50), _rand(6)
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(_Model(), (x, s), dynamic_shapes=({0: batch}, {0: batch}))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.flydsl_test.scale_rows.default in targets
    assert torch.ops.flydsl_test.mul_rows.default in targets
    path = tmp_path / "model.pt2"
    torch.export.save(ep, path)
    loaded = torch.export.load(path)
    for m in (1, 6, 17):
        x, s = _rand(m, 50), _rand(m)
        want = ref_scale(x) * s[:, None] + 1
        _close(loaded.module()(x, s), want)


def test_export_checks_the_declared_mutations():
    @torch_flydsl.custom_op("flydsl_test::undeclared_write", mutates_args=())
    def bad(x: torch.Tensor) -> torch.Tensor:
        scale_rows[(x.shape[0],)](x, x, BLOCK=64)  # writes x, not declared
        return x.clone()

    class M(torch.nn.Module):
        def forward(self, x):
            return bad(x)

    with pytest.raises(RuntimeError, match=r"kernel scale_rows writes its parameter 'out'.*'x'"):
        torch.export.export(M(), (_rand(3, 5),))


class _Record:
    """A post-grad pass that keeps AOTInductor's lowered graph and stops the compile."""

    graphs: typing.ClassVar[list] = []

    def __call__(self, graph):
        type(self).graphs.append([n.target for n in graph.nodes if n.op == "call_function"])
        raise _Stop

    def uuid(self):
        return "flydsl_test:record"


def test_aoti_lowering_keeps_the_op_on_cpu(tmp_path):
    from torch._inductor.custom_graph_pass import CustomGraphPass

    rec = type("Rec", (_Record, CustomGraphPass), {})()
    _Record.graphs = []
    x, s = _rand(5, 40), _rand(5)
    ep = torch.export.export(_Model(), (x, s))
    with _no_compile_caches(), pytest.raises(Exception) as stop:
        torch._inductor.aoti_compile_and_package(
            ep,
            package_path=str(tmp_path / "m.pt2"),
            inductor_configs={"post_grad_custom_post_pass": rec},
        )
    assert isinstance(stop.value, _Stop) or "_Stop" in repr(stop.value)
    (targets,) = _Record.graphs
    assert torch.ops.flydsl_test.scale_rows.default in targets
    assert torch.ops.flydsl_test.mul_rows.default in targets


@pytest.mark.skipif(
    os.environ.get("FLYDSL_TEST_AOTI") != "1", reason="opt-in (FLYDSL_TEST_AOTI=1): minutes"
)
def test_aoti_package_runs_on_cpu(tmp_path):
    x, s = _rand(5, 40), _rand(5)
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(_Model(), (x, s), dynamic_shapes=({0: batch}, {0: batch}))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    for m in (1, 5, 40):
        x, s = _rand(m, 40), _rand(m)
        _close(runner(x, s), ref_scale(x) * s[:, None] + 1)


@pytest.mark.gpu
def test_compile_on_gpu_holds_the_kernel():
    """On a GPU the output code holds FlyDSL's Triton kernel and runs it."""
    from torch._inductor.utils import run_and_get_code

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    x = _rand(37, 1000, dtype=BF16).cuda()
    out, codes = run_and_get_code(torch.compile(scale_rows_op, fullgraph=True), x)
    _close(out.cpu(), ref_scale(x.cpu()), BF16)
    assert any("async_compile.triton('scale_rows'" in c for c in codes)


# -- autograd -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7, 100), (1, 1), (4, 33)])
def test_autograd_through_register_autograd(shape):
    x = _rand(*shape).requires_grad_()
    s = _rand(shape[0]).requires_grad_()
    g = _rand(*shape)
    out = mul_rows_op(x, s)
    gx, gs = torch.autograd.grad(out, (x, s), g)
    xr, sr = x.detach().requires_grad_(), s.detach().requires_grad_()
    rx, rs = torch.autograd.grad(xr * sr[:, None], (xr, sr), g)
    _close(out.detach(), (x * s[:, None]).detach())
    _close(gx, rx)
    torch.testing.assert_close(gs, rs, rtol=1e-5, atol=1e-5)  # torch's sum either way
    assert torch_flydsl.stats()["flydsl_test::mul_rows"]["hits"] == 2  # forward + backward


def test_autograd_under_compile():
    x, s = _rand(5, 48).requires_grad_(), _rand(5).requires_grad_()

    def f(x, s):
        return (mul_rows_op(x, s) ** 2).sum()

    with _no_compile_caches():
        import torch._dynamo

        torch._dynamo.reset()
        loss = torch.compile(f, fullgraph=True)(x, s)
    gx, gs = torch.autograd.grad(loss, (x, s))
    xr, sr = x.detach().requires_grad_(), s.detach().requires_grad_()
    rx, rs = torch.autograd.grad(((xr * sr[:, None]) ** 2).sum(), (xr, sr))
    torch.testing.assert_close(gx, rx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gs, rs, rtol=1e-5, atol=1e-4)


# -- the project's own op: transformers' RMSNorm route -------------------------------------------------


def test_hf_rms_norm_traces_into_flydsl_kernels():
    """``flydsl::hf_rms_norm`` is a ``torch_flydsl.custom_op``: under AOTAutograd its
    launch is FlyDSL's RMSNorm kernel (run here by Triton's interpreter), not an opaque call."""
    from torch._dynamo.backends.common import aot_autograd

    from torch_flydsl.library import hf as _ops

    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)
        return lambda *a: RunTriton(gm).run(*a)

    def f(x, w):
        return _ops.hf_rms_norm(x, w, 1e-6, _ops.MODE_LLAMA)

    RunTriton.launches = []
    w = _rand(96, dtype=BF16)
    xs = [(_rand(m, 96, dtype=BF16), w) for m in (5, 1)]
    with _no_compile_caches(), _cpu_traced():
        outs, _, breaks = _count_graphs_and_breaks(f, aot_autograd(fw_compiler=fw), xs)
    assert breaks == 0
    for (x, _w), out in zip(xs, outs):
        want = _ops.norm_reference(x, w, 1e-6, _ops.MODE_LLAMA)
        torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert RunTriton.launches and all("rmsnorm" in k for k in RunTriton.launches)
    ops = {str(nd.target) for g in graphs for nd in g.graph.nodes}
    assert not any("hf_rms_norm" in o for o in ops)


# -- misuse ---------------------------------------------------------------------------------------------


def _define(name="flydsl_test::misuse", mutates_args=(), schema=None, fn=None):
    def body(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    return torch_flydsl.custom_op(name, fn or body, mutates_args=mutates_args, schema=schema)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("scale_rows", r"form \"namespace::name\""),
        ("a::b::c", r"form \"namespace::name\""),
        ("::x", r"form \"namespace::name\""),
        ("my-lib::x", r"namespace 'my-lib' is not a Python identifier"),
        ("mylib::2x", r"op name '2x' is not a Python identifier"),
        ("aten::my_op", r"namespace 'aten' is reserved for PyTorch"),
    ],
)
def test_bad_names(name, match):
    with pytest.raises(ValueError, match=match):
        _define(name)


def test_name_must_be_a_string():
    with pytest.raises(TypeError, match=r"the name is a string"):
        _define(3)


def test_mutates_args_mismatches():
    with pytest.raises(ValueError, match=r"mutates_args names \['y'\] but body has no such"):
        _define(mutates_args=("y",))
    with pytest.raises(ValueError, match=r"mutates_args='x': give the names"):
        _define(mutates_args="x")

    def scaled(x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k

    with pytest.raises(ValueError, match=r"mutates_args names 'k', annotated int; only Tensor"):
        _define(fn=scaled, mutates_args=("k",))
    with pytest.raises(ValueError, match=r"schema suggests that the op mutates"):
        _define(mutates_args=("x",), schema="(Tensor x) -> Tensor")


def test_undeclared_write_is_an_error_in_eager():
    @torch_flydsl.custom_op("flydsl_test::undeclared_eager", mutates_args=())
    def bad(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mul_rows[(x.shape[0],)](x, torch.ones(x.shape[0]), y[:, :], BLOCK=32)  # writes y
        return x.clone()

    x = _rand(3, 8)
    with pytest.raises(
        RuntimeError,
        match=r"writes its parameter 'out', which is \(a view of\) the op's argument 'y'",
    ):
        bad(x, torch.zeros(3, 8))
    with pytest.raises(RuntimeError, match=r"Add 'y' to mutates_args"):
        bad(x, torch.zeros(3, 8))  # the second call takes the cached path: still caught


@pytest.mark.parametrize(
    ("fn_src", "match"),
    [
        ("def f(x): return x", r"Parameter x must have a type annotation"),
        ("def f(x: torch.Tensor): return x", r"No return type annotation"),
        ("def f(x: dict) -> torch.Tensor: return x", r"Parameter x has unsupported type"),
        ("def f(*xs: torch.Tensor) -> torch.Tensor: return xs[0]", r"varargs"),
    ],
)
def test_schema_inference_failures_name_the_problem(fn_src, match):
    ns: dict = {"torch": torch}
    exec(fn_src, ns)
    with pytest.raises(
        ValueError, match=r"cannot infer the op's schema from the annotations of f"
    ) as e:
        _define(fn=ns["f"])
    assert e.match(match)


def test_the_readme_example_runs():
    """README.md's example, as written there, against PyTorch (eager and compiled)."""
    import pathlib
    import re

    readme = pathlib.Path(__file__).parents[2] / "README.md"
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", readme.read_text(), re.S) if "custom_op(" in b
    ]
    ns: dict = {}
    exec(compile(block, str(readme), "exec"), ns)
    x = _rand(9, 130)
    _close(ns["scale_rows_op"](x), ref_scale(x))
    with _no_compile_caches():
        import torch._dynamo

        torch._dynamo.reset()
        _close(torch.compile(ns["scale_rows_op"], fullgraph=True)(x), ref_scale(x))
