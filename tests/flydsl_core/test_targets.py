"""Targets: the table, names and aliases, JSON, and how the process's target is resolved."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest

import flydsl_core.targets as targets_mod
from flydsl_core.exc import UnknownTargetError
from flydsl_core.targets import Target, get_target, known_targets, resolve_target

pytestmark = pytest.mark.cpu

KNOWN = ("gfx950", "gfx942", "gfx1250", "sm90", "cpu-reference", "cpu-interpret")
KiB = 1024


# -- the table ---------------------------------------------------------------


def test_known_targets_are_the_six():
    assert known_targets() == KNOWN
    for name in KNOWN:
        assert get_target(name).name == name


@pytest.mark.parametrize(
    "alias, name",
    [
        ("gfx950", "gfx950"),
        ("mi355x", "gfx950"),
        ("MI350X", "gfx950"),
        ("gfx950:sramecc+:xnack-", "gfx950"),
        ("mi300x", "gfx942"),
        ("gfx942:sramecc+:xnack-", "gfx942"),
        ("gfx1250", "gfx1250"),
        ("sm90", "sm90"),
        ("sm_90", "sm90"),
        ("sm_90a", "sm90"),
        ("SM90", "sm90"),
        ("hopper", "sm90"),
        ("h200", "sm90"),
        ("cpu", "cpu-reference"),
        ("cpu_reference", "cpu-reference"),
        ("  cpu-reference ", "cpu-reference"),
        ("interpret", "cpu-interpret"),
    ],
)
def test_names_and_aliases(alias, name):
    assert get_target(alias).name == name


def test_get_target_passes_a_target_through():
    t = get_target("gfx950")
    assert get_target(t) is t


def test_figures_from_the_reference_sheet():
    g950, g942, g1250, sm90 = (get_target(n) for n in ("gfx950", "gfx942", "gfx1250", "sm90"))
    assert (g950.backend, g950.arch, g950.warp_size) == ("hip", "gfx950", 64)
    assert (g942.backend, g942.arch, g942.warp_size) == ("hip", "gfx942", 64)
    assert (g1250.backend, g1250.arch, g1250.warp_size) == ("hip", "gfx1250", 32)
    assert (sm90.backend, sm90.arch, sm90.warp_size) == ("cuda", 90, 32)
    assert (g950.num_cus, g942.num_cus, sm90.num_cus) == (256, 304, 132)
    assert g950.num_xcds == g942.num_xcds == 8
    assert g950.lds_bytes_per_cu == 160 * KiB
    assert g942.lds_bytes_per_cu == 64 * KiB
    assert (sm90.lds_bytes_per_cu, sm90.lds_bytes_per_block) == (228 * KiB, 227 * KiB)
    for t in (g950, g942):
        r = t.registers
        assert r.vgprs_per_lane == 512 and r.max_waves_per_simd == 8 and r.simds_per_cu == 4
        assert r.vgpr_alloc_granule == 8 and r.sgprs_per_simd == 800
    assert (sm90.registers.regs_per_sm, sm90.registers.max_regs_per_thread) == (65536, 255)
    assert g950.peak.hbm_tb_s == 8.0 and g942.peak.hbm_tb_s == 5.3 and sm90.peak.hbm_tb_s == 4.8
    assert g950.peak.fp8_tflops == 5000.0 and g950.peak.fp4_tflops == 10000.0
    assert sm90.peak.bf16_tflops == 990.0 and sm90.peak.fp4_tflops is None


def test_matrix_instructions():
    g950 = get_target("gfx950").matrix_instructions
    for name in (
        "v_mfma_f32_32x32x16_bf16",
        "v_mfma_f32_16x16x32_bf16",
        "v_mfma_scale_f32_32x32x64_f8f6f4",
        "v_mfma_scale_f32_16x16x128_f8f6f4",
    ):
        assert name in g950
    assert "v_mfma_f32_32x32x8_bf16" in get_target("gfx942").matrix_instructions
    assert all(n.startswith("v_wmma_") for n in get_target("gfx1250").matrix_instructions)
    assert "wgmma.mma_async" in get_target("sm90").matrix_instructions


def test_flags():
    assert get_target("gfx950").supports_native_mx
    assert not get_target("gfx942").supports_native_mx
    assert not get_target("sm90").supports_native_mx
    assert all(get_target(n).is_gpu for n in ("gfx950", "gfx942", "gfx1250", "sm90"))
    assert not get_target("cpu-reference").is_gpu and not get_target("cpu-interpret").is_gpu


def test_gfx1250_placeholders_are_marked():
    t = get_target("gfx1250")
    assert "num_cus" in t.unverified
    assert t.num_cus is not None  # a placeholder figure, marked as such
    assert get_target("gfx950").unverified == ()


# -- value semantics ---------------------------------------------------------


@pytest.mark.parametrize("name", KNOWN)
def test_json_round_trip(name):
    t = get_target(name)
    text = t.to_json()
    json.loads(text)  # plain JSON
    back = Target.from_json(text)
    assert back == t
    assert hash(back) == hash(t)
    assert type(back.arch) is type(t.arch)
    assert back.to_json() == text


def test_hashable_and_frozen():
    t = get_target("gfx950")
    assert len({t, get_target("mi355x"), get_target("sm90")}) == 2
    assert {t: 1}[get_target("gfx950")] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.num_cus = 1  # type: ignore[misc]


def test_from_dict_rejects_unknown_fields():
    d = get_target("gfx950").to_dict()
    d["bogus"] = 1
    with pytest.raises(ValueError, match="bogus"):
        Target.from_dict(d)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownTargetError) as ei:
        get_target("gfx90a")
    msg = str(ei.value)
    assert "gfx90a" in msg
    for name in KNOWN:
        assert name in msg
    assert isinstance(ei.value, ValueError)


def test_triton_target():
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    assert get_target("gfx950").triton_target() == GPUTarget("hip", "gfx950", 64)
    assert get_target("gfx1250").triton_target() == GPUTarget("hip", "gfx1250", 32)
    assert get_target("sm90").triton_target() == GPUTarget("cuda", 90, 32)
    with pytest.raises(UnknownTargetError, match="CPU target"):
        get_target("cpu-reference").triton_target()


def test_import_pulls_in_neither_torch_nor_triton():
    code = (
        "import sys, flydsl_core.targets, flydsl_core.compile.resources\n"
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p])
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


# -- resolution ----------------------------------------------------------------


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("FLYDSL_TARGET", raising=False)
    return monkeypatch


def _device(monkeypatch, arch):
    calls = []

    def fake(index=None):
        calls.append(1)
        return arch

    monkeypatch.setattr(targets_mod, "_detect_device_arch", fake)
    return calls


def test_explicit_wins(no_env):
    no_env.setenv("FLYDSL_TARGET", "gfx942")
    calls = _device(no_env, "sm90")
    assert resolve_target("gfx950").name == "gfx950"
    assert resolve_target(get_target("sm90")).name == "sm90"
    assert calls == []  # the device is not even probed


def test_env_beats_device(no_env):
    no_env.setenv("FLYDSL_TARGET", "mi300x")
    calls = _device(no_env, "gfx950")
    assert resolve_target().name == "gfx942"
    assert calls == []


def test_empty_env_is_unset(no_env):
    no_env.setenv("FLYDSL_TARGET", "  ")
    _device(no_env, "gfx950")
    assert resolve_target().name == "gfx950"


def test_bad_env_names_the_variable(no_env):
    no_env.setenv("FLYDSL_TARGET", "gfx9000")
    _device(no_env, "gfx950")
    with pytest.raises(UnknownTargetError, match="FLYDSL_TARGET") as ei:
        resolve_target()
    assert "gfx950" in str(ei.value)  # the known list


@pytest.mark.parametrize(
    "arch, name", [("gfx950", "gfx950"), ("gfx942", "gfx942"), ("sm90", "sm90")]
)
def test_device(no_env, arch, name):
    _device(no_env, arch)
    assert resolve_target().name == name


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a", "sm100", "sm80"])
def test_unknown_device_is_an_error_not_another_arch(no_env, arch):
    _device(no_env, arch)
    with pytest.raises(UnknownTargetError) as ei:
        resolve_target()
    msg = str(ei.value)
    assert repr(arch) in msg
    for name in KNOWN:
        assert name in msg


def test_cpu_fallback(no_env):
    _device(no_env, None)
    assert resolve_target().name == "cpu-reference"


def test_a_cpu_name_from_the_probe_is_not_a_gpu(no_env):
    # The probe reports GPU archs only; 'cpu' coming from it must not resolve silently.
    _device(no_env, "cpu")
    with pytest.raises(UnknownTargetError):
        resolve_target()


# -- the device probe, with a fake torch ----------------------------------------


def _fake_torch(*, available=True, hip=None, gcn="", capability=(9, 0)):
    cuda = types.SimpleNamespace(
        is_available=lambda: available,
        current_device=lambda: 0,
        get_device_properties=lambda dev: types.SimpleNamespace(gcnArchName=gcn),
        get_device_capability=lambda dev: capability,
    )
    return types.SimpleNamespace(version=types.SimpleNamespace(hip=hip), cuda=cuda)


def test_probe_rocm_strips_features(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "torch", _fake_torch(hip="6.4.0", gcn="gfx950:sramecc+:xnack-")
    )
    assert targets_mod._detect_device_arch() == "gfx950"


def test_probe_cuda_capability(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(capability=(9, 0)))
    assert targets_mod._detect_device_arch() == "sm90"
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(capability=(10, 0)))
    assert targets_mod._detect_device_arch() == "sm100"


def test_probe_without_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=False))
    assert targets_mod._detect_device_arch() is None


def test_mi350_resolves_to_gfx950_not_gfx942(no_env):
    # The upstream failure: an MI350 (gfx950) silently treated as gfx942.
    no_env.setitem(sys.modules, "torch", _fake_torch(hip="6.4.0", gcn="gfx950:sramecc+:xnack-"))
    assert resolve_target().name == "gfx950"


def test_unknown_rocm_device_through_the_probe(no_env):
    no_env.setitem(sys.modules, "torch", _fake_torch(hip="6.4.0", gcn="gfx1201"))
    with pytest.raises(UnknownTargetError, match="gfx1201"):
        resolve_target()


def test_real_probe_on_this_machine(no_env):
    # Whatever torch finds here, resolution must give a known target or raise.
    arch = targets_mod._detect_device_arch()
    if arch is None:
        assert resolve_target().name == "cpu-reference"
    elif targets_mod.detected_arch_to_target_name(arch) is None:
        with pytest.raises(UnknownTargetError):
            resolve_target()
    else:
        assert resolve_target().is_gpu
