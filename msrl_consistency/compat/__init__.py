"""The one home of MindSpore version quirks (measured on 2.10; the API moved a lot since 2.3).

Everything else imports MindSpore settings through these helpers, so a new MindSpore release means editing this
package only: the device, threads, seeds and dtypes (``device``), msrun and collectives (``collective``), graph mode
and compiling (``graph``), Cells as export and the runtimes meet them (``cells``), the ONNX exporter's gaps
(``onnx_export``). This module sets MindSpore's environment and imports it; everything is also reachable as
``compat.<name>``.

Numerics to know (not worked around, accounted for in the tolerances of ``inference.compare.judge.stats``): MindSpore's
CPU ``Tanh`` (and Lite's, the same kernel library) is an approximation, |error| up to 1.0e-4 near |x| = 5 against
the exact value (measured on 2e5 points in [-12, 12], PyNative and graph mode alike); ONNX Runtime's is exact.
"""

from __future__ import annotations

import atexit
import gc
import os
import tempfile

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
        import mindspore  # noqa: F401 - imported here, once, under the deferred interrupts
        from mindspore.graph import api  # noqa: F401 - the compiled-call fast path's private module
finally:
    if _gc_was_enabled:
        gc.enable()
INTERRUPTS.check()


@atexit.register  # registered before the caller's own handlers, so it runs after them (atexit is last in, first out)
def _skip_exit_collections() -> None:
    gc.freeze()


# Every helper by its name (``compat.set_device``), whichever room it lives in.
from msrl_consistency.compat.cells import (  # noqa: E402 - after MindSpore's import above
    NoneDropped,
    as_tuple,
    exportable,
    layers_to_float16,
    ms_dtype,
    no_kernel_here,
    wrapped,
)
from msrl_consistency.compat.collective import (  # noqa: E402 - after MindSpore's import above
    ALLREDUCE_FUSION_MB,
    FAST_JOIN_ENV,
    MSRUN_MODULE,
    ROLE_ENV,
    SCHEDULER_ROLE,
    WORKER_ROLE,
    all_gather_int32,
    cluster_env,
    cluster_role,
    collective_backend,
    configure_data_parallel,
    grad_reducer,
    init_collective,
    msrun_first_failure,
)
from msrl_consistency.compat.device import (  # noqa: E402 - after MindSpore's import above
    DEVICES,
    ONEDNN_ISA,
    check_compute_dtype,
    check_device,
    gemm_convolutions,
    mindspore_version,
    select_device,
    set_device,
    set_seed,
    set_threads,
)
from msrl_consistency.compat.graph import (  # noqa: E402 - after MindSpore's import above
    CompiledCall,
    compile_cache_blocker,
    compile_cache_dependencies,
    compile_log_captured,
    execution_mode,
    gc_frozen,
    graph_kernel_blocker,
    graph_kernel_fusion,
    set_compile_cache,
    use_graph_mode,
)
from msrl_consistency.compat.onnx_export import (  # noqa: E402 - after MindSpore's import above
    ONNX_EXPORT_HINTS,
    ONNX_MARKERS,
    onnx_export_hint,
    onnx_ops_marked,
)

__all__ = [
    "DEVICES",
    "mindspore_version",
    "set_device",
    "ONEDNN_ISA",
    "gemm_convolutions",
    "check_device",
    "select_device",
    "set_threads",
    "check_compute_dtype",
    "set_seed",
    "ROLE_ENV",
    "SCHEDULER_ROLE",
    "WORKER_ROLE",
    "MSRUN_MODULE",
    "ALLREDUCE_FUSION_MB",
    "FAST_JOIN_ENV",
    "cluster_role",
    "cluster_env",
    "collective_backend",
    "init_collective",
    "configure_data_parallel",
    "grad_reducer",
    "all_gather_int32",
    "msrun_first_failure",
    "use_graph_mode",
    "execution_mode",
    "compile_cache_blocker",
    "compile_cache_dependencies",
    "graph_kernel_blocker",
    "graph_kernel_fusion",
    "gc_frozen",
    "set_compile_cache",
    "compile_log_captured",
    "CompiledCall",
    "layers_to_float16",
    "ms_dtype",
    "as_tuple",
    "wrapped",
    "NoneDropped",
    "no_kernel_here",
    "exportable",
    "ONNX_MARKERS",
    "ONNX_EXPORT_HINTS",
    "onnx_ops_marked",
    "onnx_export_hint",
]
