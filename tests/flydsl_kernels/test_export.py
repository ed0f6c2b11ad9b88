"""``flydsl export``: every shipped family and the core's examples as standalone Triton files
with launch contracts, and those files run where no workspace package can be imported.

The run test takes the launch a family's API (or plan) makes for a small awkward problem
(recorded by a launch sink, not run), finds the exported file whose compile-time constants
are the launch's, and runs that file in a fresh interpreter (``python -I -S``: site-packages
on the path without its ``.pth`` files, so none of the workspace's editable packages is
importable, and the export folder) through Triton's interpreter, building the ``@triton.jit``
call from the contract alone; the outputs are compared with PyTorch here. Tolerances: fp32
1e-5, bf16 outputs 1e-2 (one rounding of an fp32 result), relative to the largest magnitude.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from flydsl_core.cli import main
from flydsl_core.export import jsonable

pytestmark = pytest.mark.cpu

FAMILIES = ("rmsnorm", "topk", "gemm", "mx", "attention")


@pytest.fixture(scope="module")
def gfx950(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "gfx950"
    assert main(["export", "all", "--target", "gfx950", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    """For Triton's interpreter, which computes 16-bit ``tl.dot`` on the raw bits: the same
    kernels generated for ``cpu-interpret`` (16-bit dot operands upcast to fp32)."""
    out = tmp_path_factory.mktemp("export") / "interp"
    argv = ["export", "gemm_kernel", "attn_fwd_kernel", "--target", "cpu-interpret", "--out"]
    assert main([*argv, str(out)]) == 0
    return out


def _contracts(root: Path):
    for p in sorted(root.glob("*/*.json")):
        if p.name != "tuning.json":
            yield p, json.loads(p.read_text())


def test_every_family_and_example_is_exported(gfx950):
    import flydsl_kernels
    from flydsl_core import examples
    from flydsl_core.cache import compiler_fingerprint

    m = json.loads((gfx950 / "manifest.json").read_text())
    assert m["target"] == "gfx950" and m["portable"] is True
    assert set(m["groups"]) == {"examples", *FAMILIES}
    for name, fam in flydsl_kernels.families().items():
        cases = list(fam.cases())
        got = m["groups"][name]["kernels"]
        assert len(got) >= len(cases)  # one file per launch a case compiles
        assert {k["kernel"] for k in got} == {c.kernel for c in cases}
        tables = json.loads((gfx950 / name / "tuning.json").read_text())["tables"]
        assert set(tables) == {"gfx950", "gfx942", "gfx1250", "sm90"}
        assert all(tables[t] for t in tables)
    assert {k["kernel"] for k in m["groups"]["examples"]["kernels"]} == {
        examples.load(n).KERNEL.name for n in examples.NAMES
    }
    assert (gfx950 / "README.md").read_text().startswith("# FlyDSL kernels exported for gfx950")
    fp = compiler_fingerprint()
    for path, c in _contracts(gfx950):
        src = (path.parent / c["file"]).read_text()
        assert f"Compiler fingerprint: {fp}" in src and c["compiler_fingerprint"] == fp
        assert f"function {c['source']['function']}" in src and c["source"]["file"] in src
        assert "Commit: " in src and c["target"] == "gfx950"
        assert [p["name"] for p in c["params"]] == _jit_params(src, c["triton_function"])


def _jit_params(src: str, name: str) -> list[str]:
    tree = ast.parse(src)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return [a.arg for a in fn.args.args]


def test_exported_files_import_triton_only(gfx950):
    """No FlyDSL package and no torch, at module level or anywhere in the file."""
    files = sorted(gfx950.glob("*/*.py"))
    assert len(files) > 70
    for f in files:
        tree = ast.parse(f.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert mods and all(m == "triton" or m.startswith("triton.") for m in mods), (f, mods)


def test_grid_rules_come_from_the_plans(gfx950):
    c = json.loads((gfx950 / "gemm" / "gemm_kernel__16x4096x4096_bf16_NT.json").read_text())
    rule = c["grid"]["rule"]
    assert rule["expression"] == "(tiles, self.batch, 1)" and "gemm/plan.py:" in rule["where"]
    assert any(
        d.startswith("tiles = cdiv(M, cfg.BM) * cdiv(N, cfg.BN)") for d in rule["definitions"]
    )
    assert c["grid"]["example"] == [1 * 32, 1, 1]  # 16 x 4096 in 16 x 128 tiles
    s = json.loads((gfx950 / "examples" / "softmax__37x1000_fp32.json").read_text())
    assert s["grid"]["rule"]["expression"] == "(x2.shape[0],)" and s["grid"]["example"] == [37]
    assert s["constexprs"] == {"BLOCK": 1024} and s["launch"]["num_warps"] == 4


def test_portable_and_specialized_contracts(tmp_path, gfx950):
    """Portable: no fact of the problem's sizes; --specialized: the case's facts."""
    name = "rmsnorm_bwd_rows__4096x4096_bf16.json"
    portable = json.loads((gfx950 / "rmsnorm" / name).read_text())
    assert (
        main(["export", "rmsnorm", "--specialized", "--target", "gfx950", "--out", str(tmp_path)])
        == 0
    )
    spec = json.loads((tmp_path / "rmsnorm" / name).read_text())
    assert spec["portable"] is False and portable["portable"] is True
    facts = [f for a in portable["arguments"] if a["kind"] == "tensor" for f in a["sizes"]]
    assert facts and all(f is None for f in facts)
    facts = [f for a in spec["arguments"] if a["kind"] == "tensor" for f in a["sizes"]]
    assert {"multiple_of": 16} in facts


def test_selection_errors_are_one_line(tmp_path, capsys):
    for argv in (
        ["export", "nosuch", "--out", str(tmp_path)],
        ["export", "softmax", "--target", "cpu-reference", "--out", str(tmp_path)],
        ["export", "softmax"],
        ["export", "--out", str(tmp_path)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err
    assert main(["export", "nosuch", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "name a group (examples, rmsnorm" in err and "softmax" in err
    assert main(["export", "--list"]) == 0
    assert "gemm_kernel" in capsys.readouterr().out


# -- the exported kernels, run standalone ---------------------------------------------------------------


def _record(fn):
    """``[(kernel, grid, bound arguments)]`` of the launches ``fn`` makes (recorded, not run)."""
    from flydsl_core.runtime.kernel import LAUNCH_OPTIONS, launch_sink

    out = []

    def sink(kernel, grid, args, kwargs):
        kw = {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
        out.append((kernel, tuple(grid), kernel.bind(args, kw)))

    with launch_sink(sink):
        fn()
    return out


def _softmax(dtype):
    from flydsl_core.examples import softmax

    x = torch.randn(5, 777).mul(3).to(dtype)
    (launch,) = _record(lambda: softmax.run(x))
    return launch, lambda a: (a["out"], x.float().softmax(-1))


def _rmsnorm():
    from flydsl_kernels.rmsnorm import rms_norm

    x, w = torch.randn(5, 4096), torch.randn(4096)
    (launch,) = _record(lambda: rms_norm(x, (4096,), w, 1e-6))

    def check(a):
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return a["y"].reshape(5, 4096), ref

    return launch, check


def _gemm():
    from flydsl_kernels.gemm import configs
    from flydsl_kernels.gemm.plan import plan_gemm

    M, N, K = 5, 200, 256  # M < the 16-row tile, N not a multiple of 128, K of the K tile
    a = torch.randn(1, M, K).to(torch.bfloat16)
    w = torch.randn(N, K).to(torch.bfloat16)  # F.linear's weight: b is its transpose (NT)
    out = torch.empty(1, M, N, dtype=torch.bfloat16)
    cfg = configs.select("dense", 16, 4096, 4096, 1, "gfx950")  # the 16x4096x4096 case's tile
    gp = plan_gemm(M, N, K, config=cfg, split_k=1, target="cpu-interpret")
    (lc,) = gp.launches(a=a, b=w.t().unsqueeze(0), out=out)
    launch = (lc.kernel, tuple(lc.grid), lc.kernel.bind(lc.args, lc.constexprs))
    return launch, lambda r: (r["out"][0], a[0].float() @ w.float().t())


def _attention():
    from flydsl_kernels.attention import flash_attn_func

    q = torch.randn(1, 70, 4, 128).to(torch.bfloat16)  # Sq 70, 4 query heads over 2 KV heads
    k = torch.randn(1, 50, 2, 128).to(torch.bfloat16)
    v = torch.randn(1, 50, 2, 128).to(torch.bfloat16)
    (launch,) = _record(
        lambda: flash_attn_func(
            q, k, v, num_splits=1, return_attn_probs=True, target="cpu-interpret"
        )
    )

    def check(a):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
            enable_gqa=True,
        ).transpose(1, 2)  # fmt: skip
        return a["o"].reshape(1, 70, 4, 128), ref

    return launch, check


_RUNNER = r"""
import importlib.util, json, os, sys
site, export_dir, jobs_path = sys.argv[1:4]
sys.path.append(site)
sys.path.insert(0, export_dir)
for name in ("flydsl_core", "flydsl_kernels", "torch_flydsl", "flydsl_models"):
    assert importlib.util.find_spec(name) is None, name + " is importable"
jobs = json.load(open(jobs_path))
mods = []
for job in jobs:
    spec = importlib.util.spec_from_file_location(job["module"], job["file"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mods.append(mod)
assert "torch" not in sys.modules, "an exported kernel imported torch"
import torch
from triton.runtime import interpreter as I

# Triton 3.9's interpreter types a comparison of scalars as its operands' dtype although its
# data is bool, and then rejects it as a load mask; FlyDSL's launcher applies the same fix
_binary_op = type(I.interpreter_builder).binary_op
def binary_op(self, lhs, rhs, op):
    out = _binary_op(self, lhs, rhs, op)
    if out.data.dtype == bool and out.dtype != I.tl.int1:
        out = I.TensorHandle(out.data, I.tl.int1)
    return out
type(I.interpreter_builder).binary_op = binary_op

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}

def check(c, args):
    for a in c["arguments"]:
        x = args[a["name"]]
        if a["kind"] == "tensor":
            assert x.dtype == DTYPES[a["dtype"]], (c["file"], a["name"], x.dtype)
            assert x.dim() == a["rank"], (c["file"], a["name"], x.shape)
            for what, got in (("sizes", x.shape), ("strides", x.stride())):
                for d, fact in enumerate(a[what]):
                    if fact and "equals" in fact:
                        assert got[d] == fact["equals"], (a["name"], what, d)
                    if fact and "multiple_of" in fact:
                        assert got[d] % fact["multiple_of"] == 0, (a["name"], what, d)
            if a["aligned_16_bytes"]:
                assert x.data_ptr() % 16 == 0, a["name"]
        elif a["value"]:
            assert x == a["value"]["equals"], a["name"]

for job, mod in zip(jobs, mods):
    c = json.load(open(job["contract"]))
    args = torch.load(job["inputs"])
    check(c, args)
    params = []
    for p in c["params"]:
        x = args[p["argument"]]
        params.append({"size": lambda: x.shape[p["dim"]], "stride": lambda: x.stride(p["dim"])}
                      .get(p["reads"], lambda: x)())
    fn = getattr(mod, c["triton_function"])
    fn[tuple(job["grid"])](*params, num_warps=c["launch"]["num_warps"])
    torch.save(args, job["outputs"])
print("ran", len(jobs))
"""


def _clean_run(export_dir: Path, jobs: list, tmp: Path):
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    (tmp / "runner.py").write_text(_RUNNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["TRITON_INTERPRET"] = "1"
    site = sysconfig.get_paths()["purelib"]
    r = subprocess.run(
        [sys.executable, "-I", "-S", str(tmp / "runner.py"), site, str(export_dir), str(tmp / "jobs.json")],
        capture_output=True, text=True, env=env, cwd=tmp, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]


def _exported(root: Path, kernel, bound) -> tuple[Path, dict]:
    """The exported file of ``kernel`` whose compile-time constants and argument dtypes and
    ranks are ``bound``'s."""
    spec = kernel.specialize(bound)
    want = jsonable(spec.constexprs)
    kinds = [(n, s.dtype.name, s.rank) for n, s in spec.specs.items()]
    for path, c in _contracts(root):
        got = [(a["name"], a["dtype"], a.get("rank", 0)) for a in c["arguments"]]
        if c["kernel"] == kernel.name and c["constexprs"] == want and got == kinds:
            return path, c
    raise AssertionError(f"no exported {kernel.name} with constants {want}")


def test_exported_kernels_run_standalone_against_pytorch(gfx950, interp, tmp_path):
    """softmax (fp32, bf16) and RMSNorm (fp32) from their gfx950 files, a GEMM and an
    attention forward (bf16 ``tl.dot``) from their cpu-interpret files, run by Triton's
    interpreter in a clean interpreter."""
    torch.manual_seed(0)
    problems = {
        "softmax_fp32": (gfx950, _softmax(torch.float32)),
        "softmax_bf16": (gfx950, _softmax(torch.bfloat16)),
        "rmsnorm": (gfx950, _rmsnorm()),
        "gemm": (interp, _gemm()),
        "attention": (interp, _attention()),
    }
    jobs, checks = [], {}
    for name, (root, ((kernel, grid, bound), check)) in problems.items():
        path, c = _exported(root, kernel, bound)
        runtime = [a["name"] for a in c["arguments"]]
        torch.save({n: bound[n] for n in runtime}, tmp_path / f"{name}.in.pt")
        jobs.append(
            {
                "module": path.stem,
                "file": str(path.parent / c["file"]),
                "contract": str(path),
                "inputs": str(tmp_path / f"{name}.in.pt"),
                "outputs": str(tmp_path / f"{name}.out.pt"),
                "grid": list(grid),
            }
        )
        checks[name] = check
    _clean_run(gfx950, jobs, tmp_path)
    for name, check in checks.items():
        got, ref = check(torch.load(tmp_path / f"{name}.out.pt"))
        tol = 1e-5 if got.dtype == torch.float32 else 1e-2
        scale = ref.abs().max().item()
        torch.testing.assert_close(
            got.float(), ref.float(), rtol=tol, atol=tol * scale, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.compile
def test_exported_file_cross_compiles_for_gfx950_without_flydsl(gfx950, tmp_path):
    """An upstream build's step: the standalone file and its contract, compiled for gfx950 by
    Triton alone (``triton.compile``, no GPU) in a clean interpreter."""
    script = r"""
import importlib.util, json, sys
site, path, contract = sys.argv[1:4]
sys.path.append(site)
assert importlib.util.find_spec("flydsl_core") is None
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
c = json.load(open(contract))
spec = importlib.util.spec_from_file_location("k", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
fn = getattr(mod, c["triton_function"])
sig = {p["name"]: p["triton_type"] for p in c["params"]}
attrs = {(i,): [["tt.divisibility", p["divisibility"]]] for i, p in enumerate(c["params"]) if p["divisibility"]}
opts = {k: v for k, v in c["launch"].items()}
k = triton.compile(ASTSource(fn, sig, {}, attrs), target=GPUTarget("hip", "gfx950", 64), options=opts)
amdgcn = k.asm["amdgcn"]
assert "v_" in amdgcn and k.metadata.num_warps == c["launch"]["num_warps"]
print("compiled", c["kernel"], len(k.asm["hsaco"]), "bytes")
"""
    (tmp_path / "compile.py").write_text(script)
    path = gfx950 / "examples" / "softmax__37x1000_bf16.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRITON_INTERPRET"))}
    r = subprocess.run(
        [sys.executable, "-I", "-S", str(tmp_path / "compile.py"), sysconfig.get_paths()["purelib"],
         str(path), str(path.with_suffix(".json"))],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    assert "compiled softmax" in r.stdout
