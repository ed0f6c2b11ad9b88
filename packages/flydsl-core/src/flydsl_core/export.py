"""``flydsl export``: kernels as standalone Triton modules, for builds outside FlyDSL.

Upstream kernel collections that build from source take one kernel per file, no torch import
at module level, a frozen argument layout, launch decisions as data and per-chip tuning
tables, and cross-compile with no GPU. For each launch of the selected kernels this writes

* ``<group>/<kernel>__<problem>.py``: FlyDSL's generated ``@triton.jit`` source for the
  target, importing ``triton`` only, under a header naming the kernel's source (file and
  function), the git commit and the compiler fingerprint;
* ``<group>/<kernel>__<problem>.json``: its launch contract: the FlyDSL arguments (dtypes,
  ranks, what each size and stride must satisfy), the ``@triton.jit`` parameters in order and
  which argument, size or stride each is read from, the compile-time constants baked into the
  source, the launch options and the grid (its rule as the plan writes it, and its value at
  the problem it was built for);
* ``<group>/tuning.json``: the group's shipped tuning table of every tuned target, where the
  group has one;
* ``README.md`` and ``manifest.json`` in the output folder.

What to export comes from ``ExportGroup``s: the core's examples, and those of every package
that declares a ``flydsl_core.exports`` entry point (a function returning its groups;
flydsl-kernels declares its families there). The core knows no kernel family by name.

By default the exported source is *portable*: the specialization keeps each launch's
dtypes, ranks, unit strides (the contiguous axes) and compile-time constants, but no fact
of the problem's sizes (a row count that happened to be a multiple of 16, or 1), so the
kernel is valid for every size; Triton's own launcher specializes divisibility again at
each launch. ``specialized=True`` keeps the problem's facts (the code FlyDSL's own launch
compiles at that shape; the contract then lists them as requirements).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exc import UsageError

FORMAT = "flydsl.export/1"
#: the entry point group of packages that contribute export groups
ENTRY_POINT_GROUP = "flydsl_core.exports"
#: top-level modules an exported file may import
ALLOWED_IMPORTS = ("triton",)


@dataclass
class ExportItem:
    """One kernel launch to export: what ``Kernel.compile`` would take, plus its grid."""

    kernel: Any  # a flydsl_core Kernel
    args: tuple  # run-time arguments (TensorSpecs, tensors, numbers), in the kernel's order
    constexprs: dict
    options: dict  # launch options (num_warps, num_stages, AMD's ...)
    grid: tuple  # the grid at the problem this launch was built for
    grid_rule: dict | None = None  # ``grid_rule(...)``: the grid as its source writes it


@dataclass
class ExportCase:
    """A launch (or the few launches) of one problem, built for a target on demand."""

    kernel: str  # the kernel's name (what a user selects)
    problem: str  # e.g. "4096x8192 bf16"
    launches: Callable[[str], list[ExportItem]]  # target -> launches
    config: Callable[[str], dict] | None = None  # target -> the shipped config used
    notes: str = ""


@dataclass
class ExportGroup:
    """What one package exports under one name (a kernel family, the core's examples)."""

    name: str
    cases: Callable[[], list[ExportCase]]
    tables: Callable[[], dict] | None = None  # {target: shipped tuning table (JSON-able)}
    description: str = ""
    provider: str = ""  # the package


# -- discovery and selection ------------------------------------------------------------------------


def _example_group() -> ExportGroup:
    from . import examples

    def cases():
        out = []
        for name in examples.NAMES:
            mod = examples.load(name)
            for dname in ("fp32", "bf16"):
                shape = "x".join(str(s) for s in mod.DEFAULT_SHAPE)
                out.append(
                    ExportCase(
                        mod.KERNEL.name,
                        f"{shape} {dname}",
                        functools.partial(_example_launches, mod, dname),
                        notes=(mod.__doc__ or "").strip().splitlines()[0],
                    )
                )
        return out

    return ExportGroup(
        "examples",
        cases,
        description="the example kernels of flydsl_core (flydsl_core.examples)",
        provider="flydsl_core",
    )


def _example_launches(mod, dname: str, target: str) -> list[ExportItem]:
    """The launches ``mod.run`` makes on its default inputs (recorded, not run)."""
    import torch

    from .runtime.sink import launch_sink, split_launch_options

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
    inputs = mod.make_inputs(dtype=dtype, generator=torch.Generator().manual_seed(0))
    items: list[ExportItem] = []

    def record(kernel, grid, args, kwargs):
        consts, _, options = split_launch_options(kernel, kwargs)
        where = launch_site()
        items.append(
            ExportItem(kernel, tuple(args), consts, options, _grid3(grid), grid_rule(*where))
        )

    with launch_sink(record):
        mod.run(*inputs)
    return items


def _grid3(grid) -> tuple:
    g = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    return tuple(int(x) for x in g)


def groups() -> dict[str, ExportGroup]:
    """Every export group: the core's examples, then each entry point's (sorted by name)."""
    from importlib.metadata import entry_points

    out = {"examples": _example_group()}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        for g in ep.load()():
            if g.name in out:
                raise UsageError(
                    f"export group {g.name!r} is declared twice ({out[g.name].provider} and "
                    f"{g.provider or ep.value})"
                )
            out[g.name] = g
    return out


def select(names: Iterable[str], found: dict[str, ExportGroup]):
    """``[(group, [case, ...]), ...]`` for ``names``: group names (all their cases), kernel
    names (their cases in any group) or ``all``; an unknown name is a ``UsageError``."""
    names = list(names)
    if not names or "all" in names:
        return [(g, g.cases()) for g in found.values()]
    chosen: dict[str, list] = {}
    cases = {n: g.cases() for n, g in found.items()}
    for name in names:
        if name in found:
            chosen[name] = cases[name]
            continue
        hits = {g: [c for c in cs if c.kernel == name] for g, cs in cases.items()}
        hits = {g: cs for g, cs in hits.items() if cs}
        if not hits:
            kernels = sorted({c.kernel for cs in cases.values() for c in cs})
            raise UsageError(
                f"nothing to export named {name!r}; name a group ({', '.join(found)}), a kernel "
                f"({', '.join(kernels)}) or all"
            )
        for g, cs in hits.items():
            have = chosen.setdefault(g, [])
            have += [c for c in cs if c not in have]
    return [(found[g], cs) for g, cs in chosen.items()]


# -- where a launch's grid comes from ---------------------------------------------------------------

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep + "runtime" + os.sep


def launch_site(skip: str = _RUNTIME_DIR) -> tuple[str, int]:
    """``(file, line)`` of the nearest caller outside files under ``skip``."""
    import sys

    f = sys._getframe(1)
    here = os.path.abspath(__file__)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if path != here and not path.startswith(skip):
            return path, f.f_lineno
        f = f.f_back
    return "", 0


@functools.lru_cache(maxsize=64)
def _parsed(path: str):
    try:
        return ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None


def _grid_node(call: ast.Call) -> ast.expr | None:
    """The grid of ``kernel[grid](...)`` or of ``Launch(kernel, grid, ...)`` / ``grid=``."""
    if isinstance(call.func, ast.Subscript):
        return call.func.slice
    for kw in call.keywords:
        if kw.arg == "grid":
            return kw.value
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name.endswith("Launch") and len(call.args) >= 2:
        return call.args[1]
    return None


def grid_rule(path: str, line: int) -> dict | None:
    """The grid of the launch written at ``path:line`` as its source writes it:
    ``{"expression", "where", "definitions"}``, where ``definitions`` lists the assignments
    (in the same function, before the line) of the names the expression uses, two levels
    deep, in the order found. None where the source cannot be read."""
    tree = _parsed(path) if path else None
    if tree is None:
        return None
    funcs = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    func = min(funcs, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)
    scope = func or tree
    calls = [
        n
        for n in ast.walk(scope)
        if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    grid = None
    for c in sorted(calls, key=lambda n: (n.end_lineno or n.lineno) - n.lineno):
        grid = _grid_node(c)
        if grid is not None:
            break
    if grid is None:
        return None
    params = set()
    if func is not None:
        a = func.args
        params = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    defs: list[str] = []
    seen: set[str] = set()

    def define(expr, depth):
        for n in ast.walk(expr):
            if not isinstance(n, ast.Name) or n.id in seen:
                continue
            seen.add(n.id)
            src = _assignment(scope, n.id, line)
            if src is not None:
                if src[0] not in defs:
                    defs.append(src[0])
                if depth:
                    define(src[1], depth - 1)
            elif n.id in params:
                defs.append(f"{n.id}: a parameter of {func.name}")

    define(grid, 1)
    where = f"{_display_path(path)}:{line}" + (f" ({func.name})" if func is not None else "")
    return {"expression": ast.unparse(grid), "where": where, "definitions": defs}


def _assignment(scope, name: str, line: int):
    """``(text, value)`` of the last assignment to ``name`` in ``scope`` before ``line``."""
    best = None
    for n in ast.walk(scope):
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno < line and n.value is not None:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names = {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
            if name in names and (best is None or n.lineno > best.lineno):
                best = n
    return (ast.unparse(best), best.value) if best is not None else None


# -- sources, commits, fingerprints ------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _repo(directory: str) -> dict | None:
    """``{"root", "commit", "modified"}`` of the git checkout holding ``directory``, or None."""
    try:

        def git(*a):
            return subprocess.run(
                ["git", "-C", directory, *a], capture_output=True, text=True, timeout=20, check=True
            ).stdout

        root = git("rev-parse", "--show-toplevel").strip()
        commit = git("rev-parse", "HEAD").strip()
        modified = {
            line[3:].strip().split(" -> ")[-1]
            for line in git("status", "--porcelain", "--untracked-files=all").splitlines()
        }
    except (OSError, subprocess.SubprocessError):
        return None
    return {"root": root, "commit": commit, "modified": modified}


def _display_path(path: str) -> str:
    """``path`` relative to its git checkout, else to its top-level package's parent."""
    repo = _repo(os.path.dirname(path)) if path else None
    if repo and path.startswith(repo["root"] + os.sep):
        return os.path.relpath(path, repo["root"])
    return os.path.basename(path)


def kernel_source(kernel) -> dict:
    """Where a kernel is defined: module, file, function, line, and the git commit."""
    fn = kernel.fn
    path = os.path.abspath(inspect.getsourcefile(fn) or "")
    try:
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        line = None
    out = {
        "module": fn.__module__,
        "file": _display_path(path),
        "function": fn.__qualname__,
        "line": line,
        "commit": None,
    }
    repo = _repo(os.path.dirname(path)) if path else None
    if repo:
        rel = os.path.relpath(path, repo["root"])
        out["commit"] = {"sha": repo["commit"], "file_modified": rel in repo["modified"]}
    return out


# -- the portable specialization ---------------------------------------------------------------------


def _portable(kernel, args: tuple, specialized: bool) -> tuple:
    """``args`` with the problem's size facts dropped (see the module docstring)."""
    from .runtime.spec import TensorSpec, is_tensor_like

    names = [n for n in kernel.signature.parameters if n not in kernel.constexpr_params]
    out = []
    for name, a in zip(names, args):
        if isinstance(a, TensorSpec) or is_tensor_like(a):
            shape = tuple(a.shape)
            if isinstance(a, TensorSpec):
                stride = a.stride or _contiguous(shape)
                aligned, bits = a.aligned, a.index_bits
            else:
                from .runtime.spec import _fits32

                stride, aligned, bits = tuple(a.stride()), True, 32 if _fits32(a) else 64
            if not specialized:
                static = kernel.static_dims.get(name, ())
                shape = tuple(s if i in static else None for i, s in enumerate(shape))
                stride = tuple(1 if s == 1 else None for s in stride)
            out.append(TensorSpec(a.dtype, shape, tuple(stride), aligned, bits))
        elif isinstance(a, int) and not isinstance(a, bool) and not specialized:
            out.append(3 if -(2**31) <= a < 2**31 else 2**40 + 3)  # the width, no facts
        else:
            out.append(a)
    return (*out, *args[len(out) :])


def _contiguous(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


# -- one launch: source and contract -------------------------------------------------------------------


def _fact(f) -> dict | None:
    d = dict(f)
    if "value" in d:
        return {"equals": d["value"]}
    if "div" in d:
        return {"multiple_of": d["div"]}
    return None


def _argument(name: str, s) -> dict:
    if s.kind == "tensor":
        return {
            "name": name,
            "kind": "tensor",
            "dtype": s.dtype.name,
            "rank": s.rank,
            "sizes": [_fact(f) for f in s.size_facts],
            "strides": [_fact(f) for f in s.stride_facts],
            "aligned_16_bytes": bool(s.aligned),
            "offsets_fit_int32": s.index_bits == 32,
        }
    return {"name": name, "kind": "scalar", "dtype": s.dtype.name, "value": _fact(s.facts)}


def _jsonable(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {_key(k): _jsonable(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if hasattr(v, "to_json"):
        return _jsonable(v.to_json())
    return repr(v)


def _key(k) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, tuple):
        return "|".join(str(x) for x in k)
    return str(k)


def jsonable(v):
    """``v`` (configs, dataclasses, tuple-keyed tables, dtypes) as JSON data."""
    return _jsonable(v)


def generate(item: ExportItem, target: str, *, specialized: bool = False):
    """``(generated source, contract)`` of one launch for ``target`` (a Triton-generating
    target); ``render`` puts the contract's header on the source."""
    import triton

    from .backends import get_backend
    from .cache.keys import compiler_fingerprint, source_fingerprint
    from .targets import get_target

    tgt = get_target(target)
    backend = get_backend(tgt)
    if not backend.generates_source:
        raise UsageError(
            f"--target {tgt.name} does not generate Triton; export for a GPU target "
            "(gfx950, gfx942, gfx1250, sm90) or cpu-interpret"
        )
    k = item.kernel
    args = _portable(k, tuple(item.args), specialized)
    spec = k.specialize(k.bind(args, dict(item.constexprs)))
    gen = backend.generate(k.lower(spec))
    src = kernel_source(k)
    params = [
        {
            "name": p.name,
            "argument": list(spec.runtime)[p.arg],
            "reads": {"tensor": "data pointer", "shape": "size", "stride": "stride"}.get(
                p.kind, "value"
            ),
            "dim": p.dim,
            "triton_type": p.sig,
            "divisibility": p.divisibility,
            "pointer_range_32": p.pointer_range_32 or None,
        }
        for p in gen.params
    ]
    contract = {
        "format": FORMAT,
        "kernel": k.name,
        "doc": inspect.getdoc(k.fn) or "",
        "triton_function": gen.name,
        "target": tgt.name,
        "portable": not specialized,
        "source": src,
        "compiler_fingerprint": compiler_fingerprint(),
        "kernel_fingerprint": source_fingerprint(k.fn),
        "triton_version": triton.__version__,
        "arguments": [_argument(n, spec.specs[n]) for n in spec.runtime],
        "constexprs": _jsonable(spec.constexprs),
        "params": params,
        "launch": backend.compile_options(dict(item.options)),  # what a compile would use
        "grid": {"example": list(item.grid), "rule": item.grid_rule},
    }
    return gen.source, contract


def render(source: str, c: dict) -> str:
    """The generated module with our header docstring in place of the generator's."""
    end = source.index('"""', 3) + 3 if source.startswith('"""') else 0
    s = c["source"]
    commit = "unavailable (not a git checkout)"
    if s["commit"]:
        commit = s["commit"]["sha"] + (
            " (the file had uncommitted changes)" if s["commit"]["file_modified"] else ""
        )
    consts = ", ".join(f"{k}={v!r}" for k, v in sorted(c["constexprs"].items())) or "none"
    launch = ", ".join(f"{k}={v!r}" for k, v in sorted(c["launch"].items()))
    rule = c["grid"]["rule"]
    lines = [
        f'"""FlyDSL kernel `{c["kernel"]}` exported as standalone Triton for {c["target"]}.',
        "",
        f"Source: {s['file']}, function {s['function']}"
        + (f" (line {s['line']})" if s["line"] else "")
        + f", module {s['module']}",
        f"Commit: {commit}",
        f"Compiler fingerprint: {c['compiler_fingerprint']} (Triton {c['triton_version']})",
        f"Kernel fingerprint: {c['kernel_fingerprint']}",
        f"Problem: {c.get('problem') or 'unnamed'}",
        f"Compile-time constants (baked in): {consts}",
        f"Launch options: {launch}",
        f"Grid: {tuple(c['grid']['example'])} for that problem"
        + (f"; rule: {rule['expression']} ({rule['where']})" if rule else ""),
        "Arguments, parameters and requirements: the launch contract, "
        f"{c.get('contract_file', 'the .json beside this file')}.",
        "Imports triton only. Generated by `flydsl export`; do not edit: export again.",
        '"""',
    ]
    return "\n".join(lines) + source[end:]


# -- writing a folder ---------------------------------------------------------------------------------


def _slug(text: str) -> str:
    s = re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_")
    return s[:80] or "case"


def export(
    selection,
    target: str,
    out: Path,
    *,
    specialized: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Write the selected kernels for ``target`` into ``out`` (see the module docstring);
    returns the manifest. ``selection``: names (as ``select`` takes them) or what ``select``
    returned."""
    from .cache.keys import compiler_fingerprint
    from .targets import get_target

    tgt = get_target(target)
    chosen = selection
    if not selection or isinstance(next(iter(selection)), str):
        chosen = select(selection, groups())
    out = Path(out)
    manifest = {
        "format": FORMAT,
        "target": tgt.name,
        "portable": not specialized,
        "compiler_fingerprint": compiler_fingerprint(),
        "groups": {},
    }
    for group, cases in chosen:
        gdir = out / group.name
        gdir.mkdir(parents=True, exist_ok=True)
        entry = {"description": group.description, "provider": group.provider, "kernels": []}
        taken: set[str] = set()
        for case in cases:
            items = case.launches(tgt.name)
            config = _jsonable(case.config(tgt.name)) if case.config else None
            for i, item in enumerate(items):
                stem = f"{item.kernel.name}__{_slug(case.problem)}"
                if len(items) > 1:
                    stem += f"__{i}"
                base, n = stem, 2
                while stem in taken:
                    stem, n = f"{base}_{n}", n + 1
                taken.add(stem)
                if progress:
                    progress(f"{group.name}/{stem}")
                source, contract = generate(item, tgt.name, specialized=specialized)
                contract = {
                    **contract,
                    "group": group.name,
                    "problem": case.problem,
                    "config": config,
                    "notes": case.notes,
                    "file": f"{stem}.py",
                    "contract_file": f"{stem}.json",
                }
                source = render(source, contract)
                (gdir / f"{stem}.py").write_text(source)
                (gdir / f"{stem}.json").write_text(json.dumps(contract, indent=1) + "\n")
                entry["kernels"].append(
                    {
                        "kernel": item.kernel.name,
                        "problem": case.problem,
                        "file": f"{group.name}/{stem}.py",
                        "contract": f"{group.name}/{stem}.json",
                    }
                )
        if group.tables is not None:
            (gdir / "tuning.json").write_text(
                json.dumps({"group": group.name, "tables": _jsonable(group.tables())}, indent=1)
                + "\n"
            )
            entry["tuning"] = f"{group.name}/tuning.json"
        manifest["groups"][group.name] = entry
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "README.md").write_text(_readme(manifest))
    return manifest


def _readme(m: dict) -> str:
    rows = [
        f"| `{k['file']}` | `{k['kernel']}` | {k['problem']} |"
        for g in m["groups"].values()
        for k in g["kernels"]
    ]
    tables = [f"`{g['tuning']}`" for g in m["groups"].values() if "tuning" in g]
    kind = (
        "portable: valid for every size (only the unit strides, dtypes, ranks and the "
        "compile-time constants of each launch are fixed)"
        if m["portable"]
        else "specialized to each problem's shapes (see each contract's `arguments`)"
    )
    return "\n".join(
        [
            f"# FlyDSL kernels exported for {m['target']}",
            "",
            "Each `.py` is one kernel's generated Triton source: it imports `triton` only (no "
            "FlyDSL package, no torch) and holds one `@triton.jit` function (plus the small "
            "`@triton.jit` helpers it calls). Its header names the FlyDSL source (file and "
            "function), the git commit and the compiler fingerprint "
            f"(`{m['compiler_fingerprint'][:16]}...`). The code is {kind}.",
            "",
            "Beside each, a `.json` launch contract: `arguments` (the FlyDSL kernel's run-time "
            "arguments: dtype, rank, what each size and stride must satisfy), `params` (the "
            "`@triton.jit` parameters in order: the argument each reads, and whether its data "
            "pointer, a size or a stride), `constexprs` (baked into the source), `launch` "
            "(`num_warps`, `num_stages`, AMD options), `grid` (its value at the problem it was "
            "built for, and its rule as the FlyDSL plan writes it). Launch:",
            "",
            "```python",
            "params = [arg_of(p) for p in contract['params']]  # tensor, t.shape[dim], "
            "t.stride(dim) or a value",
            "kernel[grid](*params, **contract['launch'])",
            "```",
            "",
            "Tuning tables (each tuned target's shipped configs, with their sources): "
            + (", ".join(tables) if tables else "none for these groups")
            + ". `manifest.json` lists everything.",
            "",
            "| file | kernel | problem |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )
