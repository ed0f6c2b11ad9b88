"""Per-op counters: calls, FlyDSL hits, fallbacks by reason.

Keys are the overridden ATen overloads (``_fused_rms_norm``, ``topk.values``,
``_grouped_mm``, ``_scaled_mm_v2``, ...) and, for the torch.compile path, the ``flydsl::``
ops (their launches) and ``compile:<aten op>`` (nodes the pass saw: ``hits`` are rewrites,
``fallbacks`` the reasons a node stayed ATen).
Plain int increments on a slotted object: no allocation on the hot path beyond the first
time a reason appears; ``calls`` is derived (``hits`` plus every fallback), so a call costs
one increment.
"""

from __future__ import annotations

import logging

log = logging.getLogger("torch_flydsl")

#: fallback reasons, in the order the predicate checks them
REASONS = (
    "subclass",  # tensor subclasses, FakeTensor under torch.compile tracing among them
    "arch",  # the device's arch is not in the allowed list (or unknown)
    "dtype",  # an input dtype the kernel does not take
    "params",  # parameters outside the kernel's support (k, dim, shapes, eps, weight, out=)
    "empty",  # 0-d or empty tensors (ATen's own edge cases)
    "layout",  # non-contiguous inputs
    "row_stride",  # rows not one stride apart (a permuted view): RMSNorm takes one row stride
    "span",  # beyond the 32-bit buffer-descriptor span
    "gate",  # outside the gate table: ATen is faster there
    "dynamic",  # torch.compile: a size FlyDSL compiles for (N, K, groups) has no value (unbacked)
    "autotune",  # torch.compile with max-autotune: the timed choice was ATen
    "error",  # the kernel raised: logged at warning, ATen's result returned
)


class OpStats:
    __slots__ = ("fallbacks", "hits", "name")

    def __init__(self, name: str):
        self.name = name
        self.hits = 0
        self.fallbacks: dict[str, int] = {}

    @property
    def calls(self) -> int:
        return self.hits + sum(self.fallbacks.values())

    def fallback(self, reason: str) -> None:
        f = self.fallbacks
        f[reason] = f.get(reason, 0) + 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: ATen fallback (%s)", self.name, reason)

    def error(self, e: Exception, answer: str = "ATen's result") -> None:
        """The FlyDSL kernel raised ``e``: logged at warning and counted as the ``error``
        fallback; ``answer`` says what the caller returns instead."""
        log.warning(
            "%s: the FlyDSL kernel raised %s: %s; returning %s",
            self.name,
            type(e).__name__,
            e,
            answer,
        )
        self.fallback("error")

    def as_dict(self) -> dict:
        return {"calls": self.calls, "hits": self.hits, "fallbacks": dict(self.fallbacks)}

    def reset(self) -> None:
        self.hits = 0
        self.fallbacks.clear()  # in place: generated dispatch wrappers hold this dict


_STATS: dict[str, OpStats] = {}


def get(name: str) -> OpStats:
    s = _STATS.get(name)
    if s is None:
        s = _STATS[name] = OpStats(name)
    return s


def snapshot() -> dict[str, dict]:
    return {k: v.as_dict() for k, v in _STATS.items()}


def reset() -> None:
    for s in _STATS.values():
        s.reset()
