"""Helpers of the robustness suite: random misuse of every public API, two outcomes allowed.

Each property draws bad and awkward arguments with hypothesis and asserts one of
two outcomes: the result equals PyTorch's, or the error is the documented type
and its message names the argument. Examples are few (``ROBUST``) and shapes
small and drawn from short lists, so the kernels compile a handful of times:
the suite is about arguments, the kernel suites are about numerics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

#: the suite's hypothesis settings: a modest number of examples, no deadline (first calls compile)
ROBUST = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def outcome(fn, *args, **kwargs) -> Outcome:
    try:
        return Outcome(value=fn(*args, **kwargs))
    except Exception as e:  # the property decides whether this error is the right one
        return Outcome(error=e)


def same_error(ours: Outcome, theirs: Outcome) -> None:
    """Ours raised the same type as PyTorch, with the same message."""
    assert ours.error is not None, f"PyTorch raised {theirs.error!r}; we returned a result"
    assert type(ours.error) is type(theirs.error), (ours.error, theirs.error)
    assert str(ours.error) == str(theirs.error)


@pytest.fixture
def torch_cpu_overrides(monkeypatch, tmp_path):
    """torch_flydsl enabled on the CPU key (reference backend); off afterwards."""
    import torch_flydsl

    # an empty local table: the shipped rules only, whatever the user's cache holds
    from torch_flydsl import gates

    gates.write_table(tmp_path / "no_local_rules.json", [])
    monkeypatch.setenv("FLYDSL_TORCH_GATES", str(tmp_path / "no_local_rules.json"))
    monkeypatch.delenv("FLYDSL_TORCH_PRECEDENCE", raising=False)
    torch_flydsl.disable()
    torch_flydsl.enable(device="cpu")
    torch_flydsl.enable(ops=["rms_norm"], device="cpu")  # opt-in on the CPU key
    torch.manual_seed(0)
    yield torch_flydsl
    torch_flydsl.disable()
