"""Write the workspace packages' metadata into a folder, for an interpreter without an install.

    python tools/dev_metadata.py DIR

An interpreter that imports the four packages from ``packages/*/src`` (the lent GPU machine:
no uv, no network, its own torch; ``tools/gpu_run.sh``) finds their modules but not their entry
points, which only an install's ``.dist-info`` declares: ``torch.compile(backend="flydsl")``
(``torch_dynamo_backends``), the ``FLYDSL_*`` settings of torch-flydsl (``flydsl.settings``)
and the kernels' exports (``flydsl_core.exports``). This writes one
``<name>-<version>.dist-info`` per package (``METADATA`` and ``entry_points.txt``, the files
``importlib.metadata`` reads) from its ``pyproject.toml``; put DIR on ``PYTHONPATH`` with the
sources. Nothing is copied: the modules stay the checkout's.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser under its old name
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def groups(project: dict) -> dict[str, dict[str, str]]:
    """``{group: {name: "module:attr"}}`` of a ``[project]`` table (scripts included, as an
    install declares them)."""
    out = {group: dict(eps) for group, eps in project.get("entry-points", {}).items()}
    if project.get("scripts"):
        out["console_scripts"] = dict(project["scripts"])
    if project.get("gui-scripts"):
        out["gui_scripts"] = dict(project["gui-scripts"])
    return out


def write(dest: Path, root: Path = ROOT) -> list[Path]:
    """One ``.dist-info`` per ``packages/*/pyproject.toml`` in ``dest``; returns them."""
    made = []
    for pyproject in sorted(root.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        name, version = project["name"], project["version"]
        info = dest / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        text = ""
        for group, eps in groups(project).items():
            text += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        (info / "entry_points.txt").write_text(text)
        made.append(info)
    return made


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    for info in write(Path(args[0])):
        print(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
