"""Cache keys: a hex sha256 over a canonical JSON encoding of named parts.

A key is built only from what the caller passes to ``make_key`` (plus the
compiler's own fingerprint). Nothing ambient goes in: no environment
variables, host names, user names, times, PIDs, working directory or absolute
file paths. A key that silently depended on the environment made
ahead-of-time caches miss upstream, so anything that must influence a key has
to be passed in explicitly as a part.

The parts the compiler passes are:

* ``source``: ``source_fingerprint(kernel_fn)``, covering the kernel and every
  user function it calls, and the global constants it reads;
* ``constants``, ``constexprs`` and ``config``: captured values;
* ``signature``: argument dtypes and divisibility;
* ``target`` and ``options``.

``make_key`` adds ``compiler=compiler_fingerprint()`` unless a ``compiler``
part is passed explicitly.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import sys
import sysconfig
import textwrap
import threading
import types
import weakref
from pathlib import Path
from typing import Any

from .._version import __version__

__all__ = [
    "KEY_FORMAT",
    "CacheKey",
    "SourceGuard",
    "canonical_json",
    "compiler_fingerprint",
    "guarded_fingerprint",
    "make_key",
    "source_fingerprint",
]

#: Bumped when the way keys are derived changes, so old entries stop matching.
KEY_FORMAT = 1


# --------------------------------------------------------------------------- #
# canonical JSON
# --------------------------------------------------------------------------- #


def _canon(obj: Any, where: str) -> Any:
    """``obj`` as plain JSON data (dict/list/str/int/float/bool/None)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)  # int subclasses (IntEnum is handled below) lose their type
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"__bytes__": bytes(obj).hex()}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(
                    f"cache key part {where}: dict keys must be str or int, got {type(k).__name__}"
                )
            sk = str(k)
            if sk in out:
                raise TypeError(f"cache key part {where}: key {k!r} appears twice once made a str")
            out[sk] = _canon(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, (list, tuple)):
        return [_canon(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    for method in ("cache_key", "to_json"):
        fn = getattr(obj, method, None)
        if callable(fn) and not isinstance(obj, type):
            return _canon(fn(), f"{where}.{method}()")
    if isinstance(obj, enum.Enum):
        return {"__enum__": f"{type(obj).__qualname__}.{obj.name}"}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return _canon(fields, where)
    raise TypeError(
        f"cache key part {where}: cannot encode a {type(obj).__qualname__}; pass "
        "str/int/float/bool/None/bytes, dicts, lists or tuples of them, or an object "
        "with a to_json() or cache_key() method"
    )


def canonical_json(obj: Any, *, where: str = "value") -> str:
    """The canonical JSON text of ``obj``: sorted keys, no whitespace, ASCII only.

    Supported: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
    dicts (str or int keys), lists and tuples (both encode as a JSON list),
    enums, dataclass instances (as a dict of their fields) and objects with a
    ``cache_key()`` or ``to_json()`` method (encoded as what it returns).
    Anything else raises ``TypeError`` naming where the value sits.
    """
    return _dumps(_canon(obj, where))


def _dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha256(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- #
# keys
# --------------------------------------------------------------------------- #


class CacheKey(str):
    """A cache key: the hex sha256 digest, usable anywhere a ``str`` is.

    ``canonical`` keeps the canonical JSON the digest was computed from, so
    ``diff()`` can say which parts made two keys differ (why a lookup missed).
    """

    canonical: str

    def __new__(cls, digest: str, canonical: str = "") -> CacheKey:
        self = super().__new__(cls, digest)
        self.canonical = canonical
        return self

    def parts(self) -> dict[str, Any]:
        """The decoded parts this key was built from (empty if unknown)."""
        return json.loads(self.canonical)["parts"] if self.canonical else {}

    def diff(self, other: CacheKey) -> list[str]:
        """Names of the parts that differ between this key and ``other``."""
        a, b = self.parts(), other.parts()
        return sorted(k for k in a.keys() | b.keys() if a.get(k, ...) != b.get(k, ...))


def make_key(**parts: Any) -> CacheKey:
    """A ``CacheKey`` from named parts; the order of the parts does not matter.

    Every part is encoded with ``canonical_json``. A ``compiler`` part equal to
    ``compiler_fingerprint()`` is added unless the caller passes one (pass
    ``compiler=None`` to leave it out, e.g. for keys that outlive compilers).

    Only the parts go in: nothing is read from the environment, the clock,
    the host, the process or the working directory, so the same parts give the
    same key on every machine and in every process.
    """
    if "compiler" not in parts:
        parts["compiler"] = compiler_fingerprint()
    encoded = {name: _canon(value, name) for name, value in parts.items()}
    canon = _dumps({"format": KEY_FORMAT, "parts": encoded})
    return CacheKey(_sha256(canon), canon)


# --------------------------------------------------------------------------- #
# compiler fingerprint
# --------------------------------------------------------------------------- #

_TRITON_DISTS = ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-nightly")


def _triton_version() -> str | None:
    """Triton's version, or None when triton cannot be imported.

    Read from the package metadata when possible, so triton itself is only
    imported when no distribution of it is known.
    """
    try:
        if importlib.util.find_spec("triton") is None:
            return None
    except (ImportError, ValueError):
        return None
    for dist in _TRITON_DISTS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import triton
    except Exception:
        return None
    return str(getattr(triton, "__version__", "unknown"))


def _package_dir() -> Path:
    return Path(__file__).resolve().parents[1]  # flydsl_core/cache/keys.py -> flydsl_core


def _flydsl_version() -> str:
    try:
        return importlib.metadata.version("flydsl-core")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def compiler_components() -> dict[str, Any]:
    """What ``compiler_fingerprint`` hashes, for diagnostics (uncached)."""
    pkg = _package_dir()
    h = hashlib.sha256()
    files = sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)
    for p in files:
        rel = p.relative_to(pkg).as_posix().encode()
        data = p.read_bytes()
        h.update(b"%d:%s\0%d:" % (len(rel), rel, len(data)))
        h.update(data)
    return {
        "flydsl_core": _flydsl_version(),
        "sources": h.hexdigest(),
        "source_files": len(files),
        "triton": _triton_version(),
    }


@functools.cache
def compiler_fingerprint() -> str:
    """A hex sha256 identifying this compiler build.

    Covers flydsl_core's version, the bytes of every ``.py`` file of the
    installed ``flydsl_core`` package (paths relative to the package, sorted)
    and, when triton is importable, triton's version. Computed once per
    process; ``compiler_fingerprint.cache_clear()`` forces a recomputation.
    """
    return _sha256(canonical_json(compiler_components()))


# --------------------------------------------------------------------------- #
# source fingerprints
# --------------------------------------------------------------------------- #

_MAX_UNWRAP = 16


def _as_function(obj: Any) -> types.FunctionType | None:
    """The plain Python function behind ``obj`` (methods, static/class methods,
    objects with ``__flydsl_fn__``), or None."""
    for _ in range(_MAX_UNWRAP):
        if isinstance(obj, types.FunctionType):
            return obj
        if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
            obj = obj.__func__
            continue
        if isinstance(obj, (type, types.ModuleType)):
            return None
        try:
            inner = getattr(obj, "__flydsl_fn__", None)
        except Exception:
            return None
        if inner is None or inner is obj:
            return None
        obj = inner
    return None


def _norm(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(site-packages dirs, stdlib dirs)."""
    paths = sysconfig.get_paths()
    site = {paths[k] for k in ("purelib", "platlib") if k in paths}
    try:
        import site as site_mod

        site.update(site_mod.getsitepackages())
        site.add(site_mod.getusersitepackages())
    except Exception:
        pass
    std = {paths[k] for k in ("stdlib", "platstdlib") if k in paths}
    std.add(
        sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["stdlib"]
    )

    def norm(dirs: set[str]) -> tuple[str, ...]:
        return tuple(sorted({_norm(d).rstrip(os.sep) + os.sep for d in dirs if d}))

    return norm(site), norm(std)


@functools.lru_cache(maxsize=4096)
def _classify_file(filename: str | None) -> str:
    """'flydsl' (flydsl_core itself), 'stdlib', 'site' (site-packages) or 'user'."""
    if not filename:
        return "stdlib"  # built-in modules have no file
    if filename.startswith("<frozen "):
        return "stdlib"
    if filename.startswith("<"):
        return "user"  # exec'd code, the REPL, notebooks
    path = _norm(filename)
    if path.startswith(str(_package_dir()) + os.sep):
        return "flydsl"
    site, std = _library_roots()
    parts = set(Path(path).parts)
    if any(path.startswith(r) for r in site) or {"site-packages", "dist-packages"} & parts:
        return "site"
    if any(path.startswith(r) for r in std):
        return "stdlib"
    return "user"


@functools.lru_cache(maxsize=1)
def _dists_of_top_module() -> dict[str, list[str]]:
    try:
        return dict(importlib.metadata.packages_distributions())
    except Exception:
        return {}


@functools.lru_cache(maxsize=1024)
def _dist_version(module: str) -> str | None:
    """'name==version' of the installed distribution that provides ``module``."""
    top = module.split(".")[0]
    names = sorted(set(_dists_of_top_module().get(top, [])))
    out = []
    for name in names:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ",".join(out) or None


def _const_repr(value: Any) -> Any:
    """A deterministic rendering of a code object constant."""
    if isinstance(value, types.CodeType):
        return _code_shape(value)
    if isinstance(value, tuple):
        return [_const_repr(v) for v in value]
    if isinstance(value, frozenset):
        return {"frozenset": sorted(json.dumps(_const_repr(v)) for v in value)}
    return f"{type(value).__name__}:{value!r}"


def _code_shape(code: types.CodeType) -> dict[str, Any]:
    """The parts of a code object that define behaviour: no file names, no line numbers."""
    return {
        "code": code.co_code.hex(),
        "consts": [_const_repr(c) for c in code.co_consts],
        "names": list(code.co_names),
        "varnames": list(code.co_varnames),
        "freevars": list(code.co_freevars),
        "cellvars": list(code.co_cellvars),
        "args": [code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount],
        "flags": code.co_flags,
    }


_CODE_HASHES: weakref.WeakKeyDictionary[types.CodeType, str] = weakref.WeakKeyDictionary()
_CODE_HASHES_LOCK = threading.Lock()


def _code_hash(fn: types.FunctionType) -> str:
    """sha256 of the function's source text and of its bytecode.

    The source text is what a user edits; the bytecode also catches a file that
    was edited after it was imported (the text on disk is then not what runs).
    When the source cannot be found (exec'd code), the bytecode alone is used.
    """
    code = fn.__code__
    with _CODE_HASHES_LOCK:
        cached = _CODE_HASHES.get(code)
    if cached is not None:
        return cached
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        source = None
    digest = _sha256(canonical_json({"source": source, "code": _code_shape(code)}))
    with _CODE_HASHES_LOCK:
        _CODE_HASHES[code] = digest
    return digest


def _all_names(code: types.CodeType) -> list[str]:
    """co_names of ``code`` and of the code objects nested in it, in order, once each."""
    seen: dict[str, None] = {}
    stack = [code]
    while stack:
        c = stack.pop(0)
        for n in c.co_names:
            seen.setdefault(n, None)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return list(seen)


class _Walker:
    """Depth-first walk over a function and the user functions it reaches.

    Functions are numbered in the order they are first reached; a reference to
    a function is its number, which makes cycles (mutual recursion) finite.
    """

    def __init__(self) -> None:
        self.entries: list[dict[str, Any] | None] = []
        self.index: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps ids stable during the walk
        self.reads = _Reads()  # what the walk read, for a SourceGuard

    def function(self, fn: types.FunctionType) -> int:
        ident = id(fn)
        if ident in self.index:
            return self.index[ident]
        n = len(self.entries)
        self.index[ident] = n
        self.keep.append(fn)
        self.entries.append(None)
        code = fn.__code__
        names = _all_names(code)
        g = fn.__globals__
        self.reads.function(fn)
        refs: dict[str, Any] = {}
        for name in names:
            if name in g:
                d = self.value(g[name], names)
                self.reads.item(g, name, d)
                if d is not None:
                    refs[name] = d
            else:
                self.reads.absent(g, name)
        closure: dict[str, Any] = {}
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                self.reads.cell(cell)
                continue
            d = self.value(contents, names)
            self.reads.cell(cell)
            if d is not None:
                closure[name] = d
        defaults = [self.value(v, ()) for v in fn.__defaults__ or ()]
        kwdefaults = {k: self.value(v, ()) for k, v in (fn.__kwdefaults__ or {}).items()}
        self.entries[n] = {
            "name": fn.__qualname__,
            "code": _code_hash(fn),
            "globals": refs,
            "closure": closure,
            "defaults": defaults,
            "kwdefaults": kwdefaults,
        }
        return n

    def value(self, value: Any, names: list[str] | tuple[()]) -> Any:
        """How a value a function refers to enters the fingerprint (None: not at all)."""
        fn = _as_function(value)
        if fn is not None:
            kind = _classify_file(fn.__code__.co_filename)
            decorated = fn is not value and not isinstance(
                value, (types.MethodType, staticmethod, classmethod)
            )
            ref = f"{fn.__module__}:{fn.__qualname__}"
            if kind == "user" or (decorated and kind == "site"):
                return {"fn": self.function(fn)}
            if kind == "site":
                return {"lib": ref, "dist": _dist_version(fn.__module__ or "")}
            return {"lib": ref}  # stdlib; flydsl_core is in compiler_fingerprint()
        if isinstance(value, types.BuiltinFunctionType):
            return {"lib": f"{value.__module__}:{value.__qualname__}"}
        if isinstance(value, types.ModuleType):
            if _classify_file(getattr(value, "__file__", None)) != "user":
                return {"module": value.__name__}
            # ``mod.helper(x)``: the attribute names are among co_names. The
            # module's own name is left out, like the kernel's.
            attrs = {}
            members = vars(value)
            for n in names:
                if n in members and members[n] is not value:
                    d = self.value(members[n], ())
                    self.reads.item(members, n, d)
                    if d is not None:
                        attrs[n] = d
            return {"user_module": attrs}
        if isinstance(value, type):
            return {"type": f"{value.__module__}:{value.__qualname__}"}
        try:
            return {"const": _canon(value, "constant")}
        except Exception:
            # Not encodable (tensors, arbitrary objects): only its type, never its
            # repr, which may hold a memory address.
            return {"object": f"{type(value).__module__}:{type(value).__qualname__}"}


def source_fingerprint(fn: Any) -> str:
    """A hex sha256 of a kernel's code and of everything it reads at trace time.

    Covers, recursively and with cycle protection:

    * the source text (and bytecode) of ``fn``;
    * every plain Python function it reaches through the global names it uses
      (``fn.__code__.co_names`` looked up in ``fn.__globals__``, including
      names used by nested functions and comprehensions), through closure
      cells and through default argument values;
    * objects with a ``__flydsl_fn__`` attribute (kernel / helper decorators)
      are followed to the wrapped function;
    * ``module.attr`` where ``module`` is a user module: the attributes whose
      names the function uses;
    * the values of global constants (int/float/bool/str/bytes/None, tuples
      of them, and anything ``canonical_json`` can encode).

    Functions from the standard library and from flydsl_core itself enter by
    name only (flydsl_core is covered by ``compiler_fingerprint()``), and
    undecorated functions from site-packages by name and distribution version.
    Module names, file paths and line numbers are left out, so moving a
    project directory or renaming a module keeps the fingerprint.
    Not followed: methods reached through classes or instances.
    """
    return _walk(fn)[0]


def _walk(fn: Any) -> tuple[str, _Walker]:
    target = _as_function(fn)
    if target is None:
        raise TypeError(f"source_fingerprint needs a Python function, got {type(fn).__qualname__}")
    walker = _Walker()
    walker.function(target)
    digest = _sha256(canonical_json({"format": KEY_FORMAT, "functions": walker.entries}))
    return digest, walker


# --------------------------------------------------------------------------- #
# source guards: is a fingerprint still current? (cheap enough for every launch)
# --------------------------------------------------------------------------- #

#: constants held by value that can change in place (their identity does not say enough)
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), enum.Enum)


def _frozen(v: Any) -> bool:
    if isinstance(v, tuple | frozenset):
        return all(_frozen(x) for x in v)
    return isinstance(v, _IMMUTABLE)


class _Reads:
    """The lookups a fingerprint walk made: global and module-attribute reads, builtins it
    reached through unbound globals, closure cells and the function objects themselves."""

    def __init__(self) -> None:
        self.items: dict[tuple[int, str], tuple[dict, str, Any]] = {}
        self.unbound: dict[tuple[int, str], tuple[dict, str]] = {}
        self.cells: list[tuple[Any, Any]] = []
        self.functions: list[types.FunctionType] = []
        self.by_value: list[tuple[dict, str, str]] = []  # mutable constants: (dict, name, json)

    def function(self, fn: types.FunctionType) -> None:
        self.functions.append(fn)

    def item(self, d: dict, name: str, encoded: Any) -> None:
        value = d[name]
        self.items[(id(d), name)] = (d, name, value)
        if isinstance(encoded, dict) and "const" in encoded and not _frozen(value):
            self.by_value.append((d, name, _dumps(encoded["const"])))

    def absent(self, d: dict, name: str) -> None:
        # Only names that resolve to a builtin can change meaning by being bound later; any
        # other unbound name was an attribute name (or the trace failed with a NameError).
        if hasattr(builtins, name):
            self.unbound[(id(d), name)] = (d, name)

    def cell(self, cell: Any) -> None:
        self.cells.append((cell, _cell_contents(cell)))


_EMPTY = object()


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


class SourceGuard:
    """``check()`` is True while every lookup a fingerprint was computed from gives the same
    object: the kernel's globals and module attributes (by identity; mutable constants also
    by value), the helpers it calls and their ``__code__``, closure cells, and builtins not
    shadowed by a global since. False means "maybe stale": recompute the fingerprint.

    ``check`` is generated code, one identity test per lookup (a few tens of ns each), so it
    can run on every launch."""

    def __init__(self, reads: _Reads):
        env: dict[str, Any] = {"_cell": _cell_contents, "_cj": lambda v: _dumps(_canon(v, "c"))}
        dicts: dict[int, str] = {}
        tests: list[str] = []
        keep: list[Any] = []

        def name_of(obj: Any, prefix: str) -> str:
            n = f"_{prefix}{len(env)}"
            env[n] = obj
            return n

        def dict_name(d: dict) -> str:
            if id(d) not in dicts:
                dicts[id(d)] = name_of(d, "d")
            return dicts[id(d)]

        for d, key, value in reads.items.values():
            tests.append(f"{dict_name(d)}[{key!r}] is {name_of(value, 'v')}")
        for d, key in reads.unbound.values():
            tests.append(f"{key!r} not in {dict_name(d)}")
        for cell, value in reads.cells:
            tests.append(f"_cell({name_of(cell, 'c')}) is {name_of(value, 'v')}")
        for fn in dict.fromkeys(reads.functions):
            tests.append(f"{name_of(fn, 'f')}.__code__ is {name_of(fn.__code__, 'v')}")
        for d, key, text in reads.by_value:
            tests.append(f"_cj({dict_name(d)}[{key!r}]) == {name_of(text, 't')}")
        keep.extend(env.values())
        # every object is a default argument: LOAD_FAST, several times cheaper than globals
        params = ", ".join(f"{n}={n}" for n in env)
        src = (
            f"def check({params}):\n"
            "    try:\n"
            f"        return {' and '.join(tests) or 'True'}\n"
            "    except Exception:\n"
            "        return False\n"
        )
        exec(compile(src, "<flydsl source guard>", "exec"), env)
        self.check = env["check"]
        self.source = src
        self.lookups = len(tests)


def guarded_fingerprint(fn: Any) -> tuple[str, SourceGuard]:
    """``source_fingerprint(fn)`` and a ``SourceGuard`` that says cheaply whether it still holds."""
    digest, walker = _walk(fn)
    return digest, SourceGuard(walker.reads)
