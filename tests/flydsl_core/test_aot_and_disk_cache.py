"""GPU code from the disk cache and from AOT bundles, with no JIT compile (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core.aot import load_bundle, write_bundle
from flydsl_core.cache import DiskCache
from flydsl_core.examples import matmul
from flydsl_core.exc import FlyDSLError
from flydsl_core.runtime import store
from flydsl_core.runtime.kernel import Kernel

pytest.importorskip("triton")
pytestmark = pytest.mark.compile


def _args():
    a, b = matmul.make_inputs((128, 64, 128), torch.bfloat16)
    return (a, b, torch.empty(128, 128, dtype=torch.bfloat16)), {"BM": 64, "BN": 64, "BK": 32}


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "PRELOADED", {})
    monkeypatch.setattr(store, "on_compile", [])
    return tmp_path


def _forbid_compiles():
    def fail(kernel, target):
        raise AssertionError(f"{kernel} was compiled for {target}")

    store.on_compile.append(fail)


def test_a_second_process_view_loads_from_disk_without_compiling(fresh_cache):
    args, kw = _args()
    cold = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    assert DiskCache.default().contains(cold.key)

    _forbid_compiles()
    warm = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    assert warm.key == cold.key
    assert warm.stages()["amdgcn"] == cold.stages()["amdgcn"]
    assert warm.report.vgpr == cold.report.vgpr and warm.report.matrix_ops == cold.report.matrix_ops


def test_the_key_changes_with_options_target_and_source(fresh_cache):
    args, kw = _args()
    k = Kernel(matmul.KERNEL.fn)
    base = k.compile(*args, target="gfx950", **kw).key
    assert k.compile(*args, target="gfx950", options={"num_warps": 8}, **kw).key != base
    assert k.compile(*args, target="gfx942", **kw).key != base
    assert k.compile(*args, target="gfx950", **{**kw, "BK": 64}).key != base

    def edited(
        a: fly.Tensor,
        b: fly.Tensor,
        c: fly.Tensor,
        BM: fly.constexpr,
        BN: fly.constexpr,
        BK: fly.constexpr,
    ):
        matmul.KERNEL.fn(a, b, c, BM, BN, BK)
        c.tile((BM, BN), (0, 0)).store(fly.zeros((BM, BN), fly.bf16))

    assert Kernel(edited, name="matmul").compile(*args, target="gfx950", **kw).key != base


def test_a_corrupt_entry_is_recompiled_with_a_warning(fresh_cache):
    args, kw = _args()
    ck = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    entry = DiskCache.default().path(ck.key)
    hsaco = next(p for p in entry.iterdir() if p.name.endswith(".hsaco"))
    hsaco.write_bytes(hsaco.read_bytes()[:10])
    with pytest.warns(Warning):
        again = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    assert again.stages()["hsaco"] == ck.stages()["hsaco"]


def test_an_aot_bundle_serves_kernels_with_no_compile(fresh_cache, monkeypatch):
    args, kw = _args()
    ck = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    bundle = write_bundle([ck], fresh_cache / "bundle")
    # A new machine: an empty cache and no compiler allowed.
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(fresh_cache / "other-cache"))
    _forbid_compiles()
    assert load_bundle(bundle) == 1
    served = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    assert served.stages()["hsaco"] == ck.stages()["hsaco"]
    import json

    manifest = json.loads((bundle / "manifest.json").read_text())
    (entry,) = manifest["kernels"]
    assert entry["key"] == ck.key and entry["target"] == "gfx950"
    assert entry["resources"]["vgpr"] == ck.report.vgpr and entry["launch"]["num_warps"] == 4


def test_a_tampered_bundle_is_rejected(fresh_cache):
    args, kw = _args()
    ck = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    bundle = write_bundle([ck], fresh_cache / "bundle")
    victim = next(p for p in (bundle / ck.key).iterdir() if p.name.endswith(".hsaco"))
    victim.write_bytes(b"garbage")
    with pytest.raises(FlyDSLError, match="corrupt"):
        load_bundle(bundle)


def test_an_entry_that_verifies_but_does_not_load_is_rebuilt_quietly(
    fresh_cache, caplog, monkeypatch
):
    """Triton metadata broken inside an entry whose checksums match: the load fails, the
    log says what was done, and Triton's CompiledKernel.__del__ prints nothing."""
    import gc
    import sys

    args, kw = _args()
    ck = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    cache = DiskCache.default()
    files = cache.get(ck.key)
    cache.remove(ck.key)
    cache.put(ck.key, {k: b"{no json" if k.endswith(".json") and k.startswith("triton-") else v
                       for k, v in files.items()})  # fmt: skip
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    again = Kernel(matmul.KERNEL.fn).compile(*args, target="gfx950", **kw)
    gc.collect()
    assert unraisable == []
    assert "did not load" in caplog.text and "removed it; compiling again" in caplog.text
    assert again.executable.stages()["hsaco"] == ck.executable.stages()["hsaco"]
    assert cache.get(ck.key) is not None  # the rebuilt kernel was stored again
