"""What the flydsl-core tests share: the CPU backends they run on, data and comparisons.

``target`` runs a test once per CPU backend: ``cpu-reference`` (the
language's definition, in PyTorch) and ``cpu-interpret`` (the generated
Triton under Triton's interpreter). A test that checks what only the
reference backend does (its run-time error reports, tiles that are no power
of two) passes ``target=REF`` instead.

The helpers are plain functions; test modules import them from here
(``from tests.flydsl_core.conftest import ...``: pytest's importlib mode
names this module after its path).
"""

from __future__ import annotations

import inspect

import pytest
import torch

REF = "cpu-reference"
INTERPRET = "cpu-interpret"
CPU_TARGETS = (REF, INTERPRET)
SENTINEL = -77


@pytest.fixture(params=CPU_TARGETS)
def target(request) -> str:
    """Each CPU backend in turn (the interpreter needs Triton)."""
    if request.param == INTERPRET:
        pytest.importorskip("triton")
    return request.param


def tiles_fit(target: str, *sizes: int) -> bool:
    """Whether ``target`` takes tiles of these sizes: Triton's need powers of two."""
    return target == REF or all(n >= 1 and n & (n - 1) == 0 for n in sizes)


def skip_unless_tiles_fit(target: str, *sizes: int) -> None:
    if not tiles_fit(target, *sizes):
        pytest.skip(f"{target} needs power-of-two tiles, not {sizes}")


# -- data ---------------------------------------------------------------------------------------


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, dtype=torch.float32, *, seed, scale=1.0):
    return (torch.randn(shape, generator=gen(seed)) * scale).to(dtype)


def randint(lo, hi, shape, dtype=torch.int32, *, seed):
    return torch.randint(lo, hi, shape, generator=gen(seed)).to(dtype)


def data(shape, dtype, *, seed):
    """Random values of any dtype the language stores (fp8 via its bytes)."""
    if dtype == torch.bool:
        return randint(0, 2, shape, torch.bool, seed=seed)
    if dtype.is_floating_point:
        if torch.empty((), dtype=dtype).element_size() == 1:
            return randint(0, 0x70, shape, torch.uint8, seed=seed).view(dtype)  # finite fp8 bytes
        return randn(shape, dtype, seed=seed, scale=10)
    info = torch.iinfo(dtype)
    return torch.randint(
        max(info.min, -(2**40)), min(info.max, 2**40), shape, generator=gen(seed)
    ).to(dtype)


def sentinel_like(shape, dtype):
    """A tensor of a value no kernel writes, to see which elements a kernel wrote."""
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    if torch.empty((), dtype=dtype).element_size() == 1 and dtype.is_floating_point:
        return torch.full(shape, 0x3C, dtype=torch.uint8).view(dtype)
    return torch.full(shape, SENTINEL, dtype=dtype)


# -- comparisons ---------------------------------------------------------------------------------


def assert_same(out, ref):
    """Equal values (NaN equal to NaN, -0.0 equal to 0.0), with dtype and shape."""
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if out.is_floating_point():
        if out.element_size() == 1:  # fp8 has no CPU comparison kernels
            out, ref = out.float(), ref.float()
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), (out, ref)
        out = torch.where(torch.isnan(out), 0, out)
        ref = torch.where(torch.isnan(ref), 0, ref)
    assert torch.equal(out, ref), (out, ref)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, for bit-exact comparison of any dtype (fp8, bool included)."""
    t = torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1)  # dense, whatever the strides
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def assert_bits(out, ref):
    """The same bytes, with dtype and shape."""
    assert out.dtype == ref.dtype and out.shape == ref.shape, (
        out.dtype,
        ref.dtype,
        out.shape,
        ref.shape,
    )
    assert torch.equal(bits(out), bits(ref)), (out, ref)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality, NaN equal to NaN (payloads may differ), -0.0 distinct from 0.0."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        na, nb = a.float().isnan(), b.float().isnan()
        if not torch.equal(na, nb):
            return False
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(ints)[~na], b.view(ints)[~nb])
    return torch.equal(a, b)


def assert_close(out, ref, *, rtol, atol):
    """``|out - ref| <= atol + rtol * |ref|`` elementwise, NaN matching NaN.

    (torch.testing.assert_close costs seconds on its first call; this does not.)
    """
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    o, r = out.double(), ref.double()
    ok = torch.isclose(o, r, rtol=rtol, atol=atol)
    assert bool(ok.all()), f"max abs error {(o - r)[~ok].abs().max().item()}:\n{out}\n{ref}"


# -- kernels ---------------------------------------------------------------------------------------


def line_of(kernel, text: str) -> int:
    """The file line of the (unique) source line of ``kernel`` containing ``text``."""
    lines, start = inspect.getsourcelines(kernel.fn)
    hits = [start + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, hits
    return hits[0]


def ops_of(kernel, *args, **kwargs) -> list[str]:
    """The names of the ops of ``kernel``'s IR for these arguments."""
    return [op.name for op in kernel.ir(*args, **kwargs).walk()]
