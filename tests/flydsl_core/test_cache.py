"""The compile cache: keys, source fingerprints, the in-process LRU and the disk cache."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import flydsl_core
from flydsl_core.cache import (
    CacheCorruptionWarning,
    CacheKey,
    DiskCache,
    canonical_json,
    compiler_fingerprint,
    make_key,
    source_fingerprint,
)
from flydsl_core.cache import disk as disk_mod
from flydsl_core.exc import CacheError

pytestmark = pytest.mark.cpu

KEY = "ab" + "0" * 62
FILES = {
    "kernel.hsaco": b"\x7fELF\x00\x01binary",
    "kernel.json": '{"name": "k"}',
    "source.py": "x = 1\n",
}

# The folder holding the flydsl_core package, for the child processes.
SRC_DIR = str(Path(flydsl_core.__file__).resolve().parent.parent)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYDSL_")}
    env["PYTHONPATH"] = os.pathsep.join([SRC_DIR, *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def _cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FLYDSL_DISABLE_CACHE", raising=False)


@pytest.fixture
def cache(tmp_path) -> DiskCache:
    return DiskCache(tmp_path / "cache")


# --------------------------------------------------------------------- keys


PARTS = {
    "source": "3f" * 32,
    "constants": {"BLOCK": 128, "scale": 0.5},
    "constexprs": {"N": 1024, "EVEN": True},
    "config": {"num_warps": 4, "num_stages": 2},
    "signature": [("bf16", 16), ("fp32", 1), ("i32", None)],
    "target": "gfx942",
    "options": {"fast_math": False},
}


def test_key_is_stable_and_order_free():
    k1 = make_key(**PARTS)
    k2 = make_key(**dict(reversed(list(PARTS.items()))))
    assert isinstance(k1, CacheKey) and isinstance(k1, str)
    assert k1 == k2 and len(k1) == 64 and int(k1, 16) >= 0
    assert make_key(a={"x": 1, "y": 2}) == make_key(a={"y": 2, "x": 1})
    # tuples and lists encode alike (canonical JSON)
    assert make_key(a=(1, 2)) == make_key(a=[1, 2])


@pytest.mark.parametrize(
    "part,value",
    [
        ("source", "40" * 32),
        ("constants", {"BLOCK": 64, "scale": 0.5}),
        ("constants", {"BLOCK": 128, "scale": 0.25}),
        ("constexprs", {"N": 1024, "EVEN": False}),
        ("config", {"num_warps": 8, "num_stages": 2}),
        ("signature", [("bf16", 16), ("fp32", 16), ("i32", None)]),
        ("signature", [("fp16", 16), ("fp32", 1), ("i32", None)]),
        ("target", "gfx90a"),
        ("options", {"fast_math": True}),
        ("compiler", "another compiler"),
        ("extra", 1),
    ],
)
def test_key_changes_with_each_part(part, value):
    base = make_key(**PARTS)
    changed = make_key(**{**PARTS, part: value})
    assert changed != base
    assert changed.diff(base) == [part]


def test_key_keeps_types_apart():
    keys = {make_key(v=v) for v in (1, 1.0, True, "1", None, [1], {"1": 1}, b"1")}
    assert len(keys) == 8
    assert make_key(v=0.0) != make_key(v=-0.0)


def test_key_encodes_objects():
    class Layout:
        def __init__(self, shape):
            self.shape = shape

        def to_json(self):
            return {"shape": list(self.shape)}

    class Opts:
        def cache_key(self):
            return "opts-v1"

    assert make_key(l=Layout((4, 8))) == make_key(l={"shape": [4, 8]})
    assert make_key(l=Layout((4, 8))) != make_key(l=Layout((8, 4)))
    assert make_key(o=Opts()) == make_key(o="opts-v1")
    assert canonical_json({"b": [1, (2, None)], "a": {"y": True, "x": 1.5}}) == (
        '{"a":{"x":1.5,"y":true},"b":[1,[2,null]]}'
    )
    with pytest.raises(TypeError, match=r"options\[.fn.\]"):
        make_key(options={"fn": object()})


def test_key_includes_the_compiler():
    assert make_key(a=1) == make_key(a=1, compiler=compiler_fingerprint())
    assert make_key(a=1) != make_key(a=1, compiler=None)
    fp = compiler_fingerprint()
    assert len(fp) == 64 and compiler_fingerprint() is fp  # computed once


def test_key_ignores_the_environment(tmp_path, monkeypatch):
    before = make_key(**PARTS)
    for name, value in {
        "HOME": str(tmp_path),
        "USER": "someone-else",
        "HOSTNAME": "elsewhere",
        "FLYDSL_TARGET": "gfx90a",
        "FLYDSL_DUMP_DIR": str(tmp_path),
        "PATH": "/nowhere",
        "RANDOM_VAR": "x",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    compiler_fingerprint.cache_clear()
    try:
        assert make_key(**PARTS) == before
    finally:
        compiler_fingerprint.cache_clear()
    # Another process, another environment, another working directory; there the
    # kernel also ran often enough for the interpreter to specialize its bytecode.
    mod = load(tmp_path)
    code = textwrap.dedent(
        """
        import importlib.util, json, sys
        from flydsl_core.cache import make_key, source_fingerprint
        spec = importlib.util.spec_from_file_location("renamed", sys.argv[2])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for _ in range(5000):
            mod.kernel([1.0, 2.0])
        print(make_key(**json.loads(sys.argv[1])), source_fingerprint(mod.kernel))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(PARTS), mod.__file__],
        env=child_env(HOME=str(tmp_path), LANG="C", TZ="Asia/Tokyo", FLYDSL_TARGET="gfx1100"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    # JSON turns the signature's tuples into lists, which encode alike.
    assert out.stdout.split() == [before, source_fingerprint(mod.kernel)]


# ------------------------------------------------------ source fingerprints

MODULE = """
import math

SCALE = {scale}
UNRELATED = {unrelated}
TABLE = (1, 2, {table})


def deep(x):
    return x - {deep}


def helper(x):
    return deep(x) * {factor}


def ping(n):
    return pong(n - 1) if n else 0


def pong(n):
    return ping(n - 1) if n else 1


class _Decorated:
    def __init__(self, fn):
        self.__flydsl_fn__ = fn

    def __call__(self, *a):
        return self.__flydsl_fn__(*a)


@_Decorated
def decorated_helper(x):
    return x + {decorated}


def make_closure(c):
    def inner(x):
        return x * c

    return inner


closure_kernel = make_closure({closure})


def kernel(x):
    y = [helper(v) for v in x]
    return sum(y) * SCALE + ping(3) + decorated_helper(1) + TABLE[-1] + math.floor(1.5)


def unrelated_fn(x):
    return x + {unrelated_fn}
"""

BASE = dict(scale=2, unrelated=1, table=3, deep=1, factor=3, decorated=5, closure=7, unrelated_fn=0)


def load(tmp_path: Path, **changes) -> object:
    """Write MODULE with ``changes`` to a fresh file and import it."""
    load.n = getattr(load, "n", 0) + 1
    name = f"flycache_mod_{os.getpid()}_{load.n}"
    path = tmp_path / f"v{load.n}" / f"{name}.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(MODULE.format(**{**BASE, **changes})))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fingerprint_is_stable(tmp_path):
    a, b = load(tmp_path), load(tmp_path)
    assert source_fingerprint(a.kernel) == source_fingerprint(a.kernel)
    # Same code in another file under another module name.
    assert source_fingerprint(a.kernel) == source_fingerprint(b.kernel)
    assert source_fingerprint(a.closure_kernel) == source_fingerprint(b.closure_kernel)


@pytest.mark.parametrize(
    "change",
    [
        {"factor": 4},  # a helper the kernel calls
        {"deep": 2},  # a helper of the helper
        {"decorated": 6},  # a helper behind a decorator object (__flydsl_fn__)
        {"scale": 3},  # a global constant
        {"table": 4},  # a tuple constant
    ],
)
def test_fingerprint_follows_what_the_kernel_uses(tmp_path, change):
    base, changed = load(tmp_path), load(tmp_path, **change)
    assert source_fingerprint(changed.kernel) != source_fingerprint(base.kernel)


def test_fingerprint_ignores_unrelated_code(tmp_path):
    base = load(tmp_path)
    changed = load(tmp_path, unrelated=99, unrelated_fn=42, closure=8)
    assert source_fingerprint(changed.kernel) == source_fingerprint(base.kernel)


def test_fingerprint_follows_closures_and_globals_set_later(tmp_path):
    base, changed = load(tmp_path), load(tmp_path, closure=8)
    assert source_fingerprint(changed.closure_kernel) != source_fingerprint(base.closure_kernel)
    before = source_fingerprint(base.kernel)
    base.SCALE = 10  # constants are read when fingerprinting, not at import
    assert source_fingerprint(base.kernel) != before


def test_fingerprint_follows_user_module_attributes(tmp_path, monkeypatch):
    fps = []
    for i, factor in enumerate((2, 2, 3)):
        d = tmp_path / f"pkg{i}"
        d.mkdir()
        (d / f"flycache_helpers{i}.py").write_text(f"def scale(x):\n    return x * {factor}\n")
        (d / f"flycache_kern{i}.py").write_text(
            f"import flycache_helpers{i} as h\n\ndef kernel(x):\n    return h.scale(x)\n"
        )
        monkeypatch.syspath_prepend(str(d))
        mod = importlib.import_module(f"flycache_kern{i}")
        fps.append(source_fingerprint(mod.kernel))
    assert fps[0] == fps[1] != fps[2]


def test_fingerprint_accepts_decorated_objects_and_rejects_others(tmp_path):
    mod = load(tmp_path)
    assert source_fingerprint(mod.decorated_helper) == source_fingerprint(
        mod.decorated_helper.__flydsl_fn__
    )
    with pytest.raises(TypeError):
        source_fingerprint(42)


# ------------------------------------------------------------- disk cache


def as_bytes(files):
    return {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}


def test_round_trip(cache, tmp_path):
    assert cache.get(KEY) is None and not cache.contains(KEY)
    path = cache.put(KEY, FILES)
    assert path == tmp_path / "cache" / KEY[:2] / KEY == cache.path(KEY)
    assert cache.get(KEY) == as_bytes(FILES)
    assert cache.contains(KEY) and KEY in cache
    manifest = json.loads((path / "entry.json").read_text())
    assert manifest["format"] == disk_mod.FORMAT_VERSION and manifest["key"] == KEY
    assert manifest["files"]["kernel.hsaco"]["size"] == len(FILES["kernel.hsaco"])
    assert sorted(p.name for p in path.parent.iterdir()) == [KEY]  # no leftovers


def test_default_root_and_bad_names(tmp_path, cache):
    assert DiskCache().root == tmp_path / "cache" == DiskCache.default().root
    for key in ("../etc", "a", "ab/cd", "", "x" * 200):
        with pytest.raises(ValueError):
            cache.get(key)
    with pytest.raises(ValueError):
        cache.put(KEY, {"../escape": b""})
    with pytest.raises(ValueError):
        cache.put(KEY, {"entry.json": b""})
    with pytest.raises(TypeError):
        cache.put(KEY, {"a.bin": 123})
    assert not (tmp_path / "cache" / KEY[:2] / KEY).exists()


def test_put_keeps_an_existing_entry(cache):
    cache.put(KEY, {"a.bin": b"first"})
    cache.put(KEY, {"a.bin": b"second"})
    assert cache.get(KEY) == {"a.bin": b"first"}


def test_put_keeps_an_entry_that_appears_meanwhile(cache, monkeypatch):
    real_replace = os.replace
    raced = []

    def racing_replace(src, dst):
        if not raced and Path(dst) == cache.path(KEY):
            raced.append(1)
            DiskCache(cache.root).put(KEY, {"a.bin": b"other process"})
        return real_replace(src, dst)

    monkeypatch.setattr(disk_mod.os, "replace", racing_replace)
    cache.put(KEY, {"a.bin": b"this process"})
    monkeypatch.undo()
    assert raced and cache.get(KEY) == {"a.bin": b"other process"}
    assert sorted(p.name for p in cache.path(KEY).parent.iterdir()) == [KEY]


def corrupt_truncate(entry):
    p = entry / "kernel.hsaco"
    p.write_bytes(p.read_bytes()[:3])


def corrupt_flip(entry):
    p = entry / "kernel.hsaco"
    data = bytearray(p.read_bytes())
    data[0] ^= 0xFF
    p.write_bytes(bytes(data))


def corrupt_delete(entry):
    (entry / "kernel.json").unlink()


def corrupt_entry_is_a_file(entry):
    shutil.rmtree(entry)
    entry.write_bytes(b"half")


def corrupt_manifest_garbage(entry):
    (entry / "entry.json").write_bytes(b"\x00\xffnot json{")


def corrupt_manifest_shape(entry):
    (entry / "entry.json").write_text('["a list"]')


def corrupt_manifest_missing(entry):
    (entry / "entry.json").unlink()


def corrupt_manifest_truncated(entry):
    p = entry / "entry.json"
    p.write_bytes(p.read_bytes()[:20])


@pytest.mark.parametrize(
    "corrupt",
    [
        corrupt_truncate,
        corrupt_flip,
        corrupt_delete,
        corrupt_entry_is_a_file,
        corrupt_manifest_garbage,
        corrupt_manifest_shape,
        corrupt_manifest_missing,
        corrupt_manifest_truncated,
    ],
)
def test_corrupt_entry_is_a_miss_and_is_rebuilt(cache, corrupt, caplog):
    entry = cache.put(KEY, FILES)
    corrupt(entry)
    with pytest.warns(CacheCorruptionWarning, match="corrupt entry"):
        assert cache.get(KEY) is None
    assert "corrupt entry" in caplog.text
    assert not entry.exists()  # removed

    corrupt(cache.put(KEY, FILES))
    builds = []

    def build():
        builds.append(1)
        return FILES

    with pytest.warns(CacheCorruptionWarning):
        assert cache.get_or_create(KEY, build) == as_bytes(FILES)
    assert builds == [1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get_or_create(KEY, build) == as_bytes(FILES)
    assert builds == [1]


def test_put_replaces_a_broken_entry(cache):
    entry = cache.put(KEY, FILES)
    corrupt_truncate(entry)
    cache.put(KEY, {"a.bin": b"fresh"})
    assert cache.get(KEY) == {"a.bin": b"fresh"}
    assert sorted(p.name for p in entry.parent.iterdir()) == [KEY]


def test_entry_of_another_format_is_a_quiet_miss(cache):
    entry = cache.put(KEY, FILES)
    manifest = json.loads((entry / "entry.json").read_text())
    (entry / "entry.json").write_text(json.dumps({**manifest, "format": 999}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get(KEY) is None
    assert cache.get_or_create(KEY, lambda: FILES) == as_bytes(FILES)


def test_get_or_create_builds_once(cache):
    builds = []

    def build():
        builds.append(1)
        return FILES

    assert cache.get_or_create(KEY, build) == as_bytes(FILES)
    assert cache.get_or_create(KEY, build) == as_bytes(FILES)
    assert builds == [1]


def test_failed_build_leaves_no_entry(cache):
    def failing():
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        cache.get_or_create(KEY, failing)
    shard = cache.path(KEY).parent
    assert not cache.path(KEY).exists()
    assert [p.name for p in shard.iterdir()] in ([], [f"{KEY}.lock"])
    # The lock was released: a second build goes through.
    assert cache.get_or_create(KEY, lambda: FILES) == as_bytes(FILES)


def test_failed_write_leaves_no_partial_entry(cache, monkeypatch):
    def broken_replace(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(disk_mod.os, "replace", broken_replace)
    with pytest.raises(CacheError, match="could not write cache entry"):
        cache.put(KEY, FILES)
    monkeypatch.undo()
    assert list(cache.path(KEY).parent.iterdir()) == []  # no entry, no temporary folder
    assert cache.get(KEY) is None


def test_unwritable_root_raises_cache_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cache = DiskCache(blocker / "cache")
    assert cache.get(KEY) is None  # reading a missing cache is a plain miss
    with pytest.raises(CacheError, match=r"not writable.*FLYDSL_CACHE_DIR"):
        cache.put(KEY, FILES)
    with pytest.raises(CacheError):
        cache.get_or_create(KEY, lambda: FILES)


def test_info_and_clear(cache, tmp_path):
    root = tmp_path / "cache"
    assert cache.info() == (0, 0, root)
    assert not root.exists()  # info does not create the folder
    keys = [f"{i:02x}" + "f" * 62 for i in range(3)]
    for k in keys:
        cache.put(k, FILES)
    cache.get_or_create(keys[0], lambda: FILES)  # leaves a lock file
    (root / "unrelated").mkdir()  # not the cache's: left alone
    (root / "zz").mkdir()
    (root / "zz" / "keep.txt").write_text("mine")
    entries, total, where = cache.info()
    per_entry = sum(len(v) for v in as_bytes(FILES).values())
    assert entries == 3 and where == root
    assert total > 3 * per_entry  # files plus their manifests
    assert cache.remove(keys[2]) and not cache.remove(keys[2])
    assert cache.info().entries == 2
    assert cache.clear() == 2
    assert cache.info() == (0, 0, root)
    assert all(cache.get(k) is None for k in keys)
    assert sorted(p.name for p in root.iterdir()) == ["CACHEDIR.TAG", "unrelated", "zz"]
    assert (root / "zz" / "keep.txt").exists()


def test_disable_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_DISABLE_CACHE", "1")
    cache = DiskCache.default()
    assert not cache.enabled and cache.root == tmp_path / "cache"
    builds = []

    def build():
        builds.append(1)
        return FILES

    assert cache.put(KEY, FILES) == cache.path(KEY)
    assert cache.get(KEY) is None and not cache.contains(KEY)
    assert cache.get_or_create(KEY, build) == as_bytes(FILES)
    assert cache.get_or_create(KEY, build) == as_bytes(FILES)
    assert builds == [1, 1]
    assert not (tmp_path / "cache").exists()  # nothing written

    monkeypatch.setenv("FLYDSL_DISABLE_CACHE", "0")
    assert DiskCache.default().enabled


WORKER = """
import sys, time
from pathlib import Path
from flydsl_core.cache import DiskCache

root, key, counter, sync = sys.argv[1:5]
me = sys.argv[5]
Path(sync, me).write_text("ready")
deadline = time.time() + 30
while not Path(sync, "go").exists():
    if time.time() > deadline:
        sys.exit("no go signal")
    time.sleep(0.005)

def build():
    with open(counter, "a") as f:
        f.write(me + "\\n")
    time.sleep(0.5)  # a slow compile: the others arrive while it runs
    return {"kernel.hsaco": b"code object", "kernel.json": "{}"}

files = DiskCache(root).get_or_create(key, build)
print(files["kernel.hsaco"].decode(), sorted(files))
"""


def test_two_processes_build_once(tmp_path):
    root, counter, sync = tmp_path / "cache", tmp_path / "builds.txt", tmp_path / "sync"
    sync.mkdir()
    n = 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), KEY, str(counter), str(sync), f"w{i}"],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        deadline = time.time() + 60
        while len(list(sync.iterdir())) < n:
            assert time.time() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        (sync / "go").write_text("go")
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "code object ['kernel.hsaco', 'kernel.json']"
    assert len(counter.read_text().split()) == 1  # built once, reused by the others
    assert DiskCache(root).get(KEY) == {"kernel.hsaco": b"code object", "kernel.json": b"{}"}


def _read_only(monkeypatch):
    """Make removals fail as on a read-only cache (as root, chmod would not stop them)."""
    from flydsl_core.cache import disk

    def refuse(*a, **k):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(disk.os, "replace", refuse)
    monkeypatch.setattr(disk.os, "unlink", refuse)
    monkeypatch.setattr(disk.shutil, "rmtree", refuse)
    monkeypatch.setattr(disk.Path, "unlink", refuse)


def test_a_corrupt_entry_that_cannot_be_removed_says_so(cache, monkeypatch):
    entry = cache.put(KEY, FILES)
    corrupt_truncate(entry)
    _read_only(monkeypatch)
    with pytest.warns(CacheCorruptionWarning, match="could not remove it .*kept in memory only"):
        assert cache.get(KEY) is None
    assert entry.exists()


def test_clear_and_remove_on_a_read_only_cache_raise(cache, monkeypatch):
    cache.put(KEY, FILES)
    cache.put("cd" + KEY[2:], FILES)
    _read_only(monkeypatch)
    with pytest.raises(CacheError, match=r"could not remove 2 of 2 entries .*removed 0"):
        cache.clear()
    with pytest.raises(CacheError, match="could not remove cache entry"):
        cache.remove(KEY)


def test_cli_cache_clear_on_a_read_only_cache_fails(tmp_path, monkeypatch, capsys):
    from flydsl_core.cli import main

    DiskCache.default().put(KEY, FILES)
    _read_only(monkeypatch)
    assert main(["cache", "clear"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not remove 1 of 1 entries" in err
