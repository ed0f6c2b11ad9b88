"""The on-disk compile cache.

Layout under the root (``settings.default_cache_dir()`` unless given)::

    root/
      CACHEDIR.TAG              marks the folder as a cache for backup tools
      ab/
        abcdef.../              one entry per key, sharded by its first 2 chars
          kernel.hsaco          the entry's named files
          kernel.json
          entry.json            manifest: format, key, size and sha256 per file
        abcdef....lock          per-key lock used by get_or_create

Entries are written into a temporary folder next to their final place,
fsynced and renamed into place, so a reader sees a whole entry or none. A
first valid entry is never replaced: keys name content, so a second writer
of the same key keeps the entry already there.

An entry that does not verify (missing or truncated file, checksum mismatch,
missing, unreadable or invalid manifest) is reported as a
``CacheCorruptionWarning`` and in the log, removed, and treated as a miss.
Errors the cache cannot work around (the root cannot be created or written)
raise ``flydsl_core.exc.CacheError``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import filelock

from .. import settings as _settings
from ..exc import CacheCorruptionWarning, CacheError
from ..settings import default_cache_dir

__all__ = ["FORMAT_VERSION", "MANIFEST", "CacheCorruptionWarning", "CacheInfo", "DiskCache"]

logger = logging.getLogger(__name__)

#: Version of the entry layout; entries of another version are misses.
FORMAT_VERSION = 1
#: The manifest's file name inside an entry.
MANIFEST = "entry.json"

_KEY_RE = re.compile(r"[0-9A-Za-z_-]{2,128}")
_NAME_RE = re.compile(r"[0-9A-Za-z_][0-9A-Za-z_.-]{0,127}")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_LOCK_SUFFIX = ".lock"
_TAG = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by FlyDSL (the kernel compile cache).\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)

Files = dict[str, bytes]


class CacheInfo(NamedTuple):
    entries: int
    total_bytes: int
    root: Path


class _Corrupt(Exception):
    """An entry exists but does not verify (the message says why)."""


class _Stale(Exception):
    """An entry of another format version."""


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"invalid cache key {key!r}: expected 2-128 characters from [0-9A-Za-z_-] "
            "(make_key() returns a hex sha256)"
        )
    return str(key)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name == MANIFEST:
        raise ValueError(
            f"invalid cache file name {name!r}: expected a plain file name of [0-9A-Za-z_.-] "
            f"not starting with '.' or '-', and not {MANIFEST!r}"
        )
    return name


def _normalize(files: Mapping[str, bytes | str]) -> Files:
    if not isinstance(files, Mapping):
        raise TypeError(
            f"cache entry files must be a dict of name -> bytes/str, got {type(files).__name__}"
        )
    out: Files = {}
    for name, data in files.items():
        _check_name(name)
        if isinstance(data, str):
            out[name] = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            out[name] = bytes(data)
        else:
            raise TypeError(f"cache file {name!r} must be bytes or str, got {type(data).__name__}")
    return out


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (where the OS supports it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _manifest(key: str, files: Files) -> bytes:
    doc = {
        "format": FORMAT_VERSION,
        "key": key,
        "created": time.time(),
        "files": {
            name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in sorted(files.items())
        },
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")


def _read_entry(entry: Path, key: str) -> Files | None:
    """The entry's verified files; None if there is no entry.

    Raises ``_Corrupt`` or ``_Stale`` for an entry that exists but cannot be used.
    """
    try:
        raw = (entry / MANIFEST).read_bytes()
    except FileNotFoundError:
        if not os.path.lexists(entry):
            return None
        raise _Corrupt(f"{MANIFEST} is missing") from None
    except NotADirectoryError:
        if not os.path.lexists(entry):
            return None  # a file where a parent folder should be: nothing cached there
        raise _Corrupt("the entry is not a directory") from None
    except OSError as e:
        raise _Corrupt(f"{MANIFEST} is unreadable: {e}") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise _Corrupt(f"{MANIFEST} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("format"), int):
        raise _Corrupt(f"{MANIFEST} has no format version")
    if doc["format"] != FORMAT_VERSION:
        raise _Stale(f"format {doc['format']}, this flydsl reads format {FORMAT_VERSION}")
    listed = doc.get("files")
    if doc.get("key") != key or not isinstance(listed, dict):
        raise _Corrupt(f"{MANIFEST} does not describe key {key}")
    files: Files = {}
    for name, meta in listed.items():
        if (
            not isinstance(name, str)
            or not _NAME_RE.fullmatch(name)
            or name == MANIFEST
            or not isinstance(meta, dict)
            or not isinstance(meta.get("size"), int)
            or not isinstance(meta.get("sha256"), str)
        ):
            raise _Corrupt(f"{MANIFEST} has an invalid record for {name!r}")
        try:
            data = (entry / name).read_bytes()
        except FileNotFoundError:
            raise _Corrupt(f"file {name!r} is missing") from None
        except OSError as e:
            raise _Corrupt(f"file {name!r} is unreadable: {e}") from None
        if len(data) != meta["size"]:
            raise _Corrupt(f"file {name!r} has {len(data)} bytes, expected {meta['size']}")
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise _Corrupt(f"file {name!r} fails its sha256 check")
        files[name] = data
    return files


def _discard(path: Path) -> str | None:
    """Remove an entry (or anything in its place): renamed aside first, so a concurrent
    reader sees it whole or not at all. Never raises: returns None when it is gone, else
    why it could not be removed."""
    aside = path.with_name(f"{_TRASH_PREFIX}{path.name}-{secrets.token_hex(4)}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    except OSError:
        aside = path
    try:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)
        else:
            aside.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("flydsl cache: could not remove %s: %s", aside, e)
        return f"{e.strerror or e}"
    return None


class DiskCache:
    """The on-disk compile cache under ``root``.

    ``DiskCache(root)`` always uses the cache at ``root`` (default:
    ``settings.default_cache_dir()``, i.e. ``$FLYDSL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/flydsl``, else ``~/.cache/flydsl``), whatever
    ``FLYDSL_DISABLE_CACHE`` says; ``DiskCache.default()`` is the cache the
    compiler uses, and honours it.

    With ``enabled=False`` the cache is a no-op: ``get`` always misses,
    ``contains`` is False, ``put`` writes nothing and ``get_or_create`` always
    builds. ``info``, ``clear`` and ``remove`` still act on the folder, so the
    cache can be inspected and cleaned while it is disabled.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *, enabled: bool = True):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.enabled = enabled

    @classmethod
    def default(cls) -> DiskCache:
        """The cache at ``settings.default_cache_dir()``, disabled (a no-op that
        always misses) when ``FLYDSL_DISABLE_CACHE=1``. Reads the environment
        at call time."""
        return cls(None, enabled=not _settings.get("FLYDSL_DISABLE_CACHE"))

    def __repr__(self) -> str:
        state = "" if self.enabled else ", disabled"
        return f"DiskCache({str(self.root)!r}{state})"

    # ------------------------------------------------------------------ paths

    def path(self, key: str) -> Path:
        """The folder of ``key``'s entry (whether or not it exists)."""
        key = _check_key(key)
        return self.root / key[:2] / key

    def _lock_path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{_LOCK_SUFFIX}"

    def _ensure_dir(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(self._unwritable(path, e)) from e
        tag = self.root / _TAG
        if not tag.exists():
            with contextlib.suppress(OSError):
                tag.write_text(_TAG_TEXT)

    def _unwritable(self, path: Path, e: OSError) -> str:
        return (
            f"the compile cache at {self.root} is not writable ({path}: {e.strerror or e}); "
            "set FLYDSL_CACHE_DIR to a writable folder, or FLYDSL_DISABLE_CACHE=1 to turn "
            "the cache off"
        )

    # ------------------------------------------------------------------ reads

    def get(self, key: str) -> Files | None:
        """The files of ``key``'s entry, or None on a miss.

        A corrupt entry is warned about, removed and reported as a miss.
        """
        entry = self.path(key)
        if not self.enabled:
            return None
        try:
            files = _read_entry(entry, key)
        except _Corrupt as e:
            self._corrupt(entry, str(e))
            return None
        except _Stale as e:
            logger.info("flydsl cache: dropping entry %s of another version (%s)", entry, e)
            _discard(entry)
            return None
        logger.debug("flydsl cache %s: %s", "hit" if files is not None else "miss", key)
        return files

    def contains(self, key: str) -> bool:
        """Whether a valid entry for ``key`` exists (verifies it, like ``get``)."""
        return self.get(key) is not None

    __contains__ = contains

    def _corrupt(self, entry: Path, why: str) -> None:
        failed = _discard(entry)
        if failed is None:
            done = "removed it; compiling again"
        else:
            done = (
                f"could not remove it ({failed}); compiling again, the result is kept in "
                "memory only"
            )
        msg = f"flydsl cache: corrupt entry {entry} ({why}); {done}"
        logger.warning(msg)
        warnings.warn(msg, CacheCorruptionWarning, stacklevel=3)

    # ----------------------------------------------------------------- writes

    def put(self, key: str, files: Mapping[str, bytes | str]) -> Path:
        """Store ``files`` (name -> bytes or str, str stored as UTF-8) as ``key``'s
        entry and return its folder.

        Atomic: the entry appears whole or not at all. If a valid entry for
        ``key`` already exists (or appears meanwhile from another process), it
        is kept and ``files`` are dropped. Raises ``CacheError`` if the cache
        folder cannot be written.
        """
        entry = self.path(key)
        blobs = _normalize(files)
        if not self.enabled:
            return entry
        parent = entry.parent
        self._ensure_dir(parent)
        if self._valid(entry, key):
            return entry
        tmp = None
        try:
            tmp = self._make_tmp(parent, key)
            for name, data in blobs.items():
                _write_file(tmp / name, data)
            _write_file(tmp / MANIFEST, _manifest(key, blobs))
            _fsync_dir(tmp)
            self._commit(tmp, entry, key)
            tmp = None
        except OSError as e:
            raise CacheError(
                f"could not write cache entry {entry}: {e}"
                if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS)
                else self._unwritable(parent, e)
            ) from e
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        return entry

    def _valid(self, entry: Path, key: str) -> bool:
        try:
            return _read_entry(entry, key) is not None
        except (_Corrupt, _Stale):
            return False

    @staticmethod
    def _make_tmp(parent: Path, key: str) -> Path:
        for _ in range(100):
            tmp = parent / f"{_TMP_PREFIX}{key}-{secrets.token_hex(4)}"
            try:
                tmp.mkdir()
            except FileExistsError:
                continue
            return tmp
        raise CacheError(f"could not create a temporary folder in {parent}")

    def _commit(self, tmp: Path, entry: Path, key: str) -> None:
        """Rename ``tmp`` into place as ``entry``, keeping a valid entry that is
        already there; a broken one in the way is discarded."""
        for _ in range(10):
            try:
                os.replace(tmp, entry)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise
            else:
                _fsync_dir(entry.parent)
                return
            # The entry appeared meanwhile (another process, same key).
            if self._valid(entry, key):
                logger.debug("flydsl cache: %s was written concurrently; keeping it", key)
                shutil.rmtree(tmp, ignore_errors=True)
                return
            _discard(entry)
        raise CacheError(f"could not move cache entry into place at {entry}")

    def get_or_create(
        self,
        key: str,
        build_fn: Callable[[], Mapping[str, bytes | str]],
        *,
        lock_timeout: float = 600.0,
    ) -> Files:
        """``key``'s files from the cache, else ``build_fn()``'s, stored first.

        Takes a per-key lock file (``root/<key[:2]>/<key>.lock``) around the
        check-build-store, so processes compiling the same kernel at once build
        it once: the others wait and read the first one's entry. After
        ``lock_timeout`` seconds of waiting it builds without the lock (the
        atomic ``put`` keeps the result consistent). If ``build_fn`` raises,
        nothing is stored and the exception propagates.
        """
        key = _check_key(key)
        if not self.enabled:
            return _normalize(build_fn())
        files = self.get(key)
        if files is not None:
            return files
        lock_path = self._lock_path(key)
        self._ensure_dir(lock_path.parent)
        with self._locked(lock_path, lock_timeout):
            files = self.get(key)
            if files is not None:
                return files
            files = _normalize(build_fn())
            self.put(key, files)
            return files

    @contextlib.contextmanager
    def _locked(self, lock_path: Path, timeout: float) -> Iterator[None]:
        lock = filelock.FileLock(str(lock_path), timeout=timeout)
        acquired = False
        try:
            lock.acquire()
            acquired = True
        except filelock.Timeout:
            logger.warning(
                "flydsl cache: waited %.0f s for %s; building without the lock", timeout, lock_path
            )
        except OSError as e:
            raise CacheError(self._unwritable(lock_path, e)) from e
        try:
            yield
        finally:
            if acquired:
                lock.release()

    # ------------------------------------------------------------ maintenance

    def _shards(self) -> Iterator[Path]:
        try:
            children = list(os.scandir(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            raise CacheError(f"cannot read the compile cache at {self.root}: {e}") from e
        for d in children:
            if len(d.name) == 2 and _KEY_RE.fullmatch(d.name) and d.is_dir(follow_symlinks=False):
                yield Path(d.path)

    @staticmethod
    def _owned(shard: Path, name: str) -> str | None:
        """What ``shard/name`` is to the cache: 'entry', 'tmp', 'lock' or None."""
        for prefix in (_TMP_PREFIX, _TRASH_PREFIX):
            if name.startswith(prefix):
                return "tmp" if name[len(prefix) : len(prefix) + 2] == shard.name else None
        if name.endswith(_LOCK_SUFFIX):
            base = name[: -len(_LOCK_SUFFIX)]
            return "lock" if _KEY_RE.fullmatch(base) and base[:2] == shard.name else None
        if (
            _KEY_RE.fullmatch(name)
            and name[:2] == shard.name
            and (shard / name / MANIFEST).is_file()
        ):
            return "entry"
        return None

    def info(self) -> CacheInfo:
        """(number of entries, total bytes of their files, root). Does not verify."""
        entries = total = 0
        for shard in self._shards():
            for child in os.scandir(shard):
                if self._owned(shard, child.name) != "entry":
                    continue
                entries += 1
                for f in os.scandir(child.path):
                    with contextlib.suppress(OSError):
                        if f.is_file(follow_symlinks=False):
                            total += f.stat(follow_symlinks=False).st_size
        return CacheInfo(entries, total, self.root)

    def remove(self, key: str) -> bool:
        """Remove ``key``'s entry; whether there was one. ``CacheError`` if it could not be."""
        entry = self.path(key)
        existed = os.path.lexists(entry)
        failed = _discard(entry)
        if failed is not None:
            raise CacheError(f"could not remove cache entry {entry}: {failed}")
        return existed

    def clear(self) -> int:
        """Remove every entry (and leftover temporary folders and lock files);
        returns the number of entries removed. Only files the cache made are
        touched, so a root pointed at a shared folder is safe. Entries that
        cannot be removed (a read-only cache) raise ``CacheError`` saying how
        many, after every other entry is gone."""
        removed, failed = 0, []
        for shard in self._shards():
            for child in list(os.scandir(shard)):
                kind = self._owned(shard, child.name)
                if kind == "entry":
                    why = _discard(Path(child.path))
                    if why is None:
                        removed += 1
                    else:
                        failed.append(why)
                elif kind == "tmp":
                    shutil.rmtree(child.path, ignore_errors=True)
                elif kind == "lock":
                    with contextlib.suppress(OSError):
                        os.unlink(child.path)
            with contextlib.suppress(OSError):
                shard.rmdir()  # only if empty
        if failed:
            raise CacheError(
                f"could not remove {len(failed)} of {len(failed) + removed} entries from the "
                f"compile cache at {self.root} ({failed[0]}); removed {removed}"
            )
        return removed
