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
}


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
    }
    got = outcome(readers[var])
    good = value.strip() == "" or value.strip().lower() in VARIABLES[var]
    event("accepted" if got.ok else "rejected")
    if got.ok:
        return
    assert not good, got.error
    assert isinstance(got.error, SettingsError) and var in str(got.error)
