"""The ``sdpa`` override on the CPU test backend: ``F.scaled_dot_product_attention`` reaches
FlyDSL's FMHA through ``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward,
falls back to ATen with counted reasons, and mixes with ATen's halves (our forward, ATen's
backward). bf16, tolerance 2e-2 of the largest reference value."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_flydsl

FWD = "_scaled_dot_product_flash_attention_for_cpu"
BWD = "_scaled_dot_product_flash_attention_for_cpu_backward"


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max()).item()


def qkv(b, h, sq, sk, d, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    mk = lambda s: torch.randn(b, h, s, d, generator=g).to(dtype).requires_grad_()  # noqa: E731
    return mk(sq), mk(sk), mk(sk)


@pytest.fixture
def sdpa_on(cpu_backend):
    cpu_backend.enable(ops=["sdpa"], device="cpu")
    cpu_backend.reset_stats()
    return cpu_backend


def aten(q, k, v, do, **kw):
    with torch_flydsl.disabled():
        o = F.scaled_dot_product_attention(q, k, v, **kw)
        return o, torch.autograd.grad(o, (q, k, v), do)


@pytest.mark.parametrize(
    "shape,causal", [((2, 3, 37, 37, 32), True), ((1, 2, 1, 45, 64), False),
                     ((2, 2, 29, 17, 16), False)],
)  # fmt: skip
def test_sdpa_forward_and_backward_match_aten(sdpa_on, shape, causal):
    b, h, sq, sk, d = shape
    q, k, v = qkv(b, h, sq, sk, d, seed=sq)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    st = sdpa_on.stats()
    assert st[FWD] == {"calls": 1, "hits": 1, "fallbacks": {}}
    assert st[BWD] == {"calls": 1, "hits": 1, "fallbacks": {}}
    ref, rgrads = aten(q, k, v, do, is_causal=causal)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_err(out, ref) <= 2e-2
    for a, r in zip(grads, rgrads):
        assert rel_err(a, r) <= 2e-2


def test_sdpa_gqa(sdpa_on):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 21, 32, generator=g).bfloat16().requires_grad_()
    k, v = (torch.randn(1, 2, 21, 32, generator=g).bfloat16().requires_grad_() for _ in range(2))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert sdpa_on.stats()[FWD]["hits"] == 1 and sdpa_on.stats()[BWD]["hits"] == 1
    ref, rgrads = aten(q, k, v, do, is_causal=True, enable_gqa=True)
    assert rel_err(out, ref) <= 2e-2
    for a, r in zip(grads, rgrads):
        assert a.shape == r.shape and rel_err(a, r) <= 2e-2


def test_our_forward_with_atens_backward(sdpa_on):
    q, k, v = qkv(1, 2, 33, 33, 32, seed=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # ours: LSE in ATen's layout
    do = torch.randn_like(out)
    sdpa_on.disable(ops=["sdpa"])
    grads = torch.autograd.grad(out, (q, k, v), do)  # ATen's backward reads our out and LSE
    _, rgrads = aten(q, k, v, do, is_causal=True)
    for a, r in zip(grads, rgrads):
        assert rel_err(a, r) <= 2e-2


@pytest.mark.parametrize(
    "make,kw,reason",
    [
        (lambda: qkv(1, 2, 9, 9, 16, 2, torch.float32), {}, "dtype"),
        (lambda: qkv(1, 2, 9, 9, 16, 2), {"dropout_p": 0.5}, "params"),
        (lambda: qkv(1, 2, 9, 13, 16, 2), {"is_causal": True}, "params"),
        (lambda: qkv(1, 2, 9, 9, 16, 2), {"attn_mask": torch.zeros(9, 9, dtype=torch.bfloat16)},
         "params"),
    ],
    ids=["fp32", "dropout", "causal_sq_ne_sk", "attn_mask"],
)  # fmt: skip
def test_sdpa_fallback_reasons(sdpa_on, make, kw, reason):
    # the ATen op itself: SDPA's CPU backend choice may not send these cases to it at all
    op = getattr(torch.ops.aten, FWD).default
    q, k, v = (t.detach() for t in make())
    if "dropout_p" in kw:  # ATen's CPU kernel refuses dropout: its own error, after ours declined
        with pytest.raises(RuntimeError, match="dropout"):
            op(q, k, v, **kw)
    else:
        out, lse = op(q, k, v, **kw)
    st = sdpa_on.stats()[FWD]
    assert st["hits"] == 0 and st["fallbacks"] == {reason: 1}
    if "dropout_p" not in kw:
        with torch_flydsl.disabled():
            want, wlse = op(q, k, v, **kw)
        assert torch.equal(out, want) and torch.equal(lse, wlse)


def test_sdpa_is_opt_in(cpu_backend):
    assert "sdpa" not in cpu_backend.status()["enabled"]  # enable() alone leaves SDPA to ATen
    cpu_backend.enable(ops=["sdpa"], device="cpu")
    assert "sdpa" in cpu_backend.status()["enabled"]
    cpu_backend.disable(ops=["sdpa"])
    assert "sdpa" not in cpu_backend.status()["enabled"]


@pytest.mark.skipif(
    not hasattr(torch.nn.attention, "register_flash_attention_impl"),
    reason="this torch has no flash-attention provider registry",
)
def test_flash_attention_provider_is_registered_not_activated():
    from torch.nn.attention import current_flash_attention_impl, list_flash_attention_impls

    assert "flydsl" in list_flash_attention_impls()
    assert current_flash_attention_impl() != "flydsl"


@pytest.mark.parametrize("scale", [0.0, -0.5, -1e-3])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_scale_zero_or_negative_matches_aten(sdpa_on, scale, causal):
    """A scale of zero (uniform attention) or below (inverted) is legal: SDPA's answer, not NaN
    (the forward kernel folds only a positive scale into its exp2)."""
    q, k, v = qkv(1, 2, 23 if causal else 19, 23, 32, seed=7)  # SDPA causal is top-left
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    st = sdpa_on.stats()
    assert st[FWD]["hits"] == 1 and st[BWD]["hits"] == 1
    # SDPA's math backend in fp32 (ATen's own CPU flash kernel is NaN at causal scale 0)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref, rgrads = aten(q32, k32, v32, do.float(), is_causal=causal, scale=scale)
    assert not out.isnan().any()
    assert rel_err(out, ref) <= 2e-2
    for a, r in zip(grads, rgrads):  # dq and dk are exactly zero at scale 0
        assert (a.float() - r.float()).abs().max() <= 2e-2 * max(r.float().abs().max(), 1e-3)


def _bhsd(b, h, s, d, seed, layout):
    """``(b, h, s, d)`` bf16 in ``layout``: ``contiguous``, or ``bshd`` (the transpose of a
    ``(b, s, h, d)`` tensor: what a transformers attention module passes SDPA)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "bshd":
        return torch.randn(b, s, h, d, generator=g).bfloat16().transpose(1, 2)
    return torch.randn(b, h, s, d, generator=g).bfloat16()


@pytest.mark.parametrize("layout", ["contiguous", "bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_gradients_have_atens_strides(sdpa_on, layout, causal):
    """Our CPU backward returns dq / dk / dv laid out as ATen's (its meta kernel: the
    ``(B, S, H, D)`` order, whatever the inputs' layout), so Inductor's stride checks of a
    compiled graph hold and a consumer sees what ATen would give; values as ATen's."""
    fwd, bwd = getattr(torch.ops.aten, FWD).default, getattr(torch.ops.aten, BWD).default
    q, k, v = (_bhsd(2, 3, 19, 16, seed, layout) for seed in (1, 2, 3))
    with torch_flydsl.disabled():
        out, lse = fwd(q, k, v, is_causal=causal)
    do = _bhsd(2, 3, 19, 16, 4, layout)
    ours = bwd(do, q, k, v, out, lse, 0.0, causal)
    assert sdpa_on.stats()[BWD]["hits"] == 1
    with torch_flydsl.disabled():
        want = bwd(do, q, k, v, out, lse, 0.0, causal)
    meta = bwd(*(t.to("meta") for t in (do, q, k, v, out, lse)), 0.0, causal)
    for a, r, m in zip(ours, want, meta):
        assert a.shape == r.shape and a.dtype == r.dtype
        assert a.stride() == r.stride() == m.stride()
        assert rel_err(a, r) <= 2e-2


def test_compiled_training_step_with_the_override(sdpa_on):
    """A training step under torch.compile: Inductor checks the strides of the SDPA backward's
    outputs against ATen's meta kernel (``assert_size_stride``), so ours must match them. The
    step's gradients agree with the same step on ATen."""
    import torch._dynamo

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96, bias=False)
            self.out = torch.nn.Linear(32, 32, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 2, 16).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, d), BSHD strides
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(o.transpose(1, 2).reshape(b, s, 32))

    torch.manual_seed(0)
    model = Attn().bfloat16()
    x = torch.randn(2, 11, 32).bfloat16()

    def step(fn):
        model.zero_grad(set_to_none=True)
        fn(x).float().square().mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    try:
        ours = step(torch.compile(model, backend="inductor"))
    finally:
        torch._dynamo.reset()
    st = sdpa_on.stats()
    assert st[FWD]["hits"] == 1 and st[BWD]["hits"] == 1
    with torch_flydsl.disabled():
        want = step(model)
    for a, r in zip(ours, want):
        assert rel_err(a, r) <= 2e-2
