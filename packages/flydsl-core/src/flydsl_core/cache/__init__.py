"""The compile cache: keys, an in-process LRU and the on-disk cache.

* ``make_key(**parts)`` / ``CacheKey``: a hex sha256 over the canonical JSON of
  named parts, plus ``compiler_fingerprint()``; nothing ambient goes in.
* ``source_fingerprint(fn)``: a kernel's source and everything it calls.
* ``MemoryCache``: thread-safe LRU, keyed by key strings.
* ``DiskCache``: atomic, verified on-disk entries; ``DiskCache.default()``
  honours ``FLYDSL_CACHE_DIR`` and ``FLYDSL_DISABLE_CACHE``.
"""

from .disk import FORMAT_VERSION, CacheCorruptionWarning, CacheInfo, DiskCache
from .keys import (
    KEY_FORMAT,
    CacheKey,
    canonical_json,
    compiler_components,
    compiler_fingerprint,
    make_key,
    source_fingerprint,
)
from .memory import MemoryCache

__all__ = [
    "FORMAT_VERSION",
    "KEY_FORMAT",
    "CacheCorruptionWarning",
    "CacheInfo",
    "CacheKey",
    "DiskCache",
    "MemoryCache",
    "canonical_json",
    "compiler_components",
    "compiler_fingerprint",
    "make_key",
    "source_fingerprint",
]
