"""Every shipped report case, on the GPU (marker ``gpu``) and on the CPU.

On the GPU each case runs through ``report.collect`` exactly as ``flydsl-kernels report
--device cuda`` does: compiled for the device's target with its own table, checked against
PyTorch at the case's shape with guard buffers after every output, one launch at the timed
size guarded too; the row must be clean (no compile error, no scratch / spill / LDS overflow,
no check error, no out-of-bounds write).

On the CPU the same cases check with the sm90 table (the GPU the project is lent) on the
reference backend at small shapes, so a tile of that table that computes a wrong answer fails
here first; cases whose CPU check takes minutes (a 262144-wide radix row, one program at a
time) are left to the family tests.
"""

from __future__ import annotations

import pytest

from flydsl_kernels import families, report

CASES = {report.case_key(c): c for fam in families().values() for c in fam.cases()}
#: CPU checks that run one huge row program by program on the reference backend
SLOW_ON_CPU = ("x262144",)


@pytest.mark.parametrize("key", list(CASES))
def test_case(device, key):
    if device == "cpu":
        if any(s in key for s in SLOW_ON_CPU):
            pytest.skip("minutes on the reference backend; the family tests cover the kernel")
        assert CASES[key].check("cpu", target="sm90") <= 1.0
        return
    from flydsl_core.targets import resolve_target

    rows = report.collect([key], target=resolve_target().name, device="cuda", time_gpu=True, reps=3)
    (row,) = [r for r in rows if r["key"] == key]  # a key may be a prefix of another's
    assert row["error"] is None and row["ok"], row["error"] or row["check_error"]
