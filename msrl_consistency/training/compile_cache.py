"""Reuse compiled training graphs across runs: MindSpore's compile cache, made safe to leave on.

Compiling the rollout, train-step and evaluation graphs costs 2-5 s of every run (20% of a 50k-step CartPole
run on a slow host); MindSpore's compile cache loads them back in a fraction of that. On its own it is not
safe to leave on (measured on 2.10):
- it recognises a graph by the Python sources only, so values folded into a graph are not seen: a
  ``--clip-coef 0.1`` run silently reused the graph compiled for 0.2 and trained differently;
- it names a process's graphs by compile order (``compile_cache_<n>.mindir``), so one directory is only valid
  for one sequence of graphs;
- two runs sharing a directory could read each other's half-written files;
- it loads whatever graph files it finds: two float constants changed inside a cached ``.mindir`` gave a "warm"
  run that trained differently, with no message.

So every *graph key* gets its own directory: a hash of the config without its host-only fields (``HOST_ONLY``:
seed, step budget, paths, logging), the policy spec, the world size, MindSpore's and Python's versions, this
package's sources and the entry script MindSpore's own staleness check hashes. A run copies that directory into a
private one; MindSpore reads and writes only the copy; at the end the copy replaces the shared directory with one
rename if it holds more graphs. MindSpore keeps the first cache path of a process and numbers every cached graph after
it, so one process caches one run only (its graphs compiled in one fixed order: ``Trainer.compile_graphs``), and
data-parallel ranks compile without it. A warm-cache run is bitwise equal to an uncached run of the same config,
whatever its seed and step budget (``tests/test_compile_cache.py``).

Published files are checked, not trusted: ``key.json`` records every file's sha256, and a copy whose files do not
match (changed, truncated, added) is discarded with a one-line warning and the run compiles (``cold``, with the
reason). A cache directory that another user can write to is not used at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from msrl_consistency import compat

CACHE_DIR_ENV = "MSRL_COMPILE_CACHE_DIR"
KEY_FILE = "key.json"
GRAPHS = "rank_0/graph_cache/compile_cache_*.mindir"  # MindSpore's layout under the cache path (one process)
FUSED_KERNELS = "akg_kernel_meta/*.so"
# Config fields that never reach a graph: host-side seeds and shuffles, the step budget (the learning rate is a
# Parameter set from the host), where and how the run is logged. Everything else is part of the key.
HOST_ONLY = frozenset({
    "seed", "total_steps", "run_dir", "resume", "progress", "profile", "compile_cache", "checkpoint_every",
    "check_every", "master_addr", "master_port", "env_threads", "cpu_pin", "stop_at_return",
})  # fmt: skip
PACKAGE = Path(__file__).resolve().parents[1]
KEEP = 32  # graph keys kept, most recently used first (a CartPole key is ~0.5 MB)
STALE_WORK_SECONDS = 86_400  # a working copy this old belongs to a killed run (a run compiles in its first seconds)
_opened_in_this_process = False


def default_root() -> Path:
    """``$MSRL_COMPILE_CACHE_DIR``, else ``$XDG_CACHE_HOME/msrl_consistency/graphs`` (``~/.cache``)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "msrl_consistency" / "graphs"


def sources_digest() -> str:
    """sha256 of this package's Python sources (what builds the graphs)."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def files_digest(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with contextlib.suppress(OSError):
            digest.update(Path(path).read_bytes() + b"\0")
    return digest.hexdigest()


def graph_config(cfg: dict[str, Any], spec: dict[str, Any], world_size: int) -> dict[str, Any]:
    """What of a run decides its graphs within one process: the config without its host-only fields, the policy
    spec, the world size (``training/learner.py`` reuses a finished run's graphs by it)."""
    return {"config": {k: v for k, v in sorted(cfg.items()) if k not in HOST_ONLY}, "policy_spec": spec,
            "world_size": world_size}  # fmt: skip


def graph_key(cfg: dict[str, Any], spec: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Everything that decides which graphs a run compiles, and in which order, and whether MindSpore reuses them
    (it recompiles when its entry script or that script's local imports changed: a bench script, say)."""
    return {
        **graph_config(cfg, spec, world_size),
        "mindspore": compat.mindspore_version(),
        "python": platform.python_version(),
        "sources": sources_digest(),
        "entry_script": files_digest(compat.compile_cache_dependencies()),
    }


def key_name(payload: dict[str, Any]) -> str:
    """A short stable name for a key (a directory name in the cache)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def file_hashes(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (but ``key.json``), by relative path: what a published entry holds."""
    from inference.bundle.files import sha256_file

    return {
        p.relative_to(path).as_posix(): sha256_file(p)
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.relative_to(path).as_posix() != KEY_FILE
    }


def writable_by_others(path: Path) -> str | None:
    """Why ``path`` (a cache directory) could hold another user's files, or None: owned by someone else, or group-
    or world-writable (without the sticky bit's protection, the graphs MindSpore loads could be swapped)."""
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid():
        return f"{path} belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.filemode(st.st_mode)})"
    return None


def count_graphs(path: Path) -> int:
    return len(list(path.glob(GRAPHS)))


def fused_kernels(path: Path) -> set[str]:
    """The graph-kernel fusion (AKG) kernels under a cache path: MindSpore looks them up by name, a hash of the
    kernel's description, before it builds one."""
    return {p.name for p in path.glob(FUSED_KERNELS)}


def prune(root: Path, keep: int = KEEP) -> None:
    """Keep the ``keep`` most recently used graph keys and drop killed runs' working copies: a bounded cache."""
    now = time.time()
    try:
        entries = [(p.stat().st_mtime, p) for p in root.iterdir() if p.is_dir()]
    except OSError:
        return
    published = sorted((e for e in entries if not e[1].name.startswith(".")), reverse=True)
    stale = [p for mtime, p in entries if p.name.startswith(".") and now - mtime > STALE_WORK_SECONDS]
    for path in [p for _, p in published[keep:]] + stale:
        shutil.rmtree(path, ignore_errors=True)


class CompileCache:
    """One run's use of the cache: ``open`` before the run's first compile, ``close`` after its last."""

    def __init__(self, state: str, reason: str = "", key: str = "", directory: Path | None = None) -> None:
        self.state, self.reason, self.key, self.dir = state, reason, key, directory
        self.work: Path | None = None
        self.payload: dict[str, Any] = {}
        self.loaded = 0

    @classmethod
    def open(
        cls, cfg: dict[str, Any], spec: dict[str, Any], world_size: int = 1, root: Path | None = None
    ) -> CompileCache:
        """Point MindSpore at a private copy of this key's graphs; ``state`` says warm, cold or off (and why)."""
        if not cfg.get("compile_cache", True):
            return cls("off", "--compile-cache false")
        if world_size > 1:
            return cls("off", "data-parallel ranks compile their graphs")
        if os.environ.get("MS_COMPILER_CACHE_ENABLE"):
            return cls("off", "MS_COMPILER_CACHE_ENABLE is set: MindSpore's own, order-keyed cache is in charge")
        root = root or default_root()
        unsafe = writable_by_others(root)
        if unsafe:
            print(f"warning: compile cache not used: {unsafe}", file=sys.stderr)
            return cls("off", f"not used: {unsafe}")
        if blocker := compat.compile_cache_blocker():
            return cls("off", blocker)
        global _opened_in_this_process
        if _opened_in_this_process:
            return cls("off", "this process cached another run's graphs (MindSpore keeps one cache path)")
        _opened_in_this_process = True
        payload = graph_key(cfg, spec, world_size)
        key = key_name(payload)
        cache = cls("cold", key=key, directory=root / key)
        cache.payload = payload
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            unsafe = writable_by_others(root / key)
            if unsafe:
                print(f"warning: compile cache not used: {unsafe}", file=sys.stderr)
                return cls("off", f"not used: {unsafe}")
            cache.work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
            cache.loaded = cache._copy_published()
        except OSError as exc:  # a read-only or full cache dir costs the compile time, never the run
            cache.discard()
            return cls("off", f"cache dir unusable: {exc}")
        if cache.loaded:
            cache.state = "warm"
            with contextlib.suppress(OSError):
                os.utime(cache.dir)  # most recently used: the last to be pruned
        compat.set_compile_cache(str(cache.work))
        return cache

    def _copy_published(self) -> int:
        """Copy the shared directory into the private one if it is this key's and every file in the copy is the one
        published (``key.json``'s hashes); the number of graphs copied. A copy that fails the check is discarded,
        the shared entry removed, and the run compiles (``reason`` says why)."""
        assert self.dir is not None and self.work is not None
        try:
            stored = json.loads((self.dir / KEY_FILE).read_text())
            files = stored.pop("files", None)
            if stored != self.payload:
                return 0  # not ours (a hash collision or a hand-edited dir): compile from scratch
            shutil.copytree(self.dir, self.work, dirs_exist_ok=True)
        except (OSError, ValueError, AttributeError):  # absent, or replaced by another run while we copied
            self._empty_work()
            return 0
        problem = _mismatch(files, file_hashes(self.work))
        if problem:
            self.reason = f"cache entry {self.key} discarded: {problem}; compiled instead"
            print(f"warning: compile cache: {self.reason}", file=sys.stderr)
            shutil.rmtree(self.dir, ignore_errors=True)
            self._empty_work()
            return 0
        return count_graphs(self.work)

    def _empty_work(self) -> None:
        assert self.work is not None
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir()

    def close(self) -> None:
        """Stop caching; publish the private copy if it holds graphs or fused kernels the shared directory lacks.

        Measured on 2.10: the graphs a warm run loads describe some fused kernels differently from the graphs the
        cold run compiled (28 of 44 for CartPole), so the first warm run builds those (~5 s); published with the
        graphs, they make every later run's fused compile a load."""
        if self.work is None:
            return
        compat.set_compile_cache(None)
        assert self.dir is not None
        old = self.dir.with_name(f".{self.key}-old-{os.getpid()}")
        try:
            if count_graphs(self.work) > self.loaded or fused_kernels(self.work) - fused_kernels(self.dir):
                record = {**self.payload, "files": file_hashes(self.work)}
                (self.work / KEY_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))
                if self.dir.exists():
                    self.dir.rename(old)
                self.work.rename(self.dir)  # fails if another run published first: theirs stays
        except OSError:
            pass
        finally:
            self.discard()
            shutil.rmtree(old, ignore_errors=True)
            prune(self.dir.parent)

    def discard(self) -> None:
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = None

    def describe(self) -> dict[str, Any]:
        """For run.json and the profile."""
        if self.state == "off":
            return {"state": "off", "reason": self.reason}
        out = {"state": self.state, "key": self.key, "dir": str(self.dir), "graphs_loaded": self.loaded}
        return {**out, "reason": self.reason} if self.reason else out


def _mismatch(recorded: dict[str, str] | None, found: dict[str, str]) -> str | None:
    """How a copied entry differs from what was published, or None."""
    if not isinstance(recorded, dict):
        return "no file hashes recorded"
    changed = sorted(name for name in recorded.keys() & found.keys() if recorded[name] != found[name])
    if changed:
        return f"{changed[0]} changed since it was published (sha256 differs)"
    missing, added = sorted(recorded.keys() - found.keys()), sorted(found.keys() - recorded.keys())
    if missing:
        return f"{missing[0]} is missing"
    if added:
        return f"{added[0]} was added after publishing"
    return None
