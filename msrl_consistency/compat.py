"""The one home of MindSpore version quirks (measured on 2.10; the API moved a lot since 2.3).

Everything else imports MindSpore settings through these helpers, so a new MindSpore release
means editing this file only.

Numerics to know (not worked around, accounted for in the tolerances of ``inference.compare.judge.stats``): MindSpore's
CPU ``Tanh`` (and Lite's, the same kernel library) is an approximation, |error| up to 1.0e-4 near |x| = 5 against
the exact value (measured on 2e5 points in [-12, 12], PyNative and graph mode alike); ONNX Runtime's is exact.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from inference.errors import INTERRUPTS

# Silence WARNING-level glog lines (e.g. nn.Adam's FusedSparseAdam deprecation) before the import.
os.environ.setdefault("GLOG_v", "3")
# A graph that fails to compile (or a compile interrupted by Ctrl-C) makes MindSpore write ``rank_0/om/analyze_fail.ir``
# under MS_OM_PATH, by default the working directory: a user's checkout collects them. They go to one directory of
# this user's in the temporary directory instead (MindSpore's message names the file); MS_OM_PATH set by the user
# wins.
os.environ.setdefault("MS_OM_PATH", os.path.join(tempfile.gettempdir(), f"msrl-consistency-{os.getuid()}"))

# MindSpore's import (~1 s) runs module code while its C++ runtime starts. A KeyboardInterrupt raised in the middle
# leaves the package half-initialised, and at exit MindSpore's C++ exit hook imports parts of it again, fails, and
# aborts the interpreter ("Fatal Python error: PyThreadState_Get: ... the GIL is released", exit -6). So a Ctrl-C
# or SIGTERM (the CLIs' handler, ``inference.errors.Interrupts``) arriving during the import is only noted, and
# raised once the import is complete: exit 130 with the usual line. The CLIs import this module before any other
# module imports MindSpore.
#
# The garbage collector: the import creates ~160k long-lived objects and little garbage, yet triggers ~370 collections
# that walk them (~0.4 s of a CLI's start); so it runs with collection paused. At exit the interpreter collects
# again over everything still alive (0.3-0.5 s more); ``_skip_exit_collections``
# freezes those objects after every other exit handler has run, so the process ends as soon as its files are
# flushed. Nothing is lost: module teardown and ``__del__`` still run by reference counting; only cyclic garbage
# left at exit is not walked, and the OS reclaims it with the process.
_gc_was_enabled = gc.isenabled()
gc.disable()
try:
    with INTERRUPTS.deferred():
        import mindspore as ms
        from mindspore import nn
        from mindspore.graph import api as _graph_api  # private: the compiled-call fast path below
finally:
    if _gc_was_enabled:
        gc.enable()
INTERRUPTS.check()


@atexit.register  # registered before the caller's own handlers, so it runs after them (atexit is last in, first out)
def _skip_exit_collections() -> None:
    gc.freeze()

DEVICES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
_configured: dict[str, object] = {}


def mindspore_version() -> str:
    return ms.__version__


def set_device(device: str = "cpu", device_id: int = 0) -> None:
    """Select the device once per process (``ms.set_device``; ``set_context(device_target=)`` is deprecated).

    Raises ``ValueError`` with a readable reason when the device is not available here.
    """
    target = check_device(device)
    if _configured.get("device") == (target, device_id):
        return
    if target == "CPU":
        gemm_convolutions()
    if "device" in _configured:
        raise ValueError(f"device already set to {_configured['device']}; one device per process")
    try:
        ms.set_device(target, device_id)
    except RuntimeError:
        # The caller ran a kernel first (a library user who loads and runs a policy, then exports it): MindSpore
        # then keeps the device it started on, which is fine when it is the one asked for.
        if ms.get_context("device_target") != target:
            raise ValueError(f"MindSpore already runs on {ms.get_context('device_target')}, not {device!r}: select the "
                             "device before running any Cell") from None  # fmt: skip
    _configured["device"] = (target, device_id)


# oneDNN 3.10 (MindSpore 2.10's CPU convolutions) on a CPU with AVX-512 runs MindSpore's plain NCHW convolutions
# through ``jit_uni_ncsp:conv+ref``, a reference inner loop: 30 ms per 84x84x4 frame for an Atari torso's first
# convolution, where its GEMM path (``gemm:jit``, chosen up to AVX2) takes 0.7 ms (measured on a 2-core Xeon with
# AVX-512/AMX; an MLP's speed is unchanged). A user's own ONEDNN_MAX_CPU_ISA is kept.
ONEDNN_ISA = "AVX2"


def gemm_convolutions() -> None:
    """Cap oneDNN's instruction set at AVX2 (its GEMM convolutions) before its first kernel reads it."""
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA)


def check_device(device: str) -> str:
    """MindSpore's name for ``device`` if this build can use it, else ``ValueError`` (nothing is initialised)."""
    key = device.lower()
    if key not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    target = DEVICES[key]
    if not ms.hal.is_available(target):
        raise ValueError(
            f"device {device!r} is not available in this MindSpore build ({mindspore_version()}); "
            "install the matching MindSpore package or use --device cpu"
        )
    return target


def select_device(device: str = "cpu", device_id: int = 0) -> str | None:
    """``set_device`` before any kernel runs (MindSpore refuses it afterwards); returns why not instead of raising,
    so that a missing backend is reported by the runtimes that need it (unavailable, exit 3)."""
    try:
        set_device(device, device_id)
    except ValueError as exc:
        return str(exc)
    return None


def set_threads(num_threads: int) -> None:
    """Pin CPU op threads; MindSpore lets this be set only once per process, so later calls are ignored."""
    if "threads" in _configured or num_threads <= 0:
        return
    ms.device_context.cpu.op_tuning.threads_num(num_threads)
    _configured["threads"] = num_threads


# -- data parallel across processes (msrun, MindSpore's collectives) ----------------------------------------
# msrun starts one scheduler and N workers, all running the same command, and tells each its role through
# the environment (measured on 2.10: MS_ROLE, MS_WORKER_NUM, MS_SCHED_HOST/PORT, MS_NODE_ID, RANK_ID,
# DEVICE_ID = the local rank). The collective backend follows the device: mccl on CPU, nccl on GPU, hccl on
# Ascend; the same code path runs on all three.
ROLE_ENV, SCHEDULER_ROLE, WORKER_ROLE = "MS_ROLE", "MS_SCHED", "MS_WORKER"
# What the `msrun` script runs. It parses its own options anywhere on its command line, abbreviations included:
# a rank's flag must not be a prefix of one of msrun's (e.g. "--worker" is taken for "--worker_num"; tested).
MSRUN_MODULE = "mindspore.parallel.cluster.run"
ALLREDUCE_FUSION_MB = 64  # one fused AllReduce for these small MLPs: 4.4 → 1.7-2.4 ms per update, 2 workers
# msrun's log line when it sees a worker fail (it then SIGKILLs the others), e.g.
# "Worker process 1234 exit with exception. Error code: -9."
_MSRUN_FAILED = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")


# Ranks retry joining the scheduler every 3-5 s by default (measured: a 2-rank join took 5-8 s); on one machine
# a 1-2 s retry interval forms the cluster 2-4 s sooner.
FAST_JOIN_ENV = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "2"}


def cluster_role() -> str | None:
    """``MS_SCHED`` or ``MS_WORKER`` when this process was started by msrun, else ``None``."""
    return os.environ.get(ROLE_ENV) or None


def cluster_env() -> dict[str, str]:
    """What msrun told this process: scheduler address and port, world size, node id, local rank."""
    keys = {"MS_SCHED_HOST": "master_addr", "MS_SCHED_PORT": "master_port", "MS_WORKER_NUM": "world_size",
            "MS_NODE_ID": "node_id", "DEVICE_ID": "local_rank", "RANK_ID": "rank_id"}  # fmt: skip
    return {name: os.environ[key] for key, name in keys.items() if key in os.environ}


def collective_backend(device: str) -> str:
    """The collective library MindSpore uses for ``device``."""
    return {"cpu": "mccl", "gpu": "nccl", "ascend": "hccl"}[device.lower()]


def init_collective() -> tuple[int, int]:
    """Join the msrun cluster; returns ``(rank, world_size)``.

    Call ``set_device`` first (the backend follows the device). In the scheduler role this call runs the
    scheduler until every worker has finished and then ends the process; when a worker vanishes it raises
    ``RuntimeError`` naming the node that timed out.
    """
    from mindspore.communication import get_group_size, get_rank, init

    init()
    return get_rank(), get_group_size()


def configure_data_parallel() -> None:
    """Data parallel with mean gradients and fused AllReduce (one collective per update, not one per tensor)."""
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.DATA_PARALLEL,
        gradients_mean=True,
        comm_fusion={"allreduce": {"mode": "size", "config": ALLREDUCE_FUSION_MB}},
    )


def grad_reducer(parameters: list[ms.Parameter], world_size: int) -> nn.Cell:
    """Averages gradients over all ranks inside the compiled train step (AllReduce, fused)."""
    return nn.DistributedGradReducer(parameters, mean=True, degree=world_size)


def all_gather_int32(values: np.ndarray) -> np.ndarray:
    """AllGather a 1-D int32 array of the same length on every rank: ``[world_size, len]`` in rank order.

    Runs eagerly (a new length is not a new graph compile). On the CPU backend AllGather takes int32 and
    float, not uint8, and AllReduce takes float only: byte payloads travel as int32 words.
    """
    from mindspore import ops

    out = ops.AllGather()(ms.Tensor(np.ascontiguousarray(values, np.int32))).asnumpy()
    return out.reshape(-1, len(values))


def msrun_first_failure(log_text: str) -> tuple[int, int] | None:
    """``(pid, exit code)`` of the first worker msrun saw fail, from msrun's own log (negative: a signal)."""
    match = _MSRUN_FAILED.search(log_text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_compute_dtype(dtype_name: str) -> None:
    """Compile and run a tiny dense layer forward and backward in ``dtype_name`` on the current device.

    Raises ``ValueError`` with MindSpore's reason when the backend has no kernel for it (CPU: no bfloat16
    Dense/MatMul in 2.10), so a run fails before training instead of at its first update.
    """
    from mindspore import ops

    dtype = {"fp16": ms.float16, "bf16": ms.bfloat16}[dtype_name]

    def loss(w: ms.Tensor, x: ms.Tensor) -> ms.Tensor:
        return ops.tanh(ops.dense(x.astype(dtype), w.astype(dtype))).astype(ms.float32).sum()

    w, x = ms.Tensor(np.ones((2, 2), np.float32)), ms.Tensor(np.ones((2, 2), np.float32))
    try:
        with execution_mode(graph=False):
            ms.grad(loss)(w, x).asnumpy()
    except (RuntimeError, TypeError, ValueError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if "nsupported" in line), "no kernel")
        device = ms.get_context("device_target")
        raise ValueError(
            f"--update-precision {dtype_name} is not supported by MindSpore {mindspore_version()} on {device}: {reason}"
        ) from None


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


def set_seed(seed: int) -> None:
    """Seed MindSpore's global RNG: used only by weight initialisers (all sampling noise comes from the host)."""
    ms.set_seed(seed)


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


def layers_to_float16(cell: nn.Cell, own_parameters: bool = False) -> nn.Cell:
    """Every sub-Cell of ``cell`` computes in fp16; ``cell``'s own ``construct`` and methods do not.

    ``to_float`` on ``cell`` itself would, in graph mode, also cast the ops of its methods (the sampling noise's
    transform among them) to fp16: measured, an fp16 graph then drew infinite Gumbel samples where PyNative did not.
    ``own_parameters``: ``cell``'s own Parameters become fp16 too, for a ``construct`` that combines them with fp16
    layer outputs in ops that take one dtype (an old-style actor's ``BiasAdd(zeros_like(mean), sigma_bias)``).
    """
    from mindspore.nn.layer.rnn_cells import RNNCellBase

    for _, sub in cell.cells_and_names():
        if sub is not cell:
            sub.to_float(ms.float16)
            if isinstance(sub, RNNCellBase):  # GRUCell/LSTMCell/RNNCell multiply their raw weights (no cast of their
                for param in sub.get_parameters(expand=False):  # own): fp16 inputs need fp16 weights
                    param.set_dtype(ms.float16)
    if own_parameters:
        for param in cell.get_parameters(expand=False):
            param.set_dtype(ms.float16)
    return cell


def ms_dtype(dtype: np.dtype) -> Any:
    """MindSpore's dtype for a NumPy one (``mindspore.uint8`` for ``uint8``...)."""
    from mindspore.common import dtype as mstype

    return mstype.pytype_to_dtype(np.dtype(dtype).type)


def as_tuple(outputs: Any) -> tuple[Any, ...]:
    """A Cell's outputs as a flat tuple: a single-output Cell (or GraphCell) returns a bare Tensor; a nested tuple
    (XuanCe's DRQN returns ``(..., (h, c))``) is flattened in order; ``None`` entries (tianshou's ``(logits, None)``
    for "no state") are not outputs."""
    if not isinstance(outputs, tuple | list):
        return (outputs,)
    return tuple(o for out in outputs for o in as_tuple(out) if o is not None)


def wrapped(make: Any, inner: nn.Cell, *args: Any) -> nn.Cell:
    """``make(inner, *args)``, a Cell holding ``inner``, with ``inner``'s Parameters keeping their names: a built
    Cell assigned to another renames its Parameters (``inner.fc.weight``), which would rename the caller's own Cell
    object and every name its checkpoint, MindIR and ONNX carry."""
    names = [(p, p.name) for p in inner.get_parameters()]
    cell = make(inner, *args)
    for param, name in names:
        param.name = name
    return cell


class NoneDropped(nn.Cell):
    """``inner``'s outputs flat and without ``None`` entries: neither MindIR nor ONNX export can write a ``None``
    output ("Out of the size of the tuple", "Unsupported network output type None")."""

    def __init__(self, inner: nn.Cell) -> None:
        super().__init__()
        self.inner = inner

    def construct(self, *inputs: Any) -> Any:
        outs = self.inner(*inputs)
        kept = ()
        for out in outs:  # unrolled at compile time; a None entry is a constant
            if isinstance(out, tuple):  # one level of nesting: (q, (h, c))
                for inner in out:
                    if inner is not None:
                        kept = kept + (inner,)
            elif out is not None:
                kept = kept + (out,)
        return kept


# How MindSpore says an op has no kernel on the device it runs on (a Cell that cannot run here, whatever its inputs)
_NO_KERNEL = (re.compile(r"Unsupported op \[(\w+)\] on"), re.compile(r"'(\w+)' is not supported on this device"),
              re.compile(r"()Kernel select failed"))  # fmt: skip


def no_kernel_here(exc: BaseException) -> str | None:
    """The op MindSpore has no kernel for on this device, from its error (None: another error)."""
    for pattern in _NO_KERNEL:
        found = pattern.search(str(exc))
        if found is not None:
            return found.group(1) or "an op"
    return None


def exportable(cell: nn.Cell, examples: list[Any]) -> nn.Cell:
    """``cell``, or a ``NoneDropped`` wrapper of it when it returns ``None`` entries or nested tuples (run once on
    ``examples``)."""
    with execution_mode(graph=False):
        outs = cell(*examples)
    if isinstance(outs, tuple | list) and any(o is None or isinstance(o, tuple | list) for o in outs):
        return wrapped(NoneDropped, cell)
    return cell


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


# -- the ONNX exporter's gaps ----------------------------------------------------------------------------------
# MindSpore 2.10's ONNX exporter has no ``Erf`` and no ``Elu``: exact GELU (``nn.GELU(approximate=False)``,
# ``ops.gelu(x, 'none')``), ``ops.erf`` and ``nn.ELU`` (Dreamer's actor) fail to export, although ONNX, ONNX Runtime
# and Lite all have the ops. ``onnx_ops_marked`` has them compute a ``Clip`` with bounds no policy uses instead (an
# op the exporter writes and never folds into its neighbours, as it folds a ``Mul`` by a constant), one pair of
# bounds per op; ``onnx_patterns.restore_marked`` turns each such ``Clip`` back into the op. Only the ONNX export
# sees the markers; the Cell computes the real functions. (MindSpore's CPU ``Elu`` only takes ``alpha = 1``.)
def _float32(bits: int) -> float:
    return float(np.frombuffer(np.uint32(bits).tobytes(), np.float32)[0])


ONNX_MARKERS = {"Erf": (_float32(0xFF1E2F3B), _float32(0x7F1E2F3B)),
                "Elu": (_float32(0xFF1E2F3C), _float32(0x7F1E2F3C))}
# Ops the exporter refuses, with what to write instead (shown when an ONNX export fails on one of them).
ONNX_EXPORT_HINTS = {
    "Erf": "ops.erf / exact GELU reached through a Primitive created in __init__ (ops.Erf()) cannot be exported; "
           "call ops.erf, ops.gelu(x, approximate='none') or nn.GELU(approximate=False) in construct, which export "
           "writes as ONNX Erf",
    "Elu": "an ops.Elu() Primitive cannot be exported; nn.ELU() (and nn.Dense(..., activation=nn.ELU())) export as "
           "ONNX Elu",
    "GeluExt": "mint's GELU (mint.nn.GELU, mint.nn.functional.gelu) has no ONNX export in MindSpore; use "
               "nn.GELU(approximate=False) (exact) or nn.GELU() (tanh), which export handles",
}  # fmt: skip
_ERF_LOW, _ERF_HIGH = ONNX_MARKERS["Erf"]
_ELU_LOW, _ELU_HIGH = ONNX_MARKERS["Elu"]


def _erf_marked(x: Any) -> Any:
    return ms.ops.clamp(x, _ERF_LOW, _ERF_HIGH)


def _elu_marked(self: Any, x: Any) -> Any:
    return ms.ops.clamp(x, _ELU_LOW, _ELU_HIGH)


@contextlib.contextmanager
def onnx_ops_marked() -> Iterator[None]:
    """``erf`` and ``nn.ELU`` as their marker ``Clip`` for the graphs compiled in the block (ONNX export only)."""
    from mindspore.ops.auto_generate import gen_ops_def
    from mindspore.ops.function import nn_func

    # ``ops.gelu`` calls ``nn_func.erf_``; ``ops.erf`` and ``mint.erf`` (however imported) call ``gen_ops_def.erf_op``
    targets = [(nn_func, "erf_", _erf_marked), (gen_ops_def, "erf_op", _erf_marked), (nn.ELU, "construct", _elu_marked)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets if hasattr(owner, name)]
    for owner, name, marked in targets:
        if hasattr(owner, name):
            setattr(owner, name, marked)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def onnx_export_hint(message: str) -> str:
    """What to write instead, for an exporter refusal ``Can not find key OP in convert map`` (empty if unknown)."""
    found = re.search(r"Can not find key (\w+) in convert map", message)
    if found:
        return ONNX_EXPORT_HINTS.get(found.group(1), "")
    if "`axis` is out of range" in message:
        return ("MindSpore's ONNX exporter takes no negative axis for some ops (Split: P.Split(-1, 2)); count the axis "
                "from the front (P.Split(1, 2) for the last of two dims)")  # fmt: skip
    return ""
