"""The Triton backend on the CPU: generated source run by Triton's interpreter (``cpu-interpret``).

Every example runs on fp32/bf16/fp16 (shapes with non-powers of two and one
row) and is compared with the reference backend (the language's definition)
and with PyTorch; then what only this target does: its source (the
interpreter legalization) and its sandboxing of Triton. The op families run
on both CPU backends in the language suites (test_language_*.py, through
the ``target`` fixture).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from tests.flydsl_core.conftest import INTERPRET, REF, gen, same

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import flydsl_core as fly
from flydsl_core.backends import get_backend
from flydsl_core.examples import cumsum, matmul, softmax, vector_add

pytest.importorskip("triton")

pytestmark = pytest.mark.cpu

T = INTERPRET
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- the examples ----------------------------------------------------------------------------

EXAMPLE_CASES = [
    (vector_add, (5003,)),
    (vector_add, (1,)),
    (vector_add, (2048,)),
    (softmax, (37, 1000)),
    (softmax, (1, 7)),
    (softmax, (5, 64)),
    (matmul, (70, 96, 50)),
    (matmul, (1, 33, 17)),
    (matmul, (64, 64, 64)),
    (cumsum, (13, 3001)),
    (cumsum, (1, 5)),
    (cumsum, (3, 1024)),
]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    "mod, shape",
    EXAMPLE_CASES,
    ids=[f"{m.__name__.split('.')[-1]}-{'x'.join(map(str, s))}" for m, s in EXAMPLE_CASES],
)
def test_examples_match_the_reference_and_torch(mod, shape, dtype):
    inputs = mod.make_inputs(shape, DTYPES[dtype], gen(0))
    got = mod.run(*inputs, target=T)
    ref = mod.run(*inputs, target=REF)
    want = mod.reference(*inputs)
    rtol, atol = mod.TOLERANCE[dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol)
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)
    if mod is vector_add:
        assert same(got, ref)  # one rounding per element: exact on every backend


def test_bf16_matmul_source_upcasts_and_matches_the_reference():
    # Triton 3.9's interpreter gets bf16 tl.dot wrong (errors around 1e10 on 32x32 tiles);
    # the cpu-interpret lowering upcasts the operands, which is exact for the products.
    a, b = matmul.make_inputs((70, 96, 50), torch.bfloat16, gen(1))
    c = torch.empty(70, 50, dtype=torch.bfloat16)
    src = get_backend(T).generate(matmul.KERNEL.ir(a, b, c, BM=32, BN=32, BK=32)).source
    dots = re.findall(r"tl\.dot\((v\d+), (v\d+)", src)
    assert dots and all(re.search(rf"\n\s*{x} = v\d+\.to\(tl\.float32\)", src) for x in dots[0])
    got = matmul.run(a, b, target=T)
    ref = matmul.run(a, b, target=REF)
    torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=1e-2)
    assert (got.float() - ref.float()).abs().max() <= 0.125  # at most a bf16 rounding flip
    # one 32x32x32 tile: a single fp32 accumulation, so exactly the rounded fp32 product
    a, b = a[:32, :32].contiguous(), b[:32, :32].contiguous()
    assert torch.equal(matmul.run(a, b, target=T), (a.float() @ b.float()).to(torch.bfloat16))


def test_the_interpreter_does_not_leak_into_the_process():
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    before = (tl.sum, tl.reduce, tl.core.reduce, tl.range, tl.tensor.__add__)
    x = torch.randn(3, 40)
    softmax.run(x, target=T)
    assert (tl.sum, tl.reduce, tl.core.reduce, tl.range, tl.tensor.__add__) == before
    assert isinstance(tl.sum, JITFunction) and isinstance(tl.standard.sort_impl, JITFunction)
    assert tl.core.is_builtin(tl.reduce)


@fly.kernel
def _wrap_add(x, out, B: fly.constexpr):
    v = x.tile((B,), 0).load()
    out.tile((B,), 0).store(v * 3 + 2147483000)


def test_int32_arithmetic_wraps_without_the_overflow_sanitizer():
    # FlyDSL integers wrap (C semantics); the interpreter's int64 overflow check is switched
    # off inside interpret_scope (it only cost time) and restored after it
    from triton.runtime import interpreter

    from flydsl_core.backends.triton.launcher import interpret_scope

    with interpret_scope():
        assert interpreter.interpreter_builder.options.sanitize_overflow is False
    assert interpreter.interpreter_builder.options.sanitize_overflow is True
    x = torch.tensor([1000, 2**30, -5, 7], dtype=torch.int32)
    out = torch.empty_like(x)
    _wrap_add[(1,)](x, out, B=4, target=T)
    want = ((x.long() * 3 + 2147483000 + 2**31) % 2**32 - 2**31).int()
    assert torch.equal(out, want)


def test_stages_of_an_interpreted_kernel():
    x = torch.randn(4, 50)
    ck = softmax.KERNEL.compile(x, torch.empty_like(x), BLOCK=64, target=T)
    assert set(ck.executable.stages()) == {"triton"}
    assert os.path.exists(ck.executable.source_path)
