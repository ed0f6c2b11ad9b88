"""The compile cache: keys, source fingerprints and guards, and the on-disk cache.

* ``make_key(**parts)`` / ``CacheKey``: a hex sha256 over the canonical JSON of
  named parts, plus ``compiler_fingerprint()``; nothing ambient goes in.
* ``source_fingerprint(fn)``: a kernel's source and everything it calls.
* ``guarded_fingerprint(fn)``: the same, with a ``SourceGuard`` that tells cheaply
  (on every launch) whether it still holds; kernels keep their in-process compiles
  only while it does.
* ``DiskCache``: atomic, verified on-disk entries; ``DiskCache.default()``
  honours ``FLYDSL_CACHE_DIR`` and ``FLYDSL_DISABLE_CACHE``.
"""

from .disk import FORMAT_VERSION, CacheCorruptionWarning, CacheInfo, DiskCache
from .keys import (
    KEY_FORMAT,
    CacheKey,
    SourceGuard,
    canonical_json,
    compiler_components,
    compiler_fingerprint,
    guarded_fingerprint,
    make_key,
    source_fingerprint,
)

__all__ = [
    "FORMAT_VERSION",
    "KEY_FORMAT",
    "CacheCorruptionWarning",
    "CacheInfo",
    "CacheKey",
    "DiskCache",
    "SourceGuard",
    "canonical_json",
    "compiler_components",
    "compiler_fingerprint",
    "guarded_fingerprint",
    "make_key",
    "source_fingerprint",
]
