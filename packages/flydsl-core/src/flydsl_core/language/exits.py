"""Early exits from structured regions, found in the kernel's source before they are traced.

A ``fly.range`` / ``fly.while_`` loop or a ``fly.if_`` / ``fly.else_`` block
becomes one structured op whose body is traced as a whole. A Python
``break``, ``continue`` or ``return`` inside it would leave the body while
it is being traced: the loop would be cut after its first trace pass, and
a ``return`` or ``continue`` inside ``fly.if_`` would silently drop the code
after the block from *both* branches. Python gives the region no sign of
how it was left, so the check reads the source: when a region starts, the
statement that opens it is found in the function's AST (by its line) and
its body is searched for exits that would leave it. Loops nested inside
the region own their own ``break`` and ``continue``; nested functions own
their ``return``.

The error names the exit's line and what to write instead. Code whose
source cannot be read (``exec``) is not checked here; the tracer still
notices a loop left open at the end of the trace.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import sys
import textwrap
import threading
import types
import weakref

from ..exc import ControlFlowError, SourceLoc, is_user_code

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

#: code -> (first line, AST) of its function (None without source); weak: kernels come and go
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: code -> {(line, kind): the first early exit of the region opened there, or None}
_regions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()

ADVICE = {
    ("loop", "Break"): (
        "a fly.range / fly.while_ loop cannot `break`: its trip count is fixed when it starts. "
        "Loop with `for _ in fly.while_(lambda: cond)` and update the tiles `cond` reads, or "
        "keep running and guard the rest of the body with `with fly.if_(...)`"
    ),
    ("loop", "Continue"): (
        "a fly.range / fly.while_ loop cannot `continue`; guard the rest of the body with "
        "`with fly.if_(cond):` (or select values with fly.where) instead"
    ),
    ("loop", "Return"): (
        "a kernel cannot `return` from inside a fly.range / fly.while_ loop; guard the rest of "
        "the body with `with fly.if_(...)`, or mask the loads and stores"
    ),
    ("branch", "Break"): (
        "`break` inside `with fly.if_(...)` would leave the branch, not the loop, at trace time; "
        "a run-time loop cannot break: loop with `for _ in fly.while_(lambda: cond)` instead"
    ),
    ("branch", "Continue"): (
        "`continue` inside `with fly.if_(...)` would skip the rest of the loop body in both "
        "branches; put the rest of the body in the other branch (`with fly.else_():`) instead"
    ),
    ("branch", "Return"): (
        "`return` inside `with fly.if_(...)` would drop the rest of the kernel in both "
        "branches (kernels have no early exit); put the rest of the kernel under "
        "`with fly.if_(<the opposite condition>):`, or mask its loads and stores"
    ),
}


def _function_ast(code: types.CodeType) -> tuple[int, ast.AST] | None:
    """(first line, AST) of the function whose code this is; None without source."""
    with _lock:
        if code in _cache:
            return _cache[code]
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        found = (max(start, 1), tree)
    except (OSError, TypeError, SyntaxError, IndentationError):
        found = None
    with _lock:
        _cache[code] = found
    return found


def _exits(body: list[ast.stmt], in_loop: bool):
    """``break`` / ``continue`` / ``return`` statements in ``body`` that leave it."""
    for stmt in body:
        stack = [(stmt, in_loop)]
        while stack:
            node, looped = stack.pop()
            if isinstance(node, ast.Return) or (
                isinstance(node, (ast.Break, ast.Continue)) and not looped
            ):
                yield node
            for child in ast.iter_child_nodes(node):
                if isinstance(child, _SCOPES):
                    continue
                inner = looped or (isinstance(node, _LOOPS) and child in getattr(node, "body", ()))
                stack.append((child, inner))


def _header(node: ast.AST, kind: str) -> tuple[int, int] | None:
    """The line span of the statement's header (where the region starts), or None."""
    if kind == "loop" and isinstance(node, (ast.For, ast.AsyncFor)):
        return node.lineno, node.iter.end_lineno or node.lineno
    if kind == "branch" and isinstance(node, (ast.With, ast.AsyncWith)):
        return node.lineno, max(i.context_expr.end_lineno or node.lineno for i in node.items)
    return None


def check_region(kind: str) -> None:
    """Raise ``ControlFlowError`` at the user's line if the region being entered (``"loop"``
    or ``"branch"``) holds a ``break``, ``continue`` or ``return`` that would leave it."""
    f = sys._getframe(1)
    while f is not None and not is_user_code(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return
    with _lock:
        seen = _regions.setdefault(f.f_code, {})
    key = (f.f_lineno, kind)
    found = seen.get(key, _UNSEEN)
    if found is _UNSEEN:
        found = seen[key] = _first_exit(f.f_code, f.f_lineno, kind)
    if found is not None:
        name, at = found
        file = f.f_code.co_filename
        raise ControlFlowError(
            ADVICE[(kind, name)],
            loc=SourceLoc(file, at, f.f_code.co_name, linecache.getline(file, at)),
        )


_UNSEEN = object()


def _first_exit(code: types.CodeType, lineno: int, kind: str) -> tuple[str, int] | None:
    """(statement kind, file line) of the first exit leaving the region at ``lineno``."""
    found = _function_ast(code)
    if found is None:
        return None
    start, tree = found
    line = lineno - start + 1  # the line in the parsed (dedented) source
    for node in ast.walk(tree):
        span = _header(node, kind)
        if span is None or not span[0] <= line <= span[1]:
            continue
        for exit_ in _exits(node.body, False):
            return type(exit_).__name__, exit_.lineno + start - 1
    return None
