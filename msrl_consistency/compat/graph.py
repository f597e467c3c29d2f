"""Graph mode and compiling: execution modes, the compile cache, graph-kernel fusion, garbage collection around
compiles, a compile's C++ log, and the compiled-call fast path."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import mindspore as ms
from mindspore import nn
from mindspore.graph import api as _graph_api  # private: the compiled-call fast path


def use_graph_mode() -> None:
    """Compile Cells (GRAPH_MODE): measured ~10x faster than a jit function holding the optimizer."""
    ms.set_context(mode=ms.GRAPH_MODE)


@contextlib.contextmanager
def execution_mode(graph: bool) -> Iterator[None]:
    """Temporarily switch between GRAPH_MODE and PYNATIVE_MODE (the mode is process-global)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=previous)


def compile_cache_blocker() -> str | None:
    """Why MindSpore's compile cache cannot run in this process (``None``: it can). For its dependency hash it parses
    the entry script (``sys.argv[0]`` at import) and raises if that is not a file (``python -c``, pytest-xdist)."""
    entry = _graph_api.entry_script_path
    if entry is not None and not os.path.isfile(entry):
        return f"MindSpore's compile cache needs the entry script as a file, and {entry} is not one"
    return None


def compile_cache_dependencies() -> list[str]:
    """The files MindSpore's compile cache hashes to call a cached graph stale: the entry script and the local (not
    installed) modules it imports. ``[]`` where it cannot tell."""
    try:
        return list(_graph_api._get_compile_cache_dep_files())
    except (OSError, SyntaxError, ValueError, ImportError):
        return []


# -- graph-kernel fusion (AKG) on the CPU --------------------------------------------------------------------
# Measured on 2.10 (bench/results/graph_kernel.md): ``set_context(enable_graph_kernel=True)`` works on the CPU (its
# replacement, jit_level O1, fuses nothing there). Compiling starts AKG's kernel-build server, a Python process that
# imports the ``decorator`` package and links each fused kernel with g++, unless a kernel of that name (a hash of its
# description) is already under the kernel directory: then the compile loads it, and no server starts.
# A reshape to a scalar inside a fused kernel writes an uninitialised shape value into that description, so such a
# kernel gets a new name in every process and is rebuilt (``GaussianPPOHead`` avoids one).
# The server inherits the environment and working directory of the first fused compile: it writes the kernels under
# ``$MS_COMPILER_CACHE_PATH/akg_kernel_meta`` (else ``./``), a ``dsa_transfrom.log`` into its working directory, and
# prints a line for each tiling file outside ``$AKG_WHITE_LIST_PATH`` (else ``./``): its own package's files.
_graph_kernel_dir: str | None = None


def graph_kernel_blocker() -> str | None:
    """Why graph-kernel fusion cannot compile here (``None``: it can)."""
    if shutil.which("g++") is None:
        return "graph-kernel fusion links its kernels with g++, and there is no g++ on PATH"
    try:
        import decorator  # noqa: F401  (AKG's compiler imports it)
    except ImportError:
        return "graph-kernel fusion needs the decorator package (pip install decorator)"
    return None


@contextlib.contextmanager
def graph_kernel_fusion() -> Iterator[None]:
    """Compile the graphs first called inside with graph-kernel fusion; outside, MindSpore compiles as before.

    The kernels go to one private directory per process (or the compile cache's directory if the first fused
    compile ran under it), which is also the build server's working directory; the flag is switched off again so
    that other graphs in the process (evaluation, verify) compile unfused."""
    global _graph_kernel_dir
    if blocker := graph_kernel_blocker():
        raise ValueError(blocker)
    if _graph_kernel_dir is None:
        _graph_kernel_dir = os.environ.get("MS_COMPILER_CACHE_PATH") or tempfile.mkdtemp(prefix="msrl_graph_kernels_")
        if "MS_COMPILER_CACHE_PATH" not in os.environ:
            atexit.register(shutil.rmtree, _graph_kernel_dir, True)
        os.environ.setdefault("AKG_WHITE_LIST_PATH", os.path.dirname(ms.__file__))
    os.makedirs(_graph_kernel_dir, exist_ok=True)  # a user's MS_COMPILER_CACHE_PATH: MindSpore creates it too
    cache_path, cwd = os.environ.get("MS_COMPILER_CACHE_PATH"), os.getcwd()
    os.environ["MS_COMPILER_CACHE_PATH"] = cache_path or _graph_kernel_dir
    os.chdir(_graph_kernel_dir)
    ms.set_context(enable_graph_kernel=True)
    try:
        yield
    finally:
        ms.set_context(enable_graph_kernel=False)
        os.chdir(cwd)
        if cache_path is None:
            os.environ.pop("MS_COMPILER_CACHE_PATH", None)


_gc_frozen_depth = 0


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """Keep the objects alive at the start out of the garbage collector's passes until the block ends.

    MindSpore 2.10 runs a full ``gc.collect()`` before it compiles any graph (``mindspore/graph/api.py``): 0.13 s
    each in a fresh process (~180k objects after the imports), longer in a long-lived one, and a verify compiles
    ~30 graphs. Frozen objects are skipped by those passes, which then only look at what the block created. Nothing
    is lost: cyclic garbage from before the block is freed by the first pass after it, once ``gc.unfreeze`` has
    handed every object back. Nested blocks unfreeze once, at the outermost end; a program that froze objects
    itself keeps them frozen (the block then does nothing).
    """
    global _gc_frozen_depth
    if _gc_frozen_depth == 0 and gc.get_freeze_count():
        yield  # the caller's own gc.freeze(): theirs to undo
        return
    if _gc_frozen_depth == 0:
        gc.freeze()
    _gc_frozen_depth += 1
    try:
        yield
    finally:
        _gc_frozen_depth -= 1
        if _gc_frozen_depth == 0:
            gc.unfreeze()


def set_compile_cache(path: str | None) -> None:
    """Save and load compiled graphs under ``path`` (``None``: stop); the context options ``enable_compile_cache``
    and ``compile_cache_path`` are deprecated for these variables in 2.10.

    Measured on 2.10: the switch is read at every compile, but the path only at the first cached compile of the
    process (later paths are ignored), and the cached graphs of a process are numbered in compile order
    (``compile_cache_<n>.mindir``; uncached compiles take no number)."""
    if path is None:
        os.environ.pop("MS_COMPILER_CACHE_ENABLE", None)
        os.environ.pop("MS_COMPILER_CACHE_PATH", None)
    else:
        os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
        os.environ["MS_COMPILER_CACHE_PATH"] = os.path.abspath(path)  # graph_kernel_fusion changes the cwd


@contextlib.contextmanager
def compile_log_captured() -> Iterator[None]:
    """MindSpore's own stderr kept out of the console for the block (a failed compile logs its C++ stack and the
    Cell's traceback there), so a command can say what failed in one line; replayed under ``MSRL_DEBUG=1``."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if os.environ.get("MSRL_DEBUG"):
                tmp.seek(0)
                sys.stderr.write(tmp.read().decode(errors="replace"))


class CompiledCall:
    """Call a GRAPH_MODE Cell straight through its compiled graph on the hot path.

    ``Cell.__call__`` re-derives the compile key from every argument on each call: measured 0.3-1.2 ms per
    call on MindSpore 2.10's CPU backend, more than a small policy's kernels take. The first call with a
    given argument signature (shapes, dtypes) goes through ``Cell.__call__`` and compiles; later calls with
    that signature hand the arguments to the graph executor the way ``Cell.compile_and_run`` does. Same
    graph, same Parameters, same outputs (tested bitwise); only the Python bookkeeping is skipped.
    """

    def __init__(self, cell: nn.Cell) -> None:
        self.cell = cell
        self._phases: dict[tuple[Any, ...], tuple[str, list[bool], list[bool]]] = {}

    def __call__(self, *args: ms.Tensor) -> Any:
        if not all(isinstance(a, ms.Tensor) for a in args):
            return self.cell(*args)  # the shortcut is keyed on tensor shapes and dtypes only
        signature = tuple((a.shape, a.dtype) for a in args)
        known = self._phases.get(signature)
        if known is None or ms.get_context("mode") != ms.GRAPH_MODE:
            out = self.cell(*args)
            if ms.get_context("mode") == ms.GRAPH_MODE:
                self._phases[signature] = (
                    _graph_api._real_phase(self.cell.phase, self.cell),
                    list(self.cell._has_mutable_args_list or []),
                    list(self.cell.sequence_modified or []),
                )
            return out
        phase, mutable_flags, sequence_modified = known
        executor = _graph_api._cell_graph_executor._graph_executor
        executor.set_jit_config(getattr(self.cell, "jit_config_dict", None) or _graph_api._DEFAULT_JIT_CONFIG)
        run_args = executor.get_args_for_run(self.cell, args, {}, mutable_flags, sequence_modified, False, False)
        return _graph_api._convert_python_data(executor(tuple(run_args), phase))
