"""torch-flydsl under random misuse: the overridden ops answer exactly as ATen does.

With the overrides on (CPU key, reference backend) every call either returns
ATen's result or raises ATen's exception, type and message; and a bad
``FLYDSL_TORCH*`` value is a ``SettingsError`` naming the variable.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import event, given
from hypothesis import strategies as st

from flydsl_core.exc import SettingsError

from .conftest import ROBUST, outcome, same_error

pytestmark = pytest.mark.cpu

SHAPES = [(), (0,), (4,), (3, 5), (2, 0, 3)]


def _compare(fn):
    import torch_flydsl

    ours = outcome(fn)
    with torch_flydsl.disabled():
        theirs = outcome(fn)
    event("ATen raised" if not theirs.ok else "ATen answered")
    if not theirs.ok:
        same_error(ours, theirs)
        return None
    assert ours.ok, ours.error
    return ours.value, theirs.value


@ROBUST
@given(
    shape=st.sampled_from(SHAPES),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int32]),
    k=st.one_of(st.integers(0, 3), st.integers(-1, 6), st.sampled_from([2.0, True, None])),
    dim=st.one_of(st.integers(-1, 0), st.integers(-3, 2), st.just(1.0)),
    largest=st.one_of(st.booleans(), st.just(1)),
)
def test_topk_answers_as_aten(torch_cpu_overrides, shape, dtype, k, dim, largest):
    x = (torch.randn(shape) * 10).to(dtype)
    got = _compare(lambda: torch.topk(x, k, dim=dim, largest=largest))
    if got is not None:
        (v, i), (tv, _) = got
        assert torch.equal(v, tv) and v.dtype == tv.dtype
        if v.dim():
            assert torch.equal(x.gather(dim % x.dim(), i), v)


@ROBUST
@given(
    shape=st.sampled_from([(3, 5), (2, 3, 4), (4,)]),
    ns=st.sampled_from([(5,), (3, 4), (4,), (), (2,), (3, 5), (1, 5)]),
    weight=st.sampled_from(["match", "none", "wrong_shape", "wrong_dtype"]),
    eps=st.one_of(st.none(), st.floats(-1, 1), st.just(float("nan"))),
)
def test_rms_norm_answers_as_aten(torch_cpu_overrides, shape, ns, weight, eps):
    x = torch.randn(shape)
    w = {
        "match": torch.randn(ns) if ns else None,
        "none": None,
        "wrong_shape": torch.randn(7),
        "wrong_dtype": torch.randn(ns).double() if ns else None,
    }[weight]
    got = _compare(lambda: F.rms_norm(x, ns, w, eps))
    if got is not None:
        ours, theirs = got
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, equal_nan=True)


VARIABLES = {
    "FLYDSL_TORCH": ("1", "0", "true", "off"),
    "FLYDSL_TORCH_DEVICE": ("cpu", "cuda", "rocm"),
    "FLYDSL_TORCH_PRECEDENCE": ("ours", "upstream"),
    "FLYDSL_TORCH_CPU_TARGET": ("cpu-reference", "interpret", "CPU"),
    "FLYDSL_TORCH_ARCHS": ("gfx950", "mi355x,sm90", "GFX942", "gfx9999", "gfx950,cpu"),
}


def _gpu_targets(text: str) -> bool:
    """Whether ``text`` is a comma list of GPU targets or aliases (FLYDSL_TORCH_ARCHS)."""
    from flydsl_core.targets import lookup_target

    items = [i.strip() for i in text.split(",")]
    return all(i and (t := lookup_target(i)) is not None and t.is_gpu for i in items)


@ROBUST
@given(
    var=st.sampled_from(sorted(VARIABLES)),
    value=st.one_of(
        st.sampled_from([v for vs in VARIABLES.values() for v in vs]),
        st.text(st.characters(codec="ascii", exclude_characters="\x00"), max_size=6),
    ),
)
def test_bad_settings_name_the_variable(monkeypatch, var, value):
    import torch_flydsl
    from torch_flydsl import _runtime, eligibility

    monkeypatch.setenv(var, value)
    readers = {
        "FLYDSL_TORCH": lambda: __import__("flydsl_core.settings").settings.get(var),
        "FLYDSL_TORCH_DEVICE": lambda: _runtime.normalize_device(None),
        "FLYDSL_TORCH_PRECEDENCE": lambda: torch_flydsl._precedence_of(None),
        "FLYDSL_TORCH_CPU_TARGET": eligibility.cpu_target,
        "FLYDSL_TORCH_ARCHS": eligibility.allowed_archs,
    }
    got = outcome(readers[var])
    if var == "FLYDSL_TORCH_ARCHS":  # names or aliases of GPU targets, checked at use
        good = value.strip() == "" or _gpu_targets(value)
        assert got.ok == good, (value, got.error)
    else:
        good = value.strip() == "" or value.strip().lower() in VARIABLES[var]
    event("accepted" if got.ok else "rejected")
    if got.ok:
        return
    assert not good, got.error
    assert isinstance(got.error, SettingsError) and var in str(got.error)


def test_a_bad_arch_list_is_an_error_at_enable_and_in_the_pass(monkeypatch):
    import torch_flydsl
    from torch_flydsl.inductor.graph_pass import CompileContext
    from torch_flydsl.inductor.settings import Settings

    monkeypatch.setenv("FLYDSL_TORCH_ARCHS", "gfx950,gfx9999")
    for call in (
        lambda: torch_flydsl.enable(device="cpu"),
        lambda: torch_flydsl.status("cuda"),
        lambda: CompileContext(Settings.from_options({"device": "cpu"})),
    ):
        with pytest.raises(SettingsError, match=r"FLYDSL_TORCH_ARCHS=.*'gfx9999' is not a known"):
            call()
    torch_flydsl.disable()


def test_a_missing_gate_table_is_warned_about_naming_the_variable(monkeypatch, tmp_path):
    import warnings

    import torch_flydsl
    from torch_flydsl import gates

    missing = tmp_path / "calibrated" / "gates.json"
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(missing))
    monkeypatch.setattr(gates, "_WARNED", set())
    with pytest.warns(gates.GateTableWarning, match=r"FLYDSL_TORCH_GATES=.*no such file"):
        torch_flydsl.enable(device="cpu")
    torch_flydsl.disable()
    assert torch_flydsl.status("cpu")["gates"]["local_table"] is None  # the shipped table
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gates.load()  # once per path
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(tmp_path))  # a folder
    with pytest.warns(gates.GateTableWarning, match="a folder"):
        gates.load()


# -- torch.compile options: typed ------------------------------------------------------------------

FLAG_OPTIONS = ("epilogue", "swiglu", "autotune")
ANY_VALUE = st.one_of(
    st.booleans(),
    st.sampled_from(["false", "no", "off", "true", "0", "", "local", "open", "shipped"]),
    st.sampled_from(["gfx950", "mi355x", "GFX942", "h200", "gfx9999", "cpu", "interpret"]),
    st.sampled_from(["gemm", "mm", "grouped_mm", "rms_norm", "nope"]),
    st.integers(-2, 5),
    st.none(),
    st.lists(st.sampled_from(["gemm", "scaled_mm", "bogus", 3]), max_size=3),
    st.dictionaries(st.sampled_from(["max_autotune", "x"]), st.booleans(), max_size=1),
    st.text(max_size=5),
)


def _accepts(key, value) -> bool:
    """What each option takes (inductor/settings.py's table)."""
    from flydsl_core.targets import lookup_target
    from torch_flydsl.ops import NAMES, compile_specs

    every = {s.name for s in compile_specs()}
    if key in FLAG_OPTIONS:
        return isinstance(value, bool) or (key == "autotune" and value is None)
    if key == "arch":
        t = lookup_target(value) if isinstance(value, str) else None
        return value is None or (t is not None and t.is_gpu)
    if key == "ops":
        names = [value] if isinstance(value, str) else value
        if value is None:
            return True
        return isinstance(names, list) and all(
            isinstance(n, str) and NAMES.get(n) in every for n in names
        )
    if key == "gates":
        return value in ("local", "shipped", "open")  # no such file exists here
    if key == "kernels":
        return value in ("triton", "extern")
    if key == "device":
        return value is None or (isinstance(value, str) and value in ("cpu", "cuda", "rocm"))
    if key == "inductor":
        return value is None or isinstance(value, dict)
    return False


@ROBUST
@given(
    key=st.sampled_from([*FLAG_OPTIONS, "arch", "ops", "gates", "kernels", "device", "inductor",
                         "epilog", "gate"]),
    value=ANY_VALUE,
)  # fmt: skip
def test_compile_options_are_typed(monkeypatch, tmp_path, key, value):
    from torch_flydsl.inductor.settings import KNOWN, Settings

    monkeypatch.chdir(tmp_path)  # a relative 'gates' path names nothing here
    monkeypatch.delenv("FLYDSL_TORCH_DEVICE", raising=False)
    got = outcome(Settings.from_options, {key: value})
    ok = _accepts(key, value)
    event("accepted" if got.ok else type(got.error).__name__)
    assert got.ok == ok, (key, value, got.error)
    if ok:
        s = got.value
        if key in FLAG_OPTIONS and value is not None:
            assert getattr(s, key) is value  # a bool stays that bool
        if key == "arch" and value is not None:
            assert s.arch in ("gfx950", "gfx942", "gfx1250", "sm90")
        return
    assert isinstance(got.error, (TypeError, ValueError)), got.error
    msg = str(got.error)
    if key in KNOWN:
        assert f"options[{key!r}]" in msg, msg  # names the option...
    else:
        assert "unknown torch_flydsl option" in msg and all(k in msg for k in KNOWN)  # ...or them


@pytest.mark.parametrize("options", ["gemm", ["ops"], 5, ("ops", "gemm")])
def test_options_that_are_not_a_dict(options):
    from torch_flydsl.inductor.settings import Settings

    with pytest.raises(TypeError, match="options are a dict"):
        Settings.from_options(options)


def test_a_missing_gates_path_names_the_option_and_the_path(tmp_path):
    import torch_flydsl.inductor as fi

    with pytest.raises(ValueError, match=r"options\['gates'\] = 'bogus': no such file at .*bogus"):
        fi.install(options={"gates": "bogus"})
    assert not fi.installed()
    table = tmp_path / "t.json"
    from torch_flydsl import gates

    gates.write_table(table, [])
    try:
        assert fi.install(options={"gates": str(table)}).settings.gates == str(table)
    finally:
        fi.uninstall()


def test_torch_compile_reports_a_bad_option_by_name():
    import torch

    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend="flydsl", options={"epilogue": "false"})
    with pytest.raises(Exception, match=r"options\['epilogue'\] is 'false' \(str\); it takes True"):
        f(torch.randn(3))
    torch._dynamo.reset()


# -- FLYDSL_TARGET: one rule for every path --------------------------------------------------------


@ROBUST
@given(
    env=st.one_of(st.none(), st.sampled_from(["gfx950", "h200", "interpret", "cpu", "ref"])),
    cpu=st.one_of(st.none(), st.sampled_from(["cpu-reference", "interpreter"])),
)
def test_every_path_takes_the_same_cpu_target(monkeypatch, env, cpu):
    import torch_flydsl
    from flydsl_core.targets import get_target
    from torch_flydsl import dispatch, eligibility, gates
    from torch_flydsl.flex import run
    from torch_flydsl.library import hf
    from torch_flydsl.transformers import _checks

    for name, value in (("FLYDSL_TARGET", env), ("FLYDSL_TORCH_CPU_TARGET", cpu)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    if cpu is not None:
        want = get_target(cpu).name
    elif env is not None and not get_target(env).is_gpu:
        want = get_target(env).name
    else:
        want = "cpu-reference"
    x = torch.empty(2)
    assert dispatch.EagerContext("cpu", gates.GateTable()).target_of(x) == want
    assert eligibility.target(x) == run.kernel_target(x) == want
    # transformers' routes launch through the flydsl::hf_* ops, which take eligibility's rule
    assert _checks.device_reason(x) is None and hf.target is eligibility.target
    torch_flydsl.disable()
    assert torch_flydsl.status("cpu")["target"] == want


def test_unknown_flydsl_names_are_found(monkeypatch):
    from flydsl_core import settings

    settings.load_all()
    for name in list(settings.VARIABLES)[:6]:
        typo = name[:-2] + name[-1] + name[-2]  # two letters swapped
        if typo in settings.VARIABLES:
            continue
        monkeypatch.setenv(typo, "1")
        found = settings.unknown()
        assert typo in found and found[typo] in settings.VARIABLES
        monkeypatch.delenv(typo)
