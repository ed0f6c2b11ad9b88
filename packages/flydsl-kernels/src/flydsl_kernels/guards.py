"""Guard buffers (canaries) around the tensors the function APIs allocate, to catch OOB writes.

    with GuardedAllocations() as g:
        y = rms_norm(x, (n,), w)[0]
    bad = g.violations()       # [] when no kernel wrote outside its outputs

Inside the context, every tensor that a ``flydsl_kernels`` module creates with a factory
function (``torch.empty``, ``zeros``, ``full``, their ``_like`` forms, ``Tensor.new_*``) is
carved out of a larger allocation: ``PRE`` bytes before it and a guard after it of between
4 KiB and 1 MiB (the tensor's own size, clamped), both filled with a fixed random byte
pattern. ``violations()`` synchronizes and compares every guard with its pattern; a changed
byte is an out-of-bounds write by whatever kernel wrote that tensor. The report
(``report.collect``) runs each case's check and one timed-size run under it, on the GPU as
on the CPU backends, and fails the case naming the tensor.

``guard(t)`` puts a caller's tensor (an input, or a cache a kernel updates in place, as
``flash_attn_with_kvcache`` appends to its KV cache) into a guarded copy the same way: a write
past it shows in ``violations()``, and a read past it picks up the pattern's bytes, so a
check against a reference fails.

Only allocations made by the kernel library's own code (the function APIs: their outputs
and workspaces) are guarded automatically: the reference backend's and PyTorch's internal temporaries are
not, so the check costs a copy per output, not one per program. Tensors that are not
contiguous (``empty_like`` of a strided tensor) are left as they are. The guarded view
starts ``PRE`` = 256 bytes into its buffer, so its data pointer keeps the 16-byte (and
256-byte) alignment of a fresh allocation and the kernels compile the same code for it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["GuardViolation", "GuardedAllocations"]

PRE = 256
POST_MIN, POST_MAX = 4096, 1 << 20

_FACTORIES = {
    torch.empty,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty_like,
    torch.zeros_like,
    torch.ones_like,
    torch.full_like,
    torch.Tensor.new_empty,
    torch.Tensor.new_zeros,
    torch.Tensor.new_ones,
    torch.Tensor.new_full,
}
#: modules whose allocations are not guarded (the reference implementations, this tooling)
_SKIP = (".reference", ".report", ".guards", ".registry", ".baseline")


@dataclass(frozen=True)
class GuardViolation:
    index: int  # the guarded allocation's number, in allocation order
    caller: str  # module:function that allocated it
    shape: tuple[int, ...]
    dtype: str
    side: str  # "after" or "before"
    first_byte: int  # offset of the first changed byte from the tensor's end (or start)
    changed: int  # changed bytes in that guard

    def __str__(self) -> str:
        where = (
            f"{self.first_byte} B past its end"
            if self.side == "after"
            else f"{self.first_byte} B before its start"
        )
        return (
            f"out-of-bounds write {where} ({self.changed} guard bytes changed) around tensor "
            f"#{self.index} {list(self.shape)} {self.dtype} allocated by {self.caller}"
        )


def _pattern(n: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0xF1D5)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).to(device)


def _caller() -> str | None:
    """``module:function`` of the first frame outside torch and this module, or None."""
    f = sys._getframe(2)
    for _ in range(8):
        if f is None:
            return None
        mod = f.f_globals.get("__name__", "")
        if not (mod.startswith("torch") or mod == __name__):
            return f"{mod}:{f.f_code.co_name}"
        f = f.f_back
    return None


class GuardedAllocations(TorchFunctionMode):
    """A torch function mode that guards the kernel library's allocations (module doc)."""

    def __init__(self, prefix: str = "flydsl_kernels."):
        super().__init__()
        self.prefix = prefix
        self.guards: list[tuple[int, str, torch.Tensor, torch.Tensor, int, tuple, str]] = []
        self._patterns: dict[tuple, torch.Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func not in _FACTORIES or not isinstance(out, torch.Tensor):
            return out
        who = _caller()
        if who is None or not who.startswith(self.prefix) or any(s in who for s in _SKIP):
            return out
        if not out.is_contiguous() or out.layout != torch.strided or out.is_meta:
            return out
        return self._guard(out, who)

    def guard(self, t):
        """A guarded copy of the caller's tensor ``t`` (same values, shape and dtype,
        contiguous, ``requires_grad`` kept); anything else comes back as it is."""
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_meta:
            return t
        with torch.no_grad():
            g = self._guard(t.contiguous(), "caller")
        return g.requires_grad_() if t.requires_grad else g

    def _guard(self, t: torch.Tensor, who: str) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        post = max(POST_MIN, min(POST_MAX, nbytes))
        post += -post % 256
        buf = torch.empty(PRE + nbytes + post, dtype=torch.uint8, device=t.device)
        pat = self._pattern(PRE + post, t.device)
        buf[:PRE].copy_(pat[:PRE])
        buf[PRE + nbytes :].copy_(pat[PRE:])
        view = buf[PRE : PRE + nbytes].view(t.dtype).view(t.shape)
        if nbytes:
            view.copy_(t)  # zeros / ones / full keep their values; empty's are undefined anyway
        self.guards.append(
            (len(self.guards), who, buf, pat, nbytes, tuple(t.shape), str(t.dtype).split(".")[-1])
        )
        return view

    def _pattern(self, n: int, device) -> torch.Tensor:
        key = (n, str(device))
        p = self._patterns.get(key)
        if p is None:
            p = self._patterns[key] = _pattern(n, device)
        return p

    @property
    def count(self) -> int:
        """Allocations guarded so far."""
        return len(self.guards)

    def violations(self) -> list[GuardViolation]:
        """Every guard whose bytes changed (synchronizes the GPU first)."""
        if any(g[2].is_cuda for g in self.guards):
            torch.cuda.synchronize()
        out = []
        for idx, who, buf, pat, nbytes, shape, dtype in self.guards:
            for side, got, want in (
                ("before", buf[:PRE], pat[:PRE]),
                ("after", buf[PRE + nbytes :], pat[PRE:]),
            ):
                diff = (got != want).nonzero()
                if diff.numel():
                    first = int(diff[0]) if side == "after" else PRE - int(diff[-1])
                    out.append(GuardViolation(idx, who, shape, dtype, side, first, diff.numel()))
        return out
