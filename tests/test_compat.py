"""``compat.CompiledCall``: the hot-path shortcut must be the same graph with the same Parameters; ``gc_frozen``."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
from mindspore import Tensor, nn

from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, PolicySpec, RolloutPolicy
from msrl_consistency.envs import describe_env
from msrl_consistency.training.ppo import PPOLoss, PPOTrainStep


def cartpole_policy(seed: int = 0) -> ActorCritic:
    return ActorCritic(PolicySpec.from_env(describe_env("CartPole-v1"), hidden_sizes=[16, 16]), seed=seed)


def test_compiled_call_matches_cell_call_and_follows_parameter_updates():
    compat.use_graph_mode()
    rng = np.random.default_rng(0)
    policy = cartpole_policy()
    net = RolloutPolicy(policy)
    fast = compat.CompiledCall(net)

    def feeds(batch: int) -> tuple[Tensor, Tensor]:
        obs = rng.standard_normal((batch, 4)).astype(np.float32)
        return Tensor(obs), Tensor(policy.spec.sample_noise(rng, batch))

    for batch in (8, 8, 3, 8):  # compile, shortcut, a new signature (compiles), shortcut again
        obs, noise = feeds(batch)
        np.testing.assert_array_equal(fast(obs, noise).asnumpy(), net(obs, noise).asnumpy())
    assert len(fast._phases) == 2

    # The shortcut reads the live Parameters: new normalisation statistics change its output.
    obs, noise = feeds(8)
    before = fast(obs, noise).asnumpy()
    policy.normalizer.mean.set_data(Tensor(np.full(4, 0.5, np.float32)))
    after = fast(obs, noise).asnumpy()
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, net(obs, noise).asnumpy())


@pytest.mark.slow
def test_train_step_through_compiled_call_updates_weights_bitwise_like_cell_call():
    compat.use_graph_mode()
    rng = np.random.default_rng(1)
    batch, minibatch = 32, 8
    data = (
        Tensor(rng.standard_normal((batch, 4)).astype(np.float32)),
        Tensor(rng.integers(0, 2, batch).astype(np.float32)),
        Tensor(np.full(batch, np.log(0.5), np.float32)),
        Tensor(rng.standard_normal(batch).astype(np.float32)),
        Tensor(rng.standard_normal(batch).astype(np.float32)),
        Tensor(rng.standard_normal(batch).astype(np.float32)),
        Tensor(np.ones(batch, np.float32)),  # importance weights: the learner acted
    )
    idx = [Tensor(rng.permutation(batch).reshape(4, minibatch)[:2].astype(np.int32)) for _ in range(3)]

    def trained(use_shortcut: bool) -> list[np.ndarray]:
        policy = cartpole_policy(seed=3)
        opt = nn.Adam(policy.trainable_params(), learning_rate=1e-2, eps=1e-5)
        step = PPOTrainStep(PPOLoss(policy, 0.2, 0.5, 0.01, True), opt, 0.5, updates_per_call=2)
        call = compat.CompiledCall(step) if use_shortcut else step
        for i in idx:
            call(*data, i)
        return [p.asnumpy() for p in policy.trainable_params()]

    slow, fast = trained(False), trained(True)
    initial = [p.asnumpy() for p in cartpole_policy(seed=3).trainable_params()]
    assert any(not np.array_equal(f, i) for f, i in zip(fast, initial, strict=True))
    for f, s in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(f, s)


class _Node:
    pass


def test_gc_frozen_hides_older_objects_from_collections_and_hands_them_back():
    """MindSpore's collection before each compile skips what was alive before the block; nothing leaks after it."""
    assert gc.get_freeze_count() == 0, (compat.graph._gc_frozen_depth, threading.enumerate())  # what holds a freeze
    gc.disable()  # no automatic pass may free the cycle before the block starts
    try:
        node = _Node()
        node.self = node  # cyclic garbage once ``node`` is deleted: only the collector frees it
        ref = weakref.ref(node)
        del node
        with compat.gc_frozen():
            with compat.gc_frozen():  # nested, as a verify compiling a Trainer's graphs would be
                assert gc.get_freeze_count() > 0
            assert gc.get_freeze_count() > 0  # the inner block did not unfreeze the outer one's objects
            gc.collect()
            assert ref() is not None  # frozen: the full pass did not look at it
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert ref() is None
        gc.freeze()  # a program's own freeze is left as it is
        frozen = gc.get_freeze_count()
        with compat.gc_frozen():
            pass
        # not unfrozen (that would empty the permanent generation); another thread may free a few frozen objects
        assert frozen - 100 <= gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
        gc.enable()


_EXIT_SCRIPT = """
import atexit, gc, sys
mode, out = sys.argv[1], sys.argv[2]
# Registered before the import: runs after compat's own handler, so it sees the state the process ends in.
atexit.register(lambda: open(out + ".last", "w").write(str(gc.get_freeze_count() > 0)))
if mode == "off":
    gc.disable()
import msrl_consistency.compat
assert gc.isenabled() == (mode == "on"), "the import changed the caller's collector setting"
log = open(out, "w")  # buffered and never closed: written out when module teardown finalises it
log.write("written")
atexit.register(lambda: open(out + ".first", "w").write(str(gc.get_freeze_count() == 0)))
"""


@pytest.mark.parametrize("mode", ["on", "off"])
def test_importing_compat_keeps_the_callers_collector_and_the_exit_skips_only_collections(tmp_path, mode):
    """MindSpore is imported with collection paused and the exit's collections skip what is alive: the caller's
    collector setting is theirs again after the import, their exit handlers run with nothing frozen yet, and module
    teardown still flushes their open files."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, mode, str(out)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_text() == "written"
    assert (tmp_path / "out.first").read_text() == "True"  # the caller's handlers ran before the freeze
    assert (tmp_path / "out.last").read_text() == "True"  # the interpreter's last collections skip the frozen heap


FAILED_COMPILE = """
import os, numpy as np
from msrl_consistency import compat  # noqa: F401 - first, as every command imports it
import mindspore as ms
from mindspore import Tensor, nn
ms.set_context(mode=ms.GRAPH_MODE)
class Broken(nn.Cell):
    def construct(self, x):
        return x.no_such_method()
try:
    Broken()(Tensor(np.ones(3, np.float32)))
except AttributeError:
    print(os.environ["MS_OM_PATH"])
"""


def test_a_graph_that_fails_to_compile_leaves_nothing_in_the_working_directory(tmp_path):
    """MindSpore's ``rank_0/om/analyze_fail.ir`` goes to a directory of the user's in the temporary directory."""
    script = tmp_path / "script"  # MindSpore compiles only source it can read from a file
    script.mkdir()
    (script / "broken.py").write_text(FAILED_COMPILE)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, str(script / "broken.py")], capture_output=True, text=True, cwd=work,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
    assert list(work.iterdir()) == [], list(work.iterdir())
    assert (Path(proc.stdout.strip()) / "rank_0" / "om" / "analyze_fail.ir").is_file()
