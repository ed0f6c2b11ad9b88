"""The eager dispatch path on the CPU test backend: registration, predicates, gates, fallback,
out=, autograd, determinism, switches, precedence, torch.compile, and ATen's own errors."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_flydsl
from torch_flydsl import dispatch, gates
from torch_flydsl.ops import _kernels
from torch_flydsl.ops import topk as topk_spec

pytestmark = pytest.mark.cpu

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def _s(op):
    return torch_flydsl.stats().get(op, {"calls": 0, "hits": 0, "fallbacks": {}})


def _kernel_of(op, key="CPU"):
    return repr(torch.library.get_kernel(f"aten::{op}", key))


# -- registration and switches ------------------------------------------------------------------


def test_enable_registers_and_disable_restores_aten(cpu_backend):
    assert "dispatch.py" in _kernel_of("topk")
    assert "dispatch.py" in _kernel_of("topk.values")
    assert "dispatch.py" in _kernel_of("_fused_rms_norm")
    assert "dispatch.py" in _kernel_of("_fused_rms_norm_backward")
    torch_flydsl.disable()
    assert "RegisterCPU" in _kernel_of("topk")
    assert "CompositeImplicitAutograd" in _kernel_of("_fused_rms_norm")
    assert not torch_flydsl.enabled()


def test_per_op_switch(cpu_backend):
    torch_flydsl.disable()
    torch_flydsl.enable(ops=["topk"], device="cpu")
    assert torch_flydsl.enabled("topk") and not torch_flydsl.enabled("rms_norm")
    assert "dispatch.py" in _kernel_of("topk")
    assert "CompositeImplicitAutograd" in _kernel_of("_fused_rms_norm")
    torch_flydsl.enable(ops="rms_norm", device="cpu")
    assert torch_flydsl.enabled("rms_norm")
    torch_flydsl.disable(ops=["topk"])
    assert not torch_flydsl.enabled("topk") and torch_flydsl.enabled("rms_norm")
    with pytest.raises(ValueError, match="is unknown"):
        torch_flydsl.enable(ops=["nope"], device="cpu")
    with pytest.raises(ValueError, match="no eager override"):
        torch_flydsl.enable(ops=["gemm"], device="cpu")  # torch.compile only


def test_enable_leaves_an_op_aten_has_no_kernel_for(cpu_backend, monkeypatch, caplog):
    # torch 2.11 has aten::_scaled_mm_v2 with no CPU kernel: with nothing to fall back to, the
    # group's other overloads are installed and that one is left to ATen's own error
    torch_flydsl.disable()
    real = dispatch.capture
    monkeypatch.setattr(
        dispatch, "capture", lambda op, key: None if op == "topk.values" else real(op, key)
    )
    with caplog.at_level("INFO", logger="torch_flydsl"):
        torch_flydsl.enable(ops=["topk"], device="cpu")
    assert "dispatch.py" in _kernel_of("topk")
    assert "dispatch.py" not in _kernel_of("topk.values")
    assert "ATen has no kernel for topk.values here; not overridden" in caplog.text
    x = torch.randn(5, 37)
    vals, idx = torch.topk(x, 3)  # ours, through the installed overload
    ref = x.sort(-1, descending=True)
    torch.testing.assert_close(vals, ref.values[:, :3], rtol=0, atol=0)
    assert torch.equal(idx, ref.indices[:, :3])
    assert _s("topk")["calls"] >= 1


def test_disabled_context_manager(cpu_backend):
    x = torch.randn(3, 16)
    with torch_flydsl.disabled():
        assert not torch_flydsl.enabled()
        torch.topk(x, 2)
    assert torch_flydsl.enabled("topk") and torch_flydsl.enabled("rms_norm")
    assert _s("topk")["calls"] == 0
    torch.topk(x, 2)
    assert _s("topk") == {"calls": 1, "hits": 1, "fallbacks": {}}


def test_status_content(cpu_backend):
    st = torch_flydsl.status()
    assert st["usable"] and st["why_not"] is None
    assert st["device"] == "cpu" and st["arch"] == "cpu" and st["dispatch_key"] == "CPU"
    assert st["enabled"] == [g for g in torch_flydsl.OPS if g != "sdpa"]  # sdpa is opt-in
    assert st["ops"]["topk"]["state"] == "enabled"
    assert "aten::topk.values@CPU" in st["ops"]["topk"]["overrides"]
    assert "RegisterCPU" in st["ops"]["topk"]["fallback_to"]["aten::topk@CPU"]
    assert st["precedence"] == "ours"
    torch_flydsl.disable()
    assert torch_flydsl.status("cpu")["ops"]["topk"]["state"] == "off"


def test_status_without_gpu_says_why():
    st = torch_flydsl.status("cuda")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert not st["usable"] and st["why_not"]
    assert st["enabled"] == []


def test_import_compiles_nothing_and_touches_no_gpu():
    code = (
        "import sys, torch, torch_flydsl\n"
        "assert not torch.cuda.is_initialized()\n"
        "kernels = {m for m in sys.modules if m.startswith('flydsl_kernels')}\n"
        # the families' dtype lists only (a torch-only module): no kernel family
        "assert kernels <= {'flydsl_kernels', 'flydsl_kernels.supported'}, kernels\n"
        "assert not torch_flydsl.enabled()\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYDSL_TORCH")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_env_enables_at_import():
    code = (
        "import torch, torch_flydsl, json\n"
        "v, i = torch.topk(torch.randn(2, 8), 3)\n"
        "print(json.dumps([torch_flydsl.status()['enabled'], torch_flydsl.stats()['topk']]))\n"
    )
    env = {**os.environ, "FLYDSL_TORCH": "1", "FLYDSL_TORCH_DEVICE": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    enabled, st = json.loads(out.stdout.strip().splitlines()[-1])
    # sdpa is opt-in; rms_norm is opt-in on the CPU (stock CPU decomposes F.rms_norm)
    assert enabled == [g for g in torch_flydsl.OPS if g not in ("sdpa", "rms_norm")]
    assert st["hits"] == 1


def test_enable_on_cpu_leaves_rms_norm_to_stock_torch(cpu_backend):
    """``enable(device="cpu")`` does not reroute F.rms_norm through ``_fused_rms_norm`` (stock
    CPU decomposes it); ``ops=["rms_norm"]`` opts in."""
    torch_flydsl.disable()
    torch_flydsl.enable(device="cpu")
    assert torch_flydsl.enabled("topk") and not torch_flydsl.enabled("rms_norm")
    assert "CompositeImplicitAutograd" in _kernel_of("_fused_rms_norm")
    st = torch_flydsl.status("cpu")["ops"]["rms_norm"]
    assert st["state"] == "off" and "opt-in on cpu" in st["why"]
    x = torch.randn(3, 8, requires_grad=True)
    y = torch.nn.functional.rms_norm(x, (8,))
    assert type(y.grad_fn).__name__ != "FusedRmsNormBackward0"  # stock CPU's decomposition
    assert _s("_fused_rms_norm")["calls"] == 0
    torch_flydsl.enable(ops=["rms_norm"], device="cpu")
    y = torch.nn.functional.rms_norm(x, (8,))
    assert type(y.grad_fn).__name__ == "FusedRmsNormBackward0"


def test_calibrate_refuses_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from torch_flydsl.calibrate import main

    assert main(["calibrate"]) == 2
    out = subprocess.run(
        [sys.executable, "-m", "torch_flydsl.calibrate", "calibrate"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "found none" in out.stderr and "GPU" in out.stderr


# -- topk -----------------------------------------------------------------------------------------


def _check_topk(x, k, dim=-1, largest=True, sorted=True):
    v, i = torch.topk(x, k, dim, largest, sorted)
    with torch_flydsl.disabled():
        rv, ri = torch.topk(x, k, dim, largest, sorted)
    assert v.dtype == rv.dtype and i.dtype == ri.dtype == torch.int64 and v.shape == rv.shape
    if sorted:
        torch.testing.assert_close(v, rv, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(v.sort(dim)[0], rv.sort(dim)[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x.gather(dim, i), v, rtol=0, atol=0, equal_nan=True)
    return v, i, rv, ri


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", [((4, 64), 5), ((2, 3, 33), 1), ((7,), 7), ((3, 300), 17)])
def test_topk_hits_and_matches_aten(cpu_backend, dtype, shape, k):
    x = torch.randperm(torch.Size(shape).numel()).reshape(shape).to(dtype)  # no ties
    for largest in (True, False):
        _v, i, _rv, ri = _check_topk(x, k, largest=largest)
        if dtype == torch.float32:
            assert torch.equal(i, ri)  # distinct values: the indices are unique
    assert _s("topk")["hits"] == 2 and _s("topk")["fallbacks"] == {}


def test_topk_method_and_unsorted(cpu_backend):
    x = torch.randn(3, 40)
    _check_topk(x, 6, sorted=False)
    _v, _i = x.topk(4)
    assert _s("topk")["hits"] == 2


def test_topk_ties_and_nan(cpu_backend):
    x = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 2.0, 3.0], [0.0] * 6])
    _v, i, _, _ = _check_topk(x, 3)
    assert torch.equal(i[0], torch.tensor([3, 1, 2]))  # NaN first; ties by index
    assert torch.equal(i[1], torch.tensor([0, 1, 2]))
    assert _s("topk")["hits"] == 1


@pytest.mark.parametrize(
    "make,args,reason",
    [
        (lambda: torch.randn(3, 8, dtype=torch.float64), (2,), "dtype"),
        (lambda: torch.randint(0, 9, (3, 8)), (2,), "dtype"),
        (lambda: torch.tensor(2.0), (1,), "empty"),
        (lambda: torch.randn(0, 8), (2,), "empty"),
        (lambda: torch.randn(3, 8), (0,), "params"),
        (lambda: torch.randn(3, 8).t(), (2,), "layout"),
        (lambda: torch.randn(3, 8), (2, 0), "layout"),
        (lambda: torch.randn(3, 8)[:, ::2], (2,), "layout"),
    ],
)
def test_topk_fallback_reasons(cpu_backend, make, args, reason):
    x = make()
    out = torch.topk(x, *args)
    with torch_flydsl.disabled():
        ref = torch.topk(x, *args)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert _s("topk")["fallbacks"] == {reason: 1} and _s("topk")["hits"] == 0


def _same_error(fn):
    with pytest.raises(Exception) as ours:
        fn()
    with torch_flydsl.disabled(), pytest.raises(Exception) as theirs:
        fn()
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)
    assert "flydsl" not in str(ours.value).lower()
    return ours.value


@pytest.mark.parametrize(
    "fn",
    [
        lambda: torch.topk(torch.randn(3, 8), 9),  # k > N
        lambda: torch.topk(torch.randn(3, 8), -1),
        lambda: torch.topk(torch.randn(3, 8), 2, dim=2),
        lambda: torch.topk(torch.randn(3, 8), 2, dim=-3),
        lambda: torch.topk(torch.tensor(1.0), 2),
        lambda: torch.topk(torch.randn(2, 4).bool(), 1),
        lambda: torch.topk(torch.randn(3, 8), 2, out=(torch.empty(3, 2), torch.empty(3, 2))),
    ],
)
def test_topk_bad_inputs_give_aten_errors(cpu_backend, fn):
    _same_error(fn)


def test_topk_out_variant(cpu_backend):
    x = torch.randn(4, 32)
    v, i = torch.empty(4, 3), torch.empty(4, 3, dtype=torch.int64)
    r = torch.topk(x, 3, out=(v, i))
    assert r[0] is v and r[1] is i
    with torch_flydsl.disabled():
        rv, _ri = torch.topk(x, 3)
    assert torch.equal(v, rv) and torch.equal(x.gather(-1, i), v)
    assert _s("topk.values") == {"calls": 1, "hits": 1, "fallbacks": {}}
    # wrong-shaped out: ATen resizes it (and warns); we leave that to ATen
    v2, i2 = torch.empty(1), torch.empty(1, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.topk(x, 3, out=(v2, i2))
    assert v2.shape == (4, 3) and torch.equal(v2, rv)
    assert _s("topk.values")["fallbacks"] == {"params": 1}


def test_kernel_exception_falls_back_to_aten(cpu_backend, monkeypatch, caplog):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setitem(_kernels.K, "topk", boom)
    x = torch.randn(3, 16)
    with caplog.at_level("WARNING", logger="torch_flydsl"):
        v, i = torch.topk(x, 4)
    with torch_flydsl.disabled():
        rv, ri = torch.topk(x, 4)
    assert torch.equal(v, rv) and torch.equal(i, ri)
    assert _s("topk")["fallbacks"] == {"error": 1}
    assert "kernel exploded" in caplog.text


def test_fallback_reasons_logged_at_debug(cpu_backend, caplog):
    with caplog.at_level("DEBUG", logger="torch_flydsl"):
        torch.topk(torch.randn(3, 8, dtype=torch.float64), 2)
    assert "topk: ATen fallback (dtype)" in caplog.text


def test_reset_stats(cpu_backend):
    torch.topk(torch.randn(2, 8), 2)
    assert _s("topk")["calls"] == 1
    torch_flydsl.reset_stats()
    assert _s("topk") == {"calls": 0, "hits": 0, "fallbacks": {}}


# -- gates ----------------------------------------------------------------------------------------


def test_shipped_gfx950_table():
    t = gates.GateTable()
    f32 = torch.float32
    assert t.allows("gfx950", "topk", f32, 256, 4096, 8)
    assert not t.allows("gfx950", "topk", f32, 255, 4096, 8)  # fewer rows than CUs
    assert not t.allows("gfx950", "topk", f32, 256, 3000, 8)  # not a power of two
    assert not t.allows("gfx950", "topk", f32, 256, 4096, 8, largest=False)
    assert t.allows("gfx950", "topk", f32, 256, 32768, 256)
    assert not t.allows("gfx950", "topk", torch.bfloat16, 256, 4096, 8)
    assert t.allows("gfx950", "rms_norm", torch.bfloat16, 8192, 4096)
    assert not t.allows("gfx950", "rms_norm", torch.bfloat16, 4096, 4096)
    assert t.allows("gfx950", "rms_norm", torch.float16, 2048, 114688)
    assert not t.allows("gfx950", "rms_norm", torch.float16, 2048, 114689)
    assert not t.allows("gfx942", "rms_norm", torch.float16, 1 << 20, 8192)
    assert t.allows("cpu", "topk", torch.float16, 1, 3, 1)
    for r in gates.SHIPPED:
        assert r.source
        if r.arch == "gfx950" and r.op != "rms_norm_backward":
            assert "gfx950.md" in r.source
    assert "assumption" in t.rules("gfx950", "rms_norm_backward", f32)[0].source
    # the GEMM rules (upstream regions, labelled assumptions for our kernels)
    bf16 = torch.bfloat16
    assert t.allows("gfx950", "gemm", bf16, 16, 4096, 4096)
    assert not t.allows("gfx950", "gemm", bf16, 4096, 4096, 4096)  # large square: ATen
    assert t.allows("gfx950", "grouped_mm", bf16, 64, 768, 2048)
    assert t.allows("gfx950", "mx_gemm", torch.float4_e2m1fn_x2, 4096, 4096, 4096)
    assert not t.allows("gfx942", "mx_gemm", torch.float8_e4m3fn, 32, 4096, 4096)
    assert t.allows("cpu", "mx_grouped_mm", torch.float8_e5m2, 1, 1, 32)
    assert not t.allows("cpu", "gemm", torch.float64, 1, 1, 1)


def test_table_roundtrip(tmp_path):
    p = tmp_path / "g.json"
    rules = [r for r in gates.SHIPPED if r.arch == "gfx950"]
    gates.write_table(p, rules, [{"arch": "sm90", "op": "topk", "dtype": "float32"}])
    back = gates.read_table(p)
    assert back[: len(rules)] == rules
    t = gates.GateTable(local=back)
    assert not t.allows("sm90", "topk", torch.float32, 1, 1, 1)


def test_local_table_preferred(cpu_backend, monkeypatch, tmp_path):
    p = tmp_path / "local.json"
    rule = {"arch": "cpu", "op": "topk", "dtype": "float32", "n": [1, 16], "source": "test"}
    p.write_text(json.dumps({"format": gates.FORMAT, "rules": [rule]}))
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(p))
    torch_flydsl.disable()
    torch_flydsl.enable(device="cpu")
    assert torch_flydsl.status()["gates"]["local_table"] == str(p)
    torch.topk(torch.randn(2, 16), 2)  # inside the local rule
    torch.topk(torch.randn(2, 17), 2)  # outside: the gate says ATen
    torch.topk(torch.randn(2, 17).half(), 2)  # a key the local table lacks: shipped rule
    assert _s("topk") == {"calls": 3, "hits": 2, "fallbacks": {"gate": 1}}


def test_bad_local_table_is_ignored(cpu_backend, monkeypatch, tmp_path, caplog):
    p = tmp_path / "bad.json"
    p.write_text('{"format": "other"}')
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(p))
    assert gates.load().local_source is None
    assert "ignoring the local gate table" in caplog.text


def test_arch_gate_on_gpu_backend(monkeypatch):
    """The GPU arch check (``eligibility``): allowed list from FLYDSL_TORCH_ARCHS, names and
    aliases alike, cached per index; the CUDA backend asks it."""
    from torch_flydsl import eligibility

    monkeypatch.setattr(eligibility, "resolve_arch", lambda idx: "gfx942")
    monkeypatch.delenv("FLYDSL_TARGET", raising=False)
    monkeypatch.setenv("FLYDSL_TORCH_ARCHS", "gfx950,sm90")
    eligibility.clear_caches()
    try:
        assert eligibility.device_arch("cuda", 0) == ""
        monkeypatch.setenv("FLYDSL_TORCH_ARCHS", "mi300x")  # an alias of gfx942
        assert eligibility.device_arch("cuda", 0) == ""  # cached per index
        eligibility.clear_caches()
        assert eligibility.device_arch("cuda", 0) == "gfx942"
        b = dispatch.EagerContext("cuda", gates.GateTable())
        monkeypatch.setattr(b, "arch", lambda t: eligibility.device_arch("cuda", 0))
        assert topk_spec.reason(b, torch.randn(300, 4096), 8, -1, True, True) == "gate"
    finally:
        eligibility.clear_caches()


# -- rms_norm -------------------------------------------------------------------------------------


def _rms_ref(x, ns, w, eps):
    with torch_flydsl.disabled():
        return F.rms_norm(x, ns, w, eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,nd", [((4, 64), 1), ((2, 3, 40), 1), ((3, 4, 8), 2), ((5,), 1)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_forward(cpu_backend, dtype, shape, nd, with_weight):
    x = torch.randn(shape).to(dtype)
    ns = shape[-nd:]
    w = torch.randn(ns).to(dtype) if with_weight else None
    for fn in (
        lambda: F.rms_norm(x, ns, w, 1e-5),
        lambda: torch.rms_norm(x, list(ns), w, 1e-5),
        lambda: torch.ops.aten._fused_rms_norm(x, list(ns), w, 1e-5)[0],
    ):
        y = fn()
        assert y.dtype == dtype and y.shape == x.shape
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(y, _rms_ref(x, ns, w, 1e-5), rtol=rtol, atol=atol)
    assert _s("_fused_rms_norm") == {"calls": 3, "hits": 3, "fallbacks": {}}


def test_rms_norm_rstd_matches_aten(cpu_backend):
    x, w = torch.randn(3, 5, 8), torch.randn(5, 8)
    y, rstd = torch.ops.aten._fused_rms_norm(x, [5, 8], w, None)
    with torch_flydsl.disabled():
        ry, rrstd = torch.ops.aten._fused_rms_norm(x, [5, 8], w, None)
    assert rstd.shape == rrstd.shape == (3, 1, 1) and rstd.dtype == torch.float32
    torch.testing.assert_close(rstd, rrstd)
    torch.testing.assert_close(y, ry)


@pytest.mark.parametrize(
    "make,reason",
    [
        (lambda: (torch.randn(3, 8, dtype=torch.float64), [8], None, 1e-5), "dtype"),
        (lambda: (torch.randn(3, 8), [8], torch.randn(8).half(), 1e-5), "dtype"),
        (lambda: (torch.randn(3, 8).t(), [3], None, 1e-5), "layout"),
        (lambda: (torch.randn(0, 8), [8], None, 1e-5), "empty"),
        (lambda: (torch.randn(3, 8), [8], None, -0.5), "params"),
        (lambda: (torch.randn(3, 8), [8], None, float("nan")), "params"),
        # ATen's CPU composite does not check normalized_shape here; the fallback keeps that
        (lambda: (torch.randn(2, 3), [4], None, None), "params"),
    ],
)
def test_rms_norm_fallback_reasons(cpu_backend, make, reason):
    x, ns, w, eps = make()
    y, rstd = torch.ops.aten._fused_rms_norm(x, ns, w, eps)
    with torch_flydsl.disabled():
        ry, rrstd = torch.ops.aten._fused_rms_norm(x, ns, w, eps)
    torch.testing.assert_close(y, ry, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(rstd, rrstd, equal_nan=True, rtol=0, atol=0)
    assert _s("_fused_rms_norm")["fallbacks"] == {reason: 1}


@pytest.mark.parametrize(
    "fn",
    [
        lambda: F.rms_norm(torch.randn(2, 3), (), None),
        lambda: F.rms_norm(torch.randn(2, 3), (4,), None),
        lambda: F.rms_norm(torch.randn(2, 3), (3,), torch.randn(4)),
        lambda: F.rms_norm(torch.tensor(1.0), (1,), None),
        lambda: F.rms_norm(torch.randint(0, 3, (2, 3)), (3,), None),
        lambda: torch.ops.aten._fused_rms_norm(torch.randn(2, 3), [3], torch.randn(2), None),
    ],
)
def test_rms_norm_bad_inputs_give_aten_errors(cpu_backend, fn):
    _same_error(fn)


def test_rms_norm_nan_input(cpu_backend):
    x = torch.randn(3, 16)
    x[1, 3] = float("nan")
    y = F.rms_norm(x, (16,), None, 1e-6)
    torch.testing.assert_close(y, _rms_ref(x, (16,), None, 1e-6), equal_nan=True)
    assert _s("_fused_rms_norm")["hits"] == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_autograd(cpu_backend, dtype, with_weight):
    x0 = torch.randn(4, 3, 24).to(dtype)
    w0 = torch.randn(24).to(dtype) if with_weight else None
    g = torch.randn(4, 3, 24).to(dtype)

    def grads():
        x = x0.clone().requires_grad_()
        w = w0.clone().requires_grad_() if w0 is not None else None
        y = F.rms_norm(x, (24,), w, 1e-6)
        y.backward(g)
        return y, x.grad, (w.grad if w is not None else None), y.grad_fn.name()

    y, dx, dw, node = grads()
    with torch_flydsl.disabled():
        ry, rdx, rdw, rnode = grads()
    assert node == "FusedRmsNormBackward0"  # _fused_rms_norm's autograd formula, as on a GPU
    assert rnode != node  # stock CPU: rms_norm decomposes
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(y, ry, rtol=rtol, atol=atol)
    torch.testing.assert_close(dx, rdx, rtol=rtol * 2, atol=atol * 2)
    if with_weight:
        assert dw.dtype == dtype
        torch.testing.assert_close(dw, rdw, rtol=rtol * 4, atol=atol * 4)
    assert _s("_fused_rms_norm_backward") == {"calls": 1, "hits": 1, "fallbacks": {}}


def test_rms_norm_backward_fallback_is_torch_decomposition(cpu_backend):
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y = F.rms_norm(x, (8,), w)
    y.sum().backward()  # expanded (stride-0) grad_out: layout fallback
    assert _s("_fused_rms_norm_backward")["fallbacks"] == {"layout": 1}
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with torch_flydsl.disabled():
        F.rms_norm(x2, (8,), w2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_gradcheck_through_fallback(cpu_backend):
    # float64 stays on ATen (dtype), the dispatch path must not disturb autograd
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: F.rms_norm(a, (5,), b), (x, w))


def test_inference_mode_routes_too(cpu_backend):
    with torch.inference_mode():
        x = torch.randn(3, 16)
        y = F.rms_norm(x, (16,))
    torch.testing.assert_close(y, _rms_ref(x, (16,), None, None))
    assert _s("_fused_rms_norm")["hits"] == 1


# -- determinism ----------------------------------------------------------------------------------


def test_deterministic_mode_uses_deterministic_variants(cpu_backend, deterministic, monkeypatch):
    from flydsl_kernels.rmsnorm import rms_norm_backward
    from flydsl_kernels.topk import topk

    seen = []

    def spy_bwd(*a, **k):
        seen.append(("bwd", a[4]))
        return rms_norm_backward(*a, **k)

    def spy_topk(*a, **k):
        seen.append(("topk", k["deterministic"]))
        return topk(*a, **k)

    monkeypatch.setitem(_kernels.K, "rms_norm_backward", spy_bwd)
    monkeypatch.setitem(_kernels.K, "topk", spy_topk)
    x0, w0, g = torch.randn(16, 32), torch.randn(32), torch.randn(16, 32)
    dws = []
    for _ in range(2):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        F.rms_norm(x, (32,), w).backward(g)
        dws.append(w.grad)
    assert torch.equal(dws[0], dws[1])
    _v1, i1 = torch.topk(x0, 5)
    _v2, i2 = torch.topk(x0, 5)
    assert torch.equal(i1, i2)
    assert seen == [("bwd", True), ("bwd", True), ("topk", True), ("topk", True)]


# -- precedence with a prior (fake upstream) registration -----------------------------------------


@pytest.fixture
def fake_upstream():
    calls = []
    torch_flydsl.disable()  # capture ATen's kernel, not ours
    orig = torch.library.get_kernel("aten::topk", "CPU")

    def upstream(keyset, *args, **kwargs):
        calls.append(args[1])
        return orig.call_boxed(keyset, *args, **kwargs)

    torch_flydsl.disable()
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("topk", upstream, "CPU", with_keyset=True)
    yield calls
    torch_flydsl.disable()
    lib._destroy()


def test_precedence_ours_wraps_prior(cpu_backend, fake_upstream):
    torch_flydsl.enable(device="cpu", precedence="ours")
    torch.topk(torch.randn(2, 8), 2)  # eligible: ours
    torch.topk(torch.randn(2, 8).double(), 3)  # fallback: the prior registration
    assert fake_upstream == [3]
    assert _s("topk")["hits"] == 1
    st = torch_flydsl.status()["ops"]["topk"]
    assert "test_dispatch.py" in st["fallback_to"]["aten::topk@CPU"]
    torch_flydsl.disable()
    torch.topk(torch.randn(2, 8), 4)  # ours removed: the prior one is back
    assert fake_upstream == [3, 4]


def test_precedence_upstream_defers(cpu_backend, fake_upstream, monkeypatch):
    monkeypatch.setenv("FLYDSL_TORCH_PRECEDENCE", "upstream")
    torch_flydsl.enable(ops=["topk", "rms_norm"], device="cpu")
    st = torch_flydsl.status("cpu")
    assert st["ops"]["topk"]["state"] == "deferred"
    assert "aten::topk@CPU" in st["ops"]["topk"]["why"]
    assert st["ops"]["rms_norm"]["state"] == "enabled"  # nothing registered before us there
    torch.topk(torch.randn(2, 8), 2)
    assert fake_upstream == [2] and _s("topk")["calls"] == 0
    with pytest.raises(ValueError, match="precedence"):
        torch_flydsl.enable(device="cpu", precedence="theirs")


# -- torch.compile --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_no_graph_breaks(cpu_backend, backend):
    torch._dynamo.reset()

    def f(x, w):
        y = F.rms_norm(x, (32,), w, 1e-6)
        v, i = torch.topk(y, 4)
        return v.sum() + y.square().sum(), i

    x0, w0 = torch.randn(4, 32), torch.randn(32)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    out, idx = torch.compile(f, backend=backend, fullgraph=True)(x, w)
    out.backward()
    with torch_flydsl.disabled():
        rx, rw = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        rout, ridx = f(rx, rw)
        rout.backward()
    torch.testing.assert_close(out, rout)
    assert torch.equal(idx, ridx)
    torch.testing.assert_close(x.grad, rx.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad, rw.grad, rtol=1e-4, atol=1e-4)
    assert _s("topk")["hits"] >= 1  # the compiled graph's aten.topk ran ours
    torch._dynamo.reset()


def test_calibration_buckets_cover_every_gate_op():
    """``torch_flydsl calibrate`` takes its buckets from the specs: every gate op has some, in
    the dtypes the op runs, and each bucket makes a valid gate rule."""
    from torch_flydsl.calibrate import buckets

    cases = buckets(["rms_norm", "topk", "gemm", "grouped_mm", "scaled_mm"], quick=True)
    ops = {c[0].op for c in cases}
    assert ops == {"rms_norm", "rms_norm_backward", "topk", "gemm", "grouped_mm", "mx_gemm"}
    for cal, dt, m, n, k in cases:
        extra = cal.rule_extra(k) if cal.rule_extra else ({"k": list(k)} if k else {})
        rule = {"arch": "gfx950", "op": cal.op, "dtype": gates.DTYPE_NAMES[dt], "m": list(m)}
        gates.Rule.from_json({**rule, "n": list(n), **extra, "source": "test"})
    assert {gates.DTYPE_NAMES[c[1]] for c in cases if c[0].op == "gemm"} == {"bfloat16", "float16"}
    narrowed = buckets(["gemm"], dtypes=["bfloat16"], quick=True)
    assert narrowed and all(c[1] == torch.bfloat16 for c in narrowed)


# -- the cheap decisions before the predicate -----------------------------------------------------


def test_gate_corners_and_closed_keys():
    f32 = torch.float32
    t = gates.GateTable(
        local=[
            gates.Rule("cpu", "topk", "float32", m=(256, None), n=(1024, 8192)),
            gates.Rule("cpu", "topk", "float32", m=(64, None), n=(8192, None)),
            gates.Rule("cpu", "rms_norm", "float32", m=(1, 0)),  # a closed entry
        ]
    )
    assert t.min_mn("cpu", "topk", f32) == 256 * 1024  # the smaller of the two corners
    assert t.closed("cpu", "rms_norm", f32) and not t.closed("cpu", "topk", f32)
    assert t.closed("cpu", "gemm", f32)  # no rule at all
    assert t.allows("cpu", "topk", f32, 300, 2048) and t.allows("cpu", "topk", f32, 300, 2048)
    assert not t.allows("cpu", "topk", f32, 3, 2048)


def test_decisions_before_the_predicate(cpu_backend, monkeypatch, tmp_path):
    """dtype / closed gate per (device, dtype), then the gate's smallest corner, then the
    predicate: each gives the same answer the predicate would."""
    p = tmp_path / "t.json"
    rule = {"arch": "cpu", "op": "rms_norm", "dtype": "float32", "m": [8, None], "n": [64, None]}
    gates.write_table(p, [gates.Rule.from_json(rule)], [
        {"arch": "cpu", "op": "rms_norm", "dtype": "bfloat16"},
    ])  # fmt: skip
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(p))
    torch_flydsl.disable()
    torch_flydsl.enable(ops=["rms_norm"], device="cpu")
    torch_flydsl.reset_stats()
    cases = [
        (torch.randn(4, 64, dtype=torch.float64), "dtype"),
        (torch.randn(4, 64, dtype=torch.bfloat16), "gate"),  # closed for bf16
        (torch.randn(4, 64), "gate"),  # 256 elements: below the rule's corner (8 x 64)
        (torch.randn(64, 8), "gate"),  # 512 elements, but n = 8: the predicate's gate check
        (torch.randn(8, 64), None),  # inside: FlyDSL
    ]
    for x, want in cases:
        torch_flydsl.reset_stats()
        y = F.rms_norm(x, (x.shape[-1],), None, 1e-6)
        with torch_flydsl.disabled():
            ref = F.rms_norm(x, (x.shape[-1],), None, 1e-6)
        torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2)
        st = _s("_fused_rms_norm")
        assert st["fallbacks"] == ({want: 1} if want else {}), (x.shape, x.dtype, st)
        assert st["hits"] == (0 if want else 1)


def _decomposed_backward(*args):
    from torch._decomp.decompositions import _fused_rms_norm_backward

    return _fused_rms_norm_backward(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_backward_takes_rows_of_a_wider_gradient(cpu_backend, dtype):
    """A gradient whose rows are one stride apart but not contiguous with each other (a slice
    of wider rows) is the layout the kernel addresses: it runs on FlyDSL, as the decomposition."""
    x = torch.randn(2, 5, 24).to(dtype)
    w = torch.randn(24).to(dtype)
    g = torch.randn(2, 5, 40).to(dtype)[..., 3:27]  # row stride 40
    _, rstd = torch.ops.aten._fused_rms_norm.default(x, [24], w, 1e-6)
    dx, dw = torch.ops.aten._fused_rms_norm_backward.default(g, x, [24], rstd, w, [True, True])
    assert _s("_fused_rms_norm_backward") == {"calls": 1, "hits": 1, "fallbacks": {}}
    rdx, rdw = _decomposed_backward(g, x, [24], rstd, w, [True, True])
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(dx, rdx, rtol=rtol * 2, atol=atol * 2)
    torch.testing.assert_close(dw, rdw, rtol=rtol * 4, atol=atol * 4)


def test_rms_norm_backward_on_qwen3_head_norm_layout(cpu_backend):
    """Qwen3's ``q_norm`` / ``k_norm`` normalize ``(B, S, H, D)`` and are followed by
    ``transpose(1, 2)``: their gradient's rows are laid out ``(B, H, S)``, not one stride
    apart, which the kernel cannot address: an ATen fallback counted as ``row_stride`` (not the
    catch-all ``layout``), with the decomposition's gradients."""
    x0 = torch.randn(2, 5, 3, 16).bfloat16()
    w0 = torch.randn(16).bfloat16()
    up = torch.randn(2, 3, 5, 16).bfloat16()

    def grads():
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = F.rms_norm(x, (16,), w, 1e-6).transpose(1, 2)
        (y * up).float().sum().backward()
        return x.grad, w.grad

    dx, dw = grads()
    assert _s("_fused_rms_norm_backward")["fallbacks"] == {"row_stride": 1}
    with torch_flydsl.disabled():
        rdx, rdw = grads()
    torch.testing.assert_close(dx, rdx)
    torch.testing.assert_close(dw, rdw)
