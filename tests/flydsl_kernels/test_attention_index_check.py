"""The paged KV cache's device index check (``attention.index_check``): one kernel launch,
one flag per sequence, against a Python statement of the rules, on the reference backend and
Triton's interpreter; and ``validate.kvcache``'s device path (the CPU treated as a device)
runs it once and no other op before its one read-back."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flydsl_kernels.attention import flash_attn_with_kvcache, validate
from flydsl_kernels.attention.index_check import BLOCK, paged_index_check_kernel

pytestmark = pytest.mark.cpu

INT32_MAX = 2**31 - 1


def expected(lens, table, snew, cap, page, pool):
    out = []
    for b, n in enumerate(lens):
        need = min(-(-(n + snew) // page), len(table[b])) if n >= 0 else 0
        bad = n < 0 or n + snew > cap or any(not 0 <= x < pool for x in table[b][:need])
        out.append(int(bad))
    return out


def run(lens, table, snew, cap, page, pool, target):
    lens_t = torch.tensor(lens, dtype=torch.int32)
    bt = torch.tensor(table, dtype=torch.int32).reshape(len(lens), -1)
    bad = torch.full((len(lens),), 7, dtype=torch.int32)  # every flag is written
    paged_index_check_kernel[(len(lens),)](
        lens_t, bt, bad, bt.shape[1], cap - snew, snew, page, pool, BLOCK=BLOCK, target=target
    )
    return bad.tolist()


@pytest.mark.parametrize("target", ["cpu-reference", "cpu-interpret"])
@pytest.mark.parametrize(
    "cols, lens, snew, bad_at",
    [
        (1, [0, 15, 16], 1, None),  # one column; 16 + 1 keys need two pages: past the table
        (130, [2079, 0, 1], 0, (0, 129)),  # a bad id in the second loop trip
        (257, [4100, 17, 4112], 3, (2, 257 - 1)),  # not a multiple of the block
        (300, [-1, 5, INT32_MAX], 2, None),  # negative; int32's max + snew must not wrap
        (129, [2050, 2064, 0], 0, (1, 128)),  # the bad id is exactly the first unread column
    ],
)
def test_flags_against_the_rules(target, cols, lens, snew, bad_at):
    g = torch.Generator().manual_seed(cols)
    page, pool = 16, 50
    table = torch.randint(0, pool, (len(lens), cols), generator=g)
    for b, n in enumerate(lens):  # -1 padding past each sequence's pages, as servers leave it
        need = -(-(max(n, 0) + snew) // page)
        table[b, need:] = -1
    if bad_at is not None:
        table[bad_at] = pool
    table = table.tolist()
    cap = cols * page
    got = run(lens, table, snew, cap, page, pool, target)
    assert got == expected(lens, table, snew, cap, page, pool)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 4),
    cols=st.integers(1, 140),
    page=st.sampled_from([1, 16, 64]),
    snew=st.integers(0, 3),
)
def test_flags_property(data, batch, cols, page, snew):
    cap, pool = cols * page, 9
    lens = data.draw(st.lists(st.integers(-2, cap + 2), min_size=batch, max_size=batch))
    ids = st.one_of(st.integers(0, pool - 1), st.sampled_from([-1, pool, -(2**31)]))
    table = [data.draw(st.lists(ids, min_size=cols, max_size=cols)) for _ in range(batch)]
    got = run(lens, table, snew, cap, page, pool, "cpu-reference")
    assert got == expected(lens, table, snew, cap, page, pool)


def test_device_path_is_one_launch_then_one_read_back(monkeypatch):
    launches = []

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return paged_index_check_kernel[grid]

    monkeypatch.setattr(validate, "HOST_VALUES", False)  # CPU tensors take the device path
    monkeypatch.setattr(validate, "paged_index_check_kernel", Counting())
    lens = torch.tensor([20, 5], dtype=torch.int32)
    table = torch.tensor([[0, 3, -1], [1, -1, -1]], dtype=torch.int32)
    validate.kvcache(lens, 1, 48, "f", block_table=table, page=16, pool=4)
    assert launches == [(2,)]
    table[0, 1] = 4  # past the pool: the host re-check names it
    with pytest.raises(IndexError, match=r"block_table\[0, 1\] = 4 is not a page"):
        validate.kvcache(lens, 1, 48, "f", block_table=table, page=16, pool=4)
    assert len(launches) == 2


def test_the_check_runs_on_the_calls_target_not_the_machines_default(monkeypatch):
    """On a machine whose default target is a GPU's (here ``$FLYDSL_TARGET=sm90``), a call on
    CPU tensors with ``target="cpu-reference"`` checks its indices on that target too: the
    first H200 run of ``tools/bench_host.py`` launched the check for the GPU with CPU tensors."""
    monkeypatch.setenv("FLYDSL_TARGET", "sm90")
    monkeypatch.setattr(validate, "HOST_VALUES", False)  # CPU tensors take the device path
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 1, 4, 16, generator=g)
    kc, vc = torch.randn(5, 16, 2, 16, generator=g), torch.randn(5, 16, 2, 16, generator=g)
    table = torch.tensor([[0, 3, -1], [1, 4, 2]], dtype=torch.int32)
    lens = torch.tensor([20, 37], dtype=torch.int32)
    got = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table,
                                  target="cpu-reference")  # fmt: skip
    # with no target, CPU tensors take the CPU's (tensor_target), the check too
    torch.testing.assert_close(
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table), got
    )
    for b in range(2):
        n = int(lens[b])
        pages = [int(p) for p in table[b, : -(-n // 16)]]
        k = torch.cat([kc[p] for p in pages])[:n].repeat_interleave(2, 1)
        v = torch.cat([vc[p] for p in pages])[:n].repeat_interleave(2, 1)
        want = torch.nn.functional.scaled_dot_product_attention(
            q[b].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        ).transpose(0, 1)
        torch.testing.assert_close(got[b], want, rtol=1e-5, atol=1e-5)
    table[1, 1] = 5  # past the pool: still the host's exact message
    with pytest.raises(IndexError, match=r"block_table\[1, 1\] = 5 is not a page"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table,
                                target="cpu-reference")  # fmt: skip
