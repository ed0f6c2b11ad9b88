"""The DSL under random misuse: launch grids, tensor parameters, targets, early exits."""

from __future__ import annotations

import importlib.util
import operator

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

import flydsl_core as fly
from flydsl_core import backends
from flydsl_core.exc import ArgumentError, ControlFlowError, UnknownTargetError
from flydsl_core.targets import all_targets, get_target, resolve_target

from .conftest import ROBUST, outcome

pytestmark = pytest.mark.cpu


class _Recorder(backends.Backend, backends.Executable):
    """Compiles nothing and records the grids it is launched on."""

    def __init__(self):
        self.grids = []

    def compile(self, fn, spec, options):
        return self

    def launch(self, grid, args):
        self.grids.append(grid)


@pytest.fixture(scope="module")
def recorder():
    rec = _Recorder()
    with backends.temporary("robust-recorder", rec):
        yield rec


@fly.kernel
def _copy(x: fly.Tensor, out: fly.Tensor, n: int, BLOCK: fly.constexpr):
    i = fly.program_id(0)
    out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load())


scalars = st.one_of(
    st.integers(-2, 5),
    st.floats(-2, 5),
    st.just(float("nan")),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
    st.just(torch.tensor(3)),
    st.just(torch.tensor(2.5)),
)
grids = st.one_of(scalars, st.lists(scalars, max_size=4).map(tuple), st.lists(scalars, max_size=4))


def _grid_ok(grid) -> tuple | None:
    """The normalized 3-D grid a launch grid means, or None where it is no grid."""
    items = tuple(grid) if isinstance(grid, (list, tuple)) else (grid,)
    try:
        if any(isinstance(g, bool) for g in items):
            return None
        dims = tuple(operator.index(g) for g in items)
    except TypeError:
        return None
    if not 1 <= len(dims) <= 3 or min(dims) < 0:
        return None
    return dims + (1,) * (3 - len(dims))


@ROBUST
@given(grid=grids)
def test_a_grid_is_a_tuple_of_ints(recorder, grid):
    x, out = torch.zeros(8), torch.zeros(8)
    want = _grid_ok(grid)
    event("grid ok" if want else "not a grid")
    for _ in range(2):  # the second launch takes the cached grid, where there is one
        got = outcome(_copy[grid], x, out, 8, BLOCK=8, target="robust-recorder")
        if want is None:
            assert isinstance(got.error, ArgumentError), got.error
            assert "a launch grid is an int or a tuple of 1 to 3 non-negative ints" in str(
                got.error
            )
        else:
            assert got.ok, got.error
            assert recorder.grids[-1] == want


non_tensors = st.one_of(
    st.integers(-3, 3), st.floats(allow_nan=False), st.none(), st.text(max_size=3), st.booleans()
)


@ROBUST
@given(bad=non_tensors, which=st.sampled_from(["x", "out"]))
def test_tensor_parameters_given_non_tensors_name_the_parameter(bad, which):
    args = {"x": torch.zeros(8), "out": torch.zeros(8), "n": 8}
    args[which] = bad
    got = outcome(_copy[(1,)], **args, BLOCK=8, target="cpu-reference")
    assert isinstance(got.error, ArgumentError), got.error
    msg = str(got.error)
    assert f"'{which}'" in msg and "tensor" in msg


def _spellings(name: str):
    return st.tuples(
        st.sampled_from([str.lower, str.upper, str.title]),
        st.sampled_from(["", " "]),
        st.booleans(),
    ).map(lambda t: t[1] + t[0](name.replace("-", "_") if t[2] else name) + t[1])


names = st.sampled_from([n for t in all_targets() for n in (t.name, *t.aliases)]).flatmap(
    lambda n: st.tuples(st.just(n), _spellings(n))
)


@ROBUST
@given(pair=names)
def test_target_names_and_aliases_mean_the_same_everywhere(monkeypatch, pair):
    """compile(target=), resolve_target (FLYDSL_TARGET) and the CLI's --target agree."""
    from flydsl_core.cli import target_name

    name, spelled = pair
    want = get_target(name).name
    assert get_target(spelled).name == want
    assert target_name(spelled) == want
    monkeypatch.setenv("FLYDSL_TARGET", spelled)
    assert resolve_target().name == want
    if want == "cpu-reference":
        ck = _copy.compile(torch.zeros(8), torch.zeros(8), 8, BLOCK=8, target=spelled)
        assert ck.target == want


@ROBUST
# what an environment variable can hold: UTF-8 text without NUL (os.environ raises on a NUL or a
# lone surrogate before FlyDSL sees it)
@given(
    word=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8)
)
def test_unknown_target_names_are_a_clear_error(monkeypatch, word):
    known = {k.strip().lower() for t in all_targets() for k in (t.name, *t.aliases)}
    if word.strip().lower().replace("_", "-").split(":")[0] in known or not word.strip():
        return
    got = outcome(get_target, word)
    assert isinstance(got.error, UnknownTargetError) and "known targets: gfx950" in str(got.error)
    monkeypatch.setenv("FLYDSL_TARGET", word)
    got = outcome(resolve_target)
    assert isinstance(got.error, UnknownTargetError) and "FLYDSL_TARGET" in str(got.error)


# -- early exits: break / continue / return inside structured regions --------------------------

REGIONS = {
    "range": "for i in fly.range(0, x.shape[0]):",
    "while": "for _ in fly.while_(lambda: c < x.shape[0]):",
    "if": "with fly.if_(c < x.shape[0]):",
}


@ROBUST
@given(
    region=st.sampled_from(sorted(REGIONS)),
    stmt=st.sampled_from(["break", "continue", "return"]),
    in_python_loop=st.booleans(),
    guarded=st.booleans(),
)
def test_early_exits_are_reported_at_their_line(tmp_path_factory, region, stmt, in_python_loop,
                                                guarded):  # fmt: skip
    """A generated kernel with an exit inside a region: a ControlFlowError at the exit's own
    line, unless the exit belongs to a Python loop nested inside the region."""
    if region == "if" and stmt in ("break", "continue") and not in_python_loop:
        in_python_loop = True  # a bare break/continue outside any loop is a SyntaxError
    lines = [
        "import flydsl_core as fly",
        "",
        "@fly.kernel",
        "def k(x: fly.Tensor, out: fly.Tensor):",
        "    c = fly.zeros((), fly.int32)",
        "    acc = fly.zeros((), fly.fp32)",
        f"    {REGIONS[region]}",
        "        c += 1",
        "        acc += x[0].load()",
    ]
    indent = "        "
    if in_python_loop:
        lines.append(indent + "for j in fly.static_range(2):")
        indent += "    "
    if guarded:
        lines.append(indent + "if True:")
        indent += "    "
    lines.append(indent + stmt)
    exit_line = len(lines)
    lines.append("    out[0].store(acc)")
    path = tmp_path_factory.mktemp("gen") / "generated_kernel.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(f"gen_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = outcome(mod.k[(1,)], torch.ones(3), torch.zeros(1), target="cpu-reference")
    leaves = stmt == "return" or not in_python_loop
    event("leaves the region" if leaves else "stays inside")
    if leaves:
        assert isinstance(got.error, ControlFlowError), got.error
        assert got.error.loc.file == str(path) and got.error.loc.line == exit_line
        assert got.error.loc.text.strip() == stmt
    else:
        assert got.ok, got.error
