"""``fly.histogram``: the flydsl-core extension the radix select is built on.

Counts of each value in [0, num_bins) of a 1-D int32 tile; masked-off
elements and out-of-range values are not counted. Checked on the reference
backend and the Triton interpreter against torch.bincount, and lowered for
gfx950 (tl.histogram).
"""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core.exc import TypeCheckError


@fly.kernel
def _hist(x, out, n, lo, B: fly.constexpr, NB: fly.constexpr, MASKED: fly.constexpr):
    r = fly.program_id(0)
    lane = fly.arange(0, B)
    v = x[r].tile((B,), 0).load()
    if MASKED:
        h = fly.histogram(v, NB, mask=(lane < n) & (v >= lo))
    else:
        h = fly.histogram(v, NB)
    out[r].tile((NB,), 0).store(h)


def _ref(x, n, lo, nb, masked):
    rows = []
    for row in x:
        r = row[:n] if masked else row
        keep = (r >= 0) & (r < nb) & ((r >= lo) if masked else True)
        rows.append(torch.bincount(r[keep].long(), minlength=nb)[:nb])
    return torch.stack(rows).int()


@pytest.mark.cpu
@pytest.mark.parametrize("target", ["cpu-reference", "cpu-interpret"])
def test_histogram_matches_bincount(target):
    g = torch.Generator().manual_seed(7)
    x = torch.randint(-5, 70, (3, 256), generator=g, dtype=torch.int32)  # some out of range
    for nb, masked in [(64, True), (64, False), (256, False), (8, True)]:
        out = torch.full((3, nb), -1, dtype=torch.int32)
        _hist[(3,)](x, out, 201, 3, B=256, NB=nb, MASKED=masked, target=target)
        assert torch.equal(out, _ref(x, 201, 3, nb, masked)), (nb, masked)


@pytest.mark.cpu
def test_histogram_type_errors():
    @fly.kernel
    def bad(x, out, B: fly.constexpr):
        out.tile((B,), 0).store(fly.histogram(x.tile((B,), 0).load(), 16))

    with pytest.raises(TypeCheckError, match="int32"):
        bad[(1,)](torch.zeros(16), torch.zeros(16, dtype=torch.int32), B=16)


@pytest.mark.compile
def test_histogram_lowers_for_gfx950():
    x = torch.zeros(3, 1024, dtype=torch.int32)
    out = torch.zeros(3, 256, dtype=torch.int32)
    ck = _hist.compile(x, out, 1000, 0, B=1024, NB=256, MASKED=True, target="gfx950")
    assert "tl.histogram(" in ck.executable.generated.source
    r = ck.executable.report
    assert r.scratch_bytes == 0 and not r.sgpr_spill_count and not r.vgpr_spill_count
