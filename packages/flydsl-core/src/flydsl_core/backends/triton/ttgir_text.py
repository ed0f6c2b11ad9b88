"""Reading and re-parsing printed TTGIR, for the TTGIR rewrites (``shared_operands``,
``direct_lds``): they work on the MLIR printer's text, whose indentation marks each region's
block, and parse the result back in the module's context."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

#: a one-warp layout's CGA layout as Triton 3.9 prints it (``ctaLayout = {}``: the empty warp
#: basis left out), which its own parser rejects with a fatal error that ends the process
#: ("Expected basis of 'warp' not found"; gfx1250's one-warp dK/dV band tile hit it); written
#: back with the empty basis it stands for, which parses to the same layout
_EMPTY_CGA = "ctaLayout = {}"
_EMPTY_CGA_PARSED = "ctaLayout = {warp = []}"
_ALIAS = re.compile(r"^(#[\w.]+) = (#ttg\.[^\n]*?)\s*$", re.M)


def aliases(text: str) -> dict[str, str]:
    """The module's layout aliases (``#shared1 = #ttg.swizzled_shared<...>``): name -> layout."""
    return {m.group(1): m.group(2) for m in _ALIAS.finditer(text)}


def uses(text: str, name: str) -> list[re.Match]:
    """Every occurrence of ``%name`` as an operand (not its definition)."""
    return [
        m
        for m in re.finditer(rf"%{re.escape(name)}(?![\w.])", text)
        if not re.match(r" = ", text[m.end() : m.end() + 3])
    ]


def only_use_line(text: str, name: str) -> tuple[int, int] | None:
    """The start and end of the line holding ``%name``'s one use; None unless it has one."""
    found = uses(text, name)
    return line_at(text, found[0].start()) if len(found) == 1 else None


def line_at(text: str, pos: int) -> tuple[int, int]:
    """The start and end of the line holding ``pos``."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return start, len(text) if end < 0 else end


def same_block(text: str, start: int, end: int, indent: int) -> bool:
    """Whether no line in ``text[start:end]`` is indented less than ``indent`` (the MLIR
    printer indents each region: a shallower line closes the block)."""
    for line in text[start:end].split("\n"):
        if line.strip() and len(line) - len(line.lstrip(" ")) < indent:
            return False
    return True


def rewrite_each(text: str, pattern: re.Pattern, rewrite) -> tuple[str, int]:
    """``text`` with ``rewrite(text, match, count)`` applied at each match of ``pattern`` in
    turn (it returns the new text, or None to leave that match), and how many it rewrote; a
    rewritten match's place is searched again."""
    count = 0
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        new = rewrite(text, m, count)
        if new is None:
            pos = m.end()
        else:
            text, count, pos = new, count + 1, m.start()
    return text, count


def parse(text: str, context):
    """``text`` parsed as a module in ``context`` (Triton's parser reads files)."""
    from triton._C.libtriton import ir

    text = text.replace(_EMPTY_CGA, _EMPTY_CGA_PARSED)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rewritten.ttgir")
        Path(path).write_text(text)
        new = ir.parse_mlir_module(path, context)
    new.context = context
    return new
