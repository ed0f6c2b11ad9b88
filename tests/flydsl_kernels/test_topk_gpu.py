"""TopK family on a real GPU (skipped without one): the report cases and torch.topk parity."""

from __future__ import annotations

import pytest
import torch

from flydsl_kernels.topk import FAMILY, topk

pytestmark = pytest.mark.gpu


def test_report_cases_on_gpu():
    for case in FAMILY.cases():
        assert case.check("cuda") <= 1.0, (case.kernel, case.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mnk", [(4096, 4096, 8), (300, 1000, 300), (8, 262144, 1024)])
def test_topk_matches_torch_on_gpu(dtype, mnk):
    m, n, k = mnk
    g = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, n, generator=g).to(dtype).cuda()
    for det in (True, False):
        v, i = topk(x, k, deterministic=det)
        tv, _ = torch.topk(x, k)
        assert torch.equal(v, tv) and torch.equal(x.gather(-1, i), v)
        if det:
            ri = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
            assert torch.equal(i, ri)
