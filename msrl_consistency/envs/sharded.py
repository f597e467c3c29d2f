"""Gymnasium envs stepped by several processes at once: this one and ``workers - 1`` spawned helpers.

A gymnasium env written in Python holds the GIL while it steps (BipedalWalker-v3: ~150 µs per env step here), so
one process steps 16 of them in ~2.5 ms while the other core idles: the policy acts in one op thread, pinned to
one CPU. gymnasium's ``AsyncVectorEnv`` gives every env its own process: 16 processes and 16 pipe round trips per
step, measured slower here (3.6 ms against 2.5 ms for 16 BipedalWalkers). ``ShardedVectorEnv`` cuts the envs into
``workers`` contiguous shards, each a SAME_STEP ``SyncVectorEnv``: shard 0 steps in this process, every other shard
in a helper process, all at the same time; one pipe round trip per helper per step.

Env i is seeded with ``seed + i`` and steps exactly as it would in one ``SyncVectorEnv``, so the stream
(observations, rewards, ends, final observations) is bitwise the same however many processes step it.
Helpers are spawned (never forked: this process runs MindSpore's threads) and import only gymnasium and this
package's env code, so an env id must be known to a fresh interpreter: gymnasium's own ids, ``module:EnvId`` ids,
or envs registered when ``msrl_consistency.envs`` is imported.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from msrl_consistency.envs.make import make_vector_env

JOIN_TIMEOUT_S = 5.0


def _serve(conn: Connection, env_id: str, num_envs: int) -> None:
    """A helper's loop: one command in, one reply out, until ``close`` or the trainer is gone.

    Ctrl-C reaches every process of the terminal's group; the trainer finishes its iteration and checkpoints on the
    first one, so a helper ignores it and goes on stepping until the trainer closes it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    envs = None
    try:
        envs = make_vector_env(env_id, num_envs)
        conn.send(("ok", None))
        while True:
            command, arg = conn.recv()
            if command == "step":
                obs, reward, terminated, truncated, infos = envs.step(arg)
                done = terminated | truncated
                final = np.stack(infos["final_obs"][done]) if done.any() else None
                conn.send(("ok", (obs, reward, terminated, truncated, final)))
            elif command == "reset":
                conn.send(("ok", envs.reset(seed=arg)[0]))
            elif command == "get_attr":
                conn.send(("ok", list(envs.get_attr(arg))))
            elif command == "set_attr":
                envs.set_attr(*arg)
                conn.send(("ok", None))
            else:  # "close"
                conn.send(("ok", None))
                return
    except EOFError:  # the trainer is gone: nothing to reply to
        return
    except Exception:  # noqa: BLE001 - any failure is reported to the trainer, which raises it
        with contextlib.suppress(BrokenPipeError, EOFError, OSError):
            conn.send(("error", traceback.format_exc()))
    finally:
        if envs is not None:
            envs.close()


class ShardedVectorEnv:
    """``num_envs`` gymnasium envs in ``workers`` shards behind the SAME_STEP vector-env interface the Trainer uses."""

    def __init__(self, env_id: str, num_envs: int, workers: int) -> None:
        self.env_id, self.num_envs = env_id, num_envs
        self.num_workers = max(1, min(int(workers), num_envs))
        # Threads of *this* process that step envs, for ``--cpu-pin auto``: the helpers are other processes and keep
        # every CPU, so pinning this one still leaves them a core.
        self.num_threads = 1
        bounds = np.linspace(0, num_envs, self.num_workers + 1).astype(int)
        self._shards = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self._local = make_vector_env(env_id, self._shards[0].stop)
        self.single_observation_space = self._local.single_observation_space
        self.single_action_space = self._local.single_action_space
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        ctx = mp.get_context("spawn")
        try:
            for k, shard in enumerate(self._shards[1:], start=1):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(child, env_id, shard.stop - shard.start), daemon=True,
                                   name=f"msrl-envs-{k}")  # fmt: skip
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            for k in range(len(self._conns)):
                self._reply(k)
        except BaseException:
            self.close()
            raise

    def _reply(self, k: int) -> Any:
        """Helper ``k``'s answer to its last command; its failure becomes this process's error."""
        try:
            status, value = self._conns[k].recv()
        except (EOFError, ConnectionError) as exc:
            code = self._procs[k].exitcode
            raise RuntimeError(f"env worker {k + 1} of {self.env_id} exited unexpectedly (exit code {code})") from exc
        if status == "error":
            raise RuntimeError(f"env worker {k + 1} of {self.env_id} failed:\n{value}")
        return value

    def _send(self, command: str, args: list[Any]) -> None:
        for conn, arg in zip(self._conns, args, strict=True):
            conn.send((command, arg))

    # -- the gymnasium vector-env interface --------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Env i is seeded with ``seed + i``, as by ``SyncVectorEnv.reset(seed=seed)``."""
        self._send("reset", [None if seed is None else seed + s.start for s in self._shards[1:]])
        parts = [self._local.reset(seed=seed)[0]]
        parts += [self._reply(k) for k in range(len(self._conns))]
        return np.concatenate(parts), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = np.asarray(actions)
        self._send("step", [actions[s] for s in self._shards[1:]])  # the helpers step while this process does
        obs, reward, terminated, truncated, infos = self._local.step(actions[self._shards[0]])
        done = terminated | truncated
        parts = [(obs, reward, terminated, truncated, np.stack(infos["final_obs"][done]) if done.any() else None)]
        parts += [self._reply(k) for k in range(len(self._conns))]
        obs, reward, terminated, truncated = (np.concatenate([p[i] for p in parts]) for i in range(4))
        done = terminated | truncated
        out: dict[str, Any] = {}
        if done.any():
            final = np.empty(self.num_envs, dtype=object)  # one row per env, as SyncVectorEnv's infos hold them
            rows = [row for p in parts if p[4] is not None for row in p[4]]
            for i, row in zip(np.flatnonzero(done), rows, strict=True):
                final[i] = row
            out = {"final_obs": final, "_final_obs": done}
        return obs, reward, terminated, truncated, out

    def get_attr(self, name: str) -> list[Any]:
        self._send("get_attr", [name] * len(self._conns))
        values = list(self._local.get_attr(name))
        for k in range(len(self._conns)):
            values += self._reply(k)
        return values

    def set_attr(self, name: str, values: list[Any]) -> None:
        values = list(values)
        self._send("set_attr", [(name, values[s]) for s in self._shards[1:]])
        self._local.set_attr(name, values[self._shards[0]])
        for k in range(len(self._conns)):
            self._reply(k)

    def helpers_peak_rss_mb(self) -> list[float]:
        """Each helper process's peak resident set so far (``VmHWM``; empty where /proc is not readable)."""
        peaks = []
        for proc in self._procs:
            try:
                with open(f"/proc/{proc.pid}/status") as fh:
                    line = next(x for x in fh if x.startswith("VmHWM:"))
            except (OSError, StopIteration):
                continue
            peaks.append(int(line.split()[1]) / 1024.0)
        return peaks

    def close(self) -> None:
        """Stop the helpers (asked first, terminated if they do not answer) and close this process's shard."""
        for conn in self._conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(("close", None))
        for proc in self._procs:
            proc.join(JOIN_TIMEOUT_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(JOIN_TIMEOUT_S)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        self._local.close()
