"""Compile generated Triton source with ``triton.compile`` and keep every stage.

The source is written to a real file (Triton reads kernels back with
``inspect.getsource``) under ``<cache dir>/triton_src`` and imported as its own
module, named after its content hash. ``triton.compile(ASTSource(...),
target=GPUTarget, options=...)`` then runs on any machine, GPU or not: the
executable holds the Triton source, Triton's ``CompiledKernel`` (TTIR, TTGIR,
LLVM IR, AMDGCN or PTX, and the HSACO or CUBIN), and a ``ResourceReport``.

Divisibility facts become Triton's own specialization attributes on the
signature: ``tt.divisibility = 16`` for aligned tensors and for sizes and
strides known to be multiples of 16. On AMD targets a tensor whose offsets
are int32 (``index_bits == 32``) also gets ``tt.pointer_range = 32``, which is
what lets Triton use buffer loads and stores; as in Triton's own launcher,
that promise is checked at launch (storage of at most 2**31 - 1 bytes), and a
launch that breaks it uses a second compile without the attribute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from ...exc import CompileError
from ...ir.core import Function
from ...settings import default_cache_dir
from ...targets import Target
from .. import Backend, Executable
from . import stage_hook
from .codegen import GeneratedKernel, generate
from .direct_lds import DIRECT_LDS
from .rules.elementwise import RESCALE_ASM_GUARD
from .shared_operands import SHARE_TRANSPOSED
from .signature import make_extractor

#: options every GPU target takes (defaults where FlyDSL's differ from Triton's)
AMD_DEFAULTS = {"num_warps": 4, "num_stages": 2}
NVIDIA_DEFAULTS = {"num_warps": 4, "num_stages": 3}
#: option fields that describe the target, not the compile: never taken from the user
_INTERNAL = {"arch", "backend_name", "warp_size", "extern_libs", "supported_fp8_dtypes"}
#: AMD options of FlyDSL's own, applied around Triton's compile (``stage_hook``): ``hoist_rsrc``
#: builds each buffer descriptor that loads of several loops share once at the kernel's entry
#: (``llir.hoist_buffer_rsrc``); ``share_transposed_operands`` stages a tile two matrix
#: products read, one transposed, through LDS once (``shared_operands``); ``buffer_soffset``
#: reads a based buffer load through its argument's descriptor with the origin as the scalar
#: offset (``llir.buffer_soffset``); ``split_buffer_offsets`` gives a loop's buffer loads the
#: uniform part of their offsets as the scalar offset (``llir.split_buffer_offsets``);
#: ``direct_lds`` loads a gfx950 matrix operand's tile straight into LDS (``direct_lds``)
FLY_AMD_OPTIONS = stage_hook.REWRITES

log = logging.getLogger(__name__)

_modules: dict[str, Any] = {}
_modules_lock = threading.Lock()


# -- source files ---------------------------------------------------------------------------------


def _source_dir() -> Path:
    for base in (
        default_cache_dir() / "triton_src",
        Path(tempfile.gettempdir()) / "flydsl-triton_src",
    ):
        try:
            base.mkdir(parents=True, exist_ok=True)
            if os.access(base, os.W_OK):
                return base
        except OSError:
            continue
    raise CompileError(
        "no writable directory for generated Triton source (tried the cache dir and the temp dir)"
    )


def write_source(gen: GeneratedKernel) -> Path:
    """Write the generated module to ``<cache>/triton_src/<kernel>_<hash>.py`` (once per content)."""
    digest = hashlib.sha256(gen.source.encode()).hexdigest()[:20]
    path = _source_dir() / f"{gen.name}_{digest}.py"
    if not path.exists() or path.read_text() != gen.source:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
        with os.fdopen(fd, "w") as f:
            f.write(gen.source)
        os.replace(tmp, path)
    return path


def import_source(path: Path):
    """Import a generated module from its file (one module per file per process)."""
    key = str(path)
    with _modules_lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod
        name = f"_flydsl_triton_src.{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise CompileError(f"cannot import generated Triton source {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            sys.modules.pop(name, None)
            raise CompileError(f"the generated Triton source {path} does not import: {e}") from e
        _modules[key] = mod
        return mod


# -- options ------------------------------------------------------------------------------------------


@functools.cache
def _triton_backend(target: Target):
    from triton.compiler.compiler import make_backend

    return make_backend(target.triton_target())


def _option_fields(target: Target) -> set[str]:
    if target.is_amd:
        from triton.backends.amd.compiler import HIPOptions as opts
    else:
        from triton.backends.nvidia.compiler import CUDAOptions as opts
    own = FLY_AMD_OPTIONS if target.is_amd else frozenset()
    return ({f.name for f in dataclasses.fields(opts)} - _INTERNAL) | own


def triton_options(target: Target, options: dict | None) -> dict[str, Any]:
    """FlyDSL launch options -> Triton's options for ``target``.

    ``num_warps`` / ``num_stages`` default to 4 / 2 on AMD and 4 / 3 on sm90;
    AMD's ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack`` and
    ``schedule_hint`` (and any other field of Triton 3.9's ``HIPOptions`` /
    ``CUDAOptions``) pass through, and on AMD FlyDSL's own ``FLY_AMD_OPTIONS``: the
    rewrites of Triton's intermediate code ``stage_hook`` runs, never given to Triton. An
    unknown option is an error.
    """
    out = dict(AMD_DEFAULTS if target.is_amd else NVIDIA_DEFAULTS)
    known = _option_fields(target)
    bad = []
    for k, v in (options or {}).items():
        if v is None:
            continue
        if k not in known:
            bad.append(k)
            continue
        if k == stage_hook.HOIST_RSRC and v and v not in stage_hook.HOIST_VALUES:
            raise CompileError(f"hoist_rsrc takes True or 'all' (or False), got {v!r}")
        out[k] = v
    if bad:
        raise CompileError(
            f"unknown option(s) {sorted(bad)} for target {target.name}; Triton 3.9 takes: {', '.join(sorted(known))}"
        )
    return out


def dot_precisions(target: Target) -> tuple[str, ...]:
    """The ``tl.dot`` input precisions Triton allows on ``target``."""
    return tuple(_triton_backend(target).parse_options({}).allowed_dot_input_precisions)


# -- compile -----------------------------------------------------------------------------------------


def _compile_error(gen: GeneratedKernel, path: Path, target: Target, e: Exception) -> CompileError:
    # Triton's message quotes the failing line of the generated source, whose
    # trailing "# kernel.py:LINE" comment names the user's line.
    text = str(e).strip()
    return CompileError(
        f"Triton could not compile kernel {gen.name!r} for {target.name}: {type(e).__name__}: {text}\n"
        f"    generated source: {path}"
    )


def ast_source(jitfn, gen: GeneratedKernel, *, pointer_range: bool = True):
    from triton.compiler import ASTSource

    return ASTSource(
        fn=jitfn,
        signature=gen.signature,
        constexprs={},
        attrs=gen.attrs(pointer_range=pointer_range),
    )


def triton_compile(
    jitfn, gen: GeneratedKernel, target: Target, options: dict, *, pointer_range: bool = True
):
    import triton

    src = ast_source(jitfn, gen, pointer_range=pointer_range)
    opts = dict(options)
    chosen = {n: opts.pop(n) for n in FLY_AMD_OPTIONS if opts.get(n)} if target.is_amd else {}
    try:
        with stage_hook.rewrites(chosen):
            return triton.compile(src, target=target.triton_target(), options=opts)
    except Exception as e:
        ttgir = [n for n in (SHARE_TRANSPOSED, DIRECT_LDS) if n in chosen]
        if not ttgir:
            raise
        # a rewritten TTGIR a later stage rejects: Triton's own staging
        log.warning("TTGIR rewrites %s: compile failed (%s); compiling without", ttgir, e)
    for n in ttgir:
        chosen.pop(n)
    with stage_hook.rewrites(chosen):
        return triton.compile(src, target=target.triton_target(), options=opts)


#: prefix of the files in a stored executable that are Triton's own metadata group
_TRITON_FILE = "triton-"


def executable_files(exe: TritonExecutable) -> dict[str, bytes]:
    """Everything needed to rebuild ``exe`` without compiling: for the disk cache and AOT bundles."""
    import pickle

    files = {
        "generated.pkl": pickle.dumps((exe.generated, exe.options)),
        "report.json": exe.report.to_json() if hasattr(exe.report, "to_json") else "{}",
    }
    for name, path in exe.compiled.metadata_group.items():
        files[_TRITON_FILE + name] = Path(path).read_bytes()
    files["hash.txt"] = exe.compiled.hash
    return files


def _compiled_kernel(src, group: dict[str, str], digest: str):
    """Triton's ``CompiledKernel`` from stored files. Built so that a failure inside its
    constructor (a corrupt stored file) leaves an object whose ``__del__`` has nothing to
    do: Triton's would otherwise print ``Exception ignored in CompiledKernel.__del__``."""
    from triton.compiler.compiler import CompiledKernel

    ck = CompiledKernel.__new__(CompiledKernel)
    ck.module = None
    ck.__init__(src, group, digest)
    return ck


def load_executable(directory: Path, target: Target) -> TritonExecutable:
    """A ``TritonExecutable`` from ``executable_files`` written into ``directory``; no compile."""
    import pickle

    gen, options = pickle.loads((directory / "generated.pkl").read_bytes())
    path = write_source(gen)
    jitfn = getattr(import_source(path), gen.name)
    group = {
        p.name[len(_TRITON_FILE) :]: str(p)
        for p in directory.iterdir()
        if p.name.startswith(_TRITON_FILE)
    }
    compiled = _compiled_kernel(ast_source(jitfn, gen), group, (directory / "hash.txt").read_text())
    return TritonExecutable(gen, path, target, options, jitfn, compiled)


class TritonBackend(Backend):
    """Compiles FlyIR for one target through Triton: GPU targets with ``triton.compile``
    (cross-compiling works without a GPU), ``cpu-interpret`` for Triton's interpreter."""

    @property
    def stores(self) -> bool:
        return self.target.is_gpu

    def serialize(self, exe: TritonExecutable) -> dict[str, bytes]:
        return executable_files(exe)

    def deserialize(self, directory: Path) -> TritonExecutable:
        return load_executable(directory, self.target)

    def generate(
        self, fn: Function, num_warps: int | None = None, skip_asm: bool = True
    ) -> GeneratedKernel:
        """The Triton source this backend would compile (no compile); ``num_warps``: the
        launch's, where the source is for one compile (``Lowering.num_warps``)."""
        target = self.target
        if not target.is_gpu:
            return generate(fn, target)
        return generate(
            fn,
            target,
            dot_precisions=dot_precisions(target),
            num_warps=num_warps,
            skip_asm=skip_asm,
        )

    @property
    def generates_source(self) -> bool:
        return True

    def source_function(self, fn: Function):
        """``(jit_function, GeneratedKernel)``: the ``@triton.jit`` function of ``fn``'s
        generated source, written and imported, not compiled."""
        gen = self.generate(fn)
        return getattr(import_source(write_source(gen)), gen.name), gen

    def source_arguments(self, generated: GeneratedKernel, values: tuple) -> tuple:
        """The ``@triton.jit`` function's arguments, read from the launch's run-time values as
        the launcher reads them (``GeneratedKernel.params``)."""
        return make_extractor(generated.params, generated.nargs)(values)

    def compile_options(self, options: dict) -> dict:
        """``triton_options`` on GPU targets (the defaults, an unknown option an error); the
        interpreter takes ``num_warps`` / ``num_stages`` only and ignores them (4 / 2 when
        not given, AMD's defaults)."""
        if self.target.is_gpu:
            return triton_options(self.target, options)
        given = {k: v for k, v in (options or {}).items() if v is not None}
        extra = sorted(set(given) - {"num_warps", "num_stages"})
        if extra:
            raise CompileError(
                f"target {self.target.name} takes no options besides num_warps/num_stages, "
                f"got {extra}"
            )
        return {**AMD_DEFAULTS, **given}

    def compile(self, fn: Function, spec=None, options: dict | None = None):
        from .launcher import InterpretedExecutable

        target = self.target
        if not target.is_gpu:
            if options:
                extra = sorted(
                    k
                    for k, v in options.items()
                    if v is not None and k not in ("num_warps", "num_stages")
                )
                if extra:
                    raise CompileError(
                        f"target {target.name} takes no options besides num_warps/num_stages, got {extra}"
                    )
            gen = self.generate(fn)
            path = write_source(gen)
            return InterpretedExecutable(gen, path, import_source(path))
        opts = triton_options(target, options)
        gen = self.generate(fn, opts["num_warps"])
        path = write_source(gen)
        jitfn = getattr(import_source(path), gen.name)
        guarded = RESCALE_ASM_GUARD in gen.source
        said = b""
        try:
            with _stderr_kept(guarded) as said_:
                try:
                    compiled = triton_compile(jitfn, gen, target, opts)
                finally:
                    said = said_()
        except Exception as e:
            if not (guarded and RESCALE_ASM_GUARD.encode() in said):
                _replay(said)
                raise _compile_error(gen, path, target, e) from e
            # a rescale asm block's register guard stopped the assembler (its messages are
            # dropped): compile again with plain multiplies
            log.info(
                "%s: rescale's skipping asm did not fit the registers; plain multiplies", gen.name
            )
            gen = self.generate(fn, opts["num_warps"], skip_asm=False)
            path = write_source(gen)
            jitfn = getattr(import_source(path), gen.name)
            try:
                compiled = triton_compile(jitfn, gen, target, opts)
            except Exception as e2:
                raise _compile_error(gen, path, target, e2) from e2
        else:
            _replay(said)
        return TritonExecutable(gen, path, target, opts, jitfn, compiled)


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _stderr_kept(keep: bool):
    """While ``keep``: file descriptor 2 (where LLVM's assembler prints) goes to a temporary
    file; yields a function returning what was written. The caller replays it (``_replay``)
    unless it was the rescale guard's expected error. Otherwise a no-op."""
    if not keep:
        yield lambda: b""
        return
    # one at a time: two threads swapping the same descriptor could restore each other's file
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)

        def read() -> bytes:
            sys.stderr.flush()
            tmp.seek(0)
            return tmp.read()

        try:
            yield read
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _replay(text: bytes) -> None:
    if text:
        os.write(2, text)


class TritonExecutable(Executable):
    """One kernel compiled for one GPU target: every stage, the resource report and the launcher."""

    def __init__(
        self, gen: GeneratedKernel, path: Path, target: Target, options: dict, jitfn, compiled
    ):
        from .launcher import GpuLauncher

        self.generated = gen
        self.name = gen.name
        self.source = gen.source
        self.source_path = path
        self.target = target
        self.options = dict(options)
        self.jit_function = jitfn
        self.compiled = compiled
        self._report = None
        self._fallback = None
        self._lock = threading.Lock()
        self._launcher = GpuLauncher(self)

    def describe(self) -> dict[str, Any]:
        md = self.compiled.metadata
        return {
            "num_warps": md.num_warps,
            "shared": md.shared,
            "name": md.name,
            "options": dict(self.options),
        }

    @property
    def report(self):
        """The ``ResourceReport`` of the compiled kernel (registers, scratch, instruction mix)."""
        if self._report is None:
            from .report import report_from_triton

            self._report = report_from_triton(self.compiled, self.target)
        return self._report

    def stages(self) -> dict[str, Any]:
        """``{"triton": source, "ttir", "ttgir", "llir", "amdgcn" | "ptx", "hsaco" | "cubin"}``."""
        out: dict[str, Any] = {"triton": self.source}
        asm = self.compiled.asm
        for k in ("ttir", "ttgir", "llir", "amdgcn", "ptx", "hsaco", "cubin"):
            if k in asm:
                out[k] = asm[k]
        return out

    def without_pointer_range(self):
        """The compiled kernel without ``tt.pointer_range`` (for tensors over 2 GiB), compiled once."""
        with self._lock:
            if self._fallback is None:
                try:
                    self._fallback = triton_compile(
                        self.jit_function,
                        self.generated,
                        self.target,
                        self.options,
                        pointer_range=False,
                    )
                except Exception as e:
                    raise _compile_error(self.generated, self.source_path, self.target, e) from e
            return self._fallback

    def launch(self, grid, args):
        self._launcher(grid, args)

    def __repr__(self) -> str:
        return f"<TritonExecutable {self.name} for {self.target.name}>"


with contextlib.suppress(Exception):  # the lazily imported part of Gluon must see real JITFunctions
    import triton.experimental.gluon  # noqa: F401
