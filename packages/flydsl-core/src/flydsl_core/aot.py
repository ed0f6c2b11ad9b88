"""Ahead-of-time bundles: compiled code objects for declared specializations, plus a manifest.

``write_bundle(compiled, out_dir)`` stores each ``CompiledKernel`` (compiled
for a GPU target, on any machine) as ``<out_dir>/<key>/`` with its code
object, Triton metadata and generated source, and writes ``manifest.json``
listing keys, kernel names, target, signature facts, constexprs, options,
launch metadata and resources. ``load_bundle(out_dir)`` registers the
entries, after which launching those specializations performs no JIT
compile: the executable is rebuilt from the stored files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .exc import FlyDSLError

MANIFEST = "manifest.json"
FORMAT = 1


def write_bundle(compiled, out_dir) -> Path:
    from .backends import get_backend

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for ck in compiled:
        if ck.key is None:
            raise FlyDSLError(
                f"{ck.name} for {ck.target} has no cache key (only GPU targets can be bundled)"
            )
        files = get_backend(ck.target).serialize(ck.executable)
        launch = dict(ck.executable.describe())
        d = out / ck.key
        d.mkdir(exist_ok=True)
        digests = {}
        for name, data in files.items():
            data = data.encode() if isinstance(data, str) else data
            (d / name).write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
        entries.append(
            {
                "key": ck.key,
                "kernel": ck.name,
                "target": ck.target,
                "signature": {n: s.to_json() for n, s in ck.spec.specs.items()},
                "constexprs": {k: repr(v) for k, v in ck.spec.constexprs.items()},
                "options": launch.pop("options", {}),
                "launch": launch,
                "resources": json.loads(ck.report.to_json()) if ck.report is not None else None,
                "files": digests,
            }
        )
    (out / MANIFEST).write_text(
        json.dumps({"format": FORMAT, "kernels": entries}, indent=1, default=str)
    )
    return out


def load_bundle(bundle_dir) -> int:
    """Register a bundle's kernels; returns how many. Files are checked against the manifest."""
    from .runtime.store import PRELOADED

    root = Path(bundle_dir)
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FlyDSLError(f"{root} is not a FlyDSL AOT bundle ({e})") from None
    if manifest.get("format") != FORMAT:
        raise FlyDSLError(f"bundle {root} has format {manifest.get('format')}, expected {FORMAT}")
    for entry in manifest["kernels"]:
        d = root / entry["key"]
        for name, digest in entry["files"].items():
            p = d / name
            if not p.exists() or hashlib.sha256(p.read_bytes()).hexdigest() != digest:
                raise FlyDSLError(
                    f"bundle {root}: {entry['kernel']} file {name} is missing or corrupt"
                )
        PRELOADED[entry["key"]] = d
    return len(manifest["kernels"])
