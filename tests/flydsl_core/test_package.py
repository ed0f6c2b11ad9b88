"""flydsl-core imports light, and its public surface is what the docs promise."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu


def test_import_loads_neither_torch_nor_triton():
    code = "import sys, flydsl_core; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_flat_api_exposes_the_language():
    import flydsl_core as fly

    for name in (
        "kernel",
        "constexpr",
        "program_id",
        "range",
        "if_",
        "while_",
        "dot",
        "dot_scaled",
        "Layout",
    ):
        assert hasattr(fly, name), name


def _imports(root, pkg):
    """``{module: {(imported module, top_level)}}`` for every module of a package (by AST)."""
    import ast
    import pathlib

    root = pathlib.Path(root)
    mods = {}
    for p in root.rglob("*.py"):
        parts = [pkg, *p.relative_to(root).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    out = {}
    for name, (p, is_pkg) in mods.items():
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        tree = ast.parse(p.read_text())
        top = {id(n) for n in tree.body}
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                m = node.module or ""
                if node.level:
                    m = ".".join(base[: len(base) - node.level + 1] + ([m] if m else []))
                names = [m, *(f"{m}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {(n, id(node) in top) for n in names}
        out[name] = found
    return out


def _core_root():
    import pathlib

    import flydsl_core

    return pathlib.Path(flydsl_core.__file__).parent


def test_torch_and_triton_are_imported_lazily_outside_the_reference_backend():
    """docs/architecture.md's layering rule: module-level torch/triton imports only in
    backends/reference (loaded by get_backend on first use); everywhere else lazily."""
    eager = sorted(
        m
        for m, found in _imports(_core_root(), "flydsl_core").items()
        if any(top and n.split(".")[0] in ("torch", "triton") for n, top in found)
    )
    assert eager == [
        "flydsl_core.backends.reference.interpreter",
        "flydsl_core.backends.reference.rules",
    ]


@pytest.mark.parametrize(
    "pkg, pairs",
    [
        ("flydsl_core", [("runtime.binder", "runtime.kernel")]),
        ("flydsl_kernels", [("mx.configs", "mx.api")]),
    ],
)
def test_no_import_cycles_that_need_not_be(pkg, pairs):
    import importlib
    import pathlib

    root = pathlib.Path(importlib.import_module(pkg).__file__).parent
    graph = {m: {n for n, _ in found} for m, found in _imports(root, pkg).items()}
    for a, b in pairs:
        a, b = f"{pkg}.{a}", f"{pkg}.{b}"
        assert not (b in graph[a] and a in graph[b]), (a, b)
    # nothing in the launch path imports back into a module that imports it
    runtime = [m for m in graph if m.startswith(f"{pkg}.runtime.")]
    for a in runtime:
        for b in runtime:
            assert a == b or not (b in graph[a] and a in graph[b]), (a, b)


def test_the_runtime_imports_no_backend_module():
    """docs/architecture.md's backend rule: the runtime reaches backends only through the
    protocol (``backends.get_backend``); what a backend can do beyond ``compile`` is declared
    (``Backend.generates_source``), never probed."""
    kinds = {p.name for p in (_core_root() / "backends").iterdir() if p.is_dir()} - {"__pycache__"}
    assert kinds >= {"reference", "triton"}
    for mod, found in _imports(_core_root(), "flydsl_core").items():
        if mod.startswith("flydsl_core.runtime."):
            named = [n for n, _ in found if n.startswith("flydsl_core.backends.")]
            assert not [n for n in named if n.split(".")[2] in kinds], (mod, sorted(named))
    src = (_core_root() / "runtime" / "kernel.py").read_text()
    assert "hasattr(backend" not in src


def test_backends_declare_source_generation():
    from flydsl_core.backends import get_backend

    assert not get_backend("cpu-reference").generates_source
    assert get_backend("cpu-interpret").generates_source
