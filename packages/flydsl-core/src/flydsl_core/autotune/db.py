"""The tuning database: best configs keyed by kernel, shape bucket and arch.

Two layers: a database a library *ships* next to its kernels, so users get
tuned configs without tuning, and the user's own (``$FLYDSL_TUNING_DB`` or
``<cache dir>/tuning.json``), whose entries override the shipped ones. Each
entry says how it was chosen (``"timed"`` on a GPU, or ``"static"`` when
only static pruning and the resource model were available), so nothing
claims a measurement it does not have.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..exc import FlyDSLError
from ..settings import default_cache_dir, env_str
from .config import Config

FORMAT = 1


@dataclass(frozen=True)
class Entry:
    config: Config
    method: str  # "timed" | "static"
    metrics: dict[str, Any]

    def to_json(self):
        return {"config": self.config.to_json(), "method": self.method, "metrics": self.metrics}

    @staticmethod
    def from_json(d) -> Entry:
        return Entry(
            Config.from_json(d["config"]), d.get("method", "static"), dict(d.get("metrics", {}))
        )


def _k(kernel: str, bucket: str, arch: str) -> str:
    return f"{kernel}|{bucket}|{arch}"


def user_db_path() -> Path:
    p = env_str("FLYDSL_TUNING_DB")
    return Path(p).expanduser() if p else default_cache_dir() / "tuning.json"


class TuningDB:
    """One JSON file of entries. ``lookup`` consults the user file before the shipped ones."""

    def __init__(self, path: Path | str | None = None, shipped: list[Path | str] = ()):
        self.path = Path(path) if path is not None else user_db_path()
        self.shipped = [Path(p) for p in shipped]
        self._user = self._read(self.path)
        self._ship: dict[str, dict] = {}
        for p in self.shipped:
            self._ship.update(self._read(p))

    @staticmethod
    def _read(path: Path) -> dict[str, dict]:
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise FlyDSLError(
                f"tuning database {path} is unreadable ({e}); fix or delete it"
            ) from None
        if data.get("format") != FORMAT:
            raise FlyDSLError(
                f"tuning database {path} has format {data.get('format')}, expected {FORMAT}"
            )
        return dict(data.get("entries", {}))

    def lookup(self, kernel: str, bucket: str, arch: str) -> Entry | None:
        k = _k(kernel, bucket, arch)
        raw = self._user.get(k) or self._ship.get(k)
        return Entry.from_json(raw) if raw else None

    def source_of(self, kernel: str, bucket: str, arch: str) -> str | None:
        k = _k(kernel, bucket, arch)
        return "user" if k in self._user else ("shipped" if k in self._ship else None)

    def record(self, kernel: str, bucket: str, arch: str, entry: Entry) -> None:
        self._user[_k(kernel, bucket, arch)] = entry.to_json()

    def save(self) -> Path:
        """Write the user layer atomically (temp file + rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"format": FORMAT, "entries": self._user}, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return self.path

    def entries(self) -> dict[str, Entry]:
        merged = {**self._ship, **self._user}
        return {k: Entry.from_json(v) for k, v in merged.items()}
