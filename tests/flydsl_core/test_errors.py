"""The error catalog: every error class in exc.py, trace-time errors located by default."""

from __future__ import annotations

import ast
import pathlib

import pytest

import flydsl_core
from flydsl_core import exc

pytestmark = pytest.mark.cpu


def test_every_error_class_lives_in_exc():
    root = pathlib.Path(flydsl_core.__file__).parent
    outside = []
    for p in root.rglob("*.py"):
        if p.name == "exc.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Warning")) for b in bases):
                    outside.append(f"{p.relative_to(root)}:{node.name}")
    assert outside == []


def test_errors_md_lists_every_class():
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "errors.md").read_text()
    classes = [
        n for n, v in vars(exc).items()
        if isinstance(v, type) and issubclass(v, (exc.FlyDSLError, Warning)) and v.__module__ == exc.__name__
    ]  # fmt: skip
    assert [c for c in classes if c != "FlyDSLError" and f"`{c}`" not in doc] == []


def _raise_here():
    raise exc.TypeCheckError("bad operands")


def test_trace_errors_find_the_users_line_by_default():
    with pytest.raises(exc.TypeCheckError) as info:
        _raise_here()
    loc = info.value.loc
    assert loc.file == __file__ and loc.text.strip() == 'raise exc.TypeCheckError("bad operands")'
    assert f"{__file__}:{loc.line}: bad operands" in str(info.value)
    assert exc.CompileError("x").loc is None  # errors not from the user's code carry none
