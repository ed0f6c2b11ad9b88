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


#: the four packages of the workspace; the cycle test walks all of their modules
PACKAGES = ("flydsl_core", "flydsl_kernels", "torch_flydsl", "flydsl_models")


def _import_graph(packages=PACKAGES) -> dict[str, set[str]]:
    """``{module: {module it imports}}`` over every module of ``packages`` (by AST, without
    importing them), lazy (function-level) imports included, edges inside ``packages`` only.

    ``from P import n`` is an edge to ``P.n`` where that is a module, else to ``P`` (a
    package's ``__init__``); a module's own parent packages are imported before it anyway, so
    reaching one only counts when a name is taken from its ``__init__``. Imports under ``if
    TYPE_CHECKING:`` never run and are left out; so is ``importlib.import_module`` of a
    computed name (the families' registry)."""
    import ast
    import importlib.util
    import pathlib

    files = {}
    for pkg in packages:
        spec = importlib.util.find_spec(pkg)
        root = pathlib.Path(next(iter(spec.submodule_search_locations)))
        for p in root.rglob("*.py"):
            parts = [pkg, *p.relative_to(root).with_suffix("").parts]
            is_pkg = parts[-1] == "__init__"
            files[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)

    def type_checking_only(tree):
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        return skip

    graph = {}
    for name, (p, is_pkg) in files.items():
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        tree = ast.parse(p.read_text())
        skip = type_checking_only(tree)
        edges = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    mod = ".".join(base[: len(base) - node.level + 1] + ([mod] if mod else []))
                for a in node.names:
                    sub = f"{mod}.{a.name}"
                    edges.add(sub if sub in files else mod)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("importlib.import_module", "import_module")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                edges.add(node.args[0].value)
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_import_cycles(pkg):
    """docs/architecture.md's rule: no import cycle, lazy imports included, in the whole graph
    of the four packages (a cycle through another package is reported for each package)."""
    bad = [c for c in _cycles(_import_graph()) if any(m.split(".")[0] == pkg for m in c)]
    assert not bad, "import cycles: " + "; ".join(" <-> ".join(c) for c in bad)


def test_the_cycle_finder_sees_lazy_imports(tmp_path, monkeypatch):
    """A cycle closed by a function-level import counts; one under TYPE_CHECKING does not."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import y\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(_import_graph(("cyclepkg",))) == [["cyclepkg.a", "cyclepkg.b"]]


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


#: the packages whose public names the packages above them may use
LOWER = ("flydsl_core", "flydsl_kernels")
#: the packages held to that (torch-flydsl's glue, the model evaluations)
UPPER = ("torch_flydsl", "flydsl_models")


def _public_module(name: str) -> bool:
    """The rule (docs/architecture.md's layering rules): ``flydsl_core`` and ``flydsl_kernels``
    are public; below them a module is public when its parent is and either the parent lists it
    in ``__all__`` (``flydsl_kernels.gemm.configs``) or the parent is the package itself and
    the module declares its own ``__all__`` (``flydsl_core.targets``, ``flydsl_core.settings``,
    ``flydsl_kernels.gemm``). Anything else (``flydsl_core.backends.triton.codegen``,
    ``flydsl_core.runtime.kernel``, ``flydsl_kernels._target``) is private."""
    import importlib
    import importlib.util

    parts = name.split(".")
    if parts[0] not in LOWER:
        return False
    if len(parts) == 1:
        return True
    parent = ".".join(parts[:-1])
    if parts[-1].startswith("_") or not _public_module(parent):
        return False
    if not _is_module(name):
        return False
    listed = parts[-1] in getattr(importlib.import_module(parent), "__all__", ())
    return listed or (len(parts) == 2 and hasattr(importlib.import_module(name), "__all__"))


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a name inside a module, not a module
        return False


def _public_name(module: str, name: str) -> bool:
    """``module.name`` is a public name: a public module's, in its ``__all__`` (where it
    declares none: not starting with ``_``), or a public module itself."""
    import importlib

    if not _public_module(module):
        return False
    if _public_module(f"{module}.{name}"):
        return True
    declared = getattr(importlib.import_module(module), "__all__", None)
    return name in declared if declared is not None else not name.startswith("_")


def _lower_uses(packages=UPPER):
    """``[(file:line, what)]``: every use of a ``LOWER`` package by the modules of
    ``packages``: ``import M``, ``from M import n``, and ``alias.n`` where ``alias`` names a
    module imported so (by AST, lazy imports included)."""
    import ast
    import importlib.util
    import pathlib

    out = []
    for pkg in packages:
        root = pathlib.Path(next(iter(importlib.util.find_spec(pkg).submodule_search_locations)))
        for p in sorted(root.rglob("*.py")):
            tree = ast.parse(p.read_text())
            where = f"{pkg}/{p.relative_to(root).as_posix()}"
            aliases = {}  # local name -> the LOWER module it names
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name.split(".")[0] in LOWER:
                            out.append((f"{where}:{node.lineno}", ("import", a.name)))
                            aliases[a.asname or a.name.split(".")[0]] = (
                                a.name if a.asname else a.name.split(".")[0]
                            )
                elif (
                    isinstance(node, ast.ImportFrom)
                    and not node.level
                    and (node.module or "").split(".")[0] in LOWER
                ):
                    for a in node.names:
                        out.append((f"{where}:{node.lineno}", ("from", node.module, a.name)))
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in aliases
                    and _is_module(aliases[node.value.id])
                ):
                    mod = aliases[node.value.id]
                    out.append((f"{where}:{node.lineno}", ("from", mod, node.attr)))
    return out


def test_upper_packages_use_only_public_names_of_core_and_kernels():
    """torch-flydsl and flydsl-models reach flydsl_core and flydsl_kernels through their
    public names only (``_public_module``), so the core and the kernels can change what is
    behind them."""
    uses = _lower_uses()
    assert any(w.startswith("torch_flydsl/") for w, _ in uses)
    bad = []
    for where, use in uses:
        if use[0] == "import":
            ok = _public_module(use[1])
        else:
            ok = _public_name(use[1], use[2])
        if not ok:
            bad.append(f"{where}: {'.'.join(use[1:])}")
    assert not bad, "private names used:\n" + "\n".join(bad)


def test_the_public_rule_tells_public_from_private():
    assert _public_name("flydsl_core", "generated_launch")
    assert _public_name("flydsl_core", "settings")  # a first-level module with __all__
    assert _public_name("flydsl_core.targets", "lookup_target")
    assert _public_name("flydsl_kernels.gemm", "configs")  # listed in the family's __all__
    assert not _public_name("flydsl_core.runtime.kernel", "launch_sink")
    assert not _public_name("flydsl_core.backends.triton.codegen", "GeneratedKernel")
    assert not _public_name("flydsl_core.cache.keys", "source_fingerprint")  # use flydsl_core.cache
    assert not _public_name("flydsl_kernels", "_target")
    assert not _public_name("flydsl_core.targets", "_detect_device_arch")
