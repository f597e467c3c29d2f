"""What learns: the policy, its optimizer and compiled train step built from the config, and the PPO update that
drives them once per iteration (``update_epochs`` passes of shuffled minibatches, fused or split graphs).

A finished run's Cells keep their compiled graphs. The next run in the same process with the same graph key (the
config without its host-only fields, the policy spec: ``compile_cache.graph_config``) takes them instead of
compiling the same graphs again, 2-5 s per run (a seed sweep in one process, a test suite): every Parameter is first
set to what a freshly built Learner holds (the new seed's weights, zero Adam moments), so the run trains bitwise as
it would in a fresh process (``tests/test_training.py``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, DeterministicPolicy, PolicySpec, RolloutPolicy
from msrl_consistency.config import TrainConfig
from msrl_consistency.envs import EnvInfo
from msrl_consistency.training import update_precision as mp
from msrl_consistency.training.ppo import STEP_METRICS, PPOLoss, PPOTrainStep, SplitUpdate
from msrl_consistency.training.profile import Profile

# The rollout arrays the update reads, in the train step's argument order.
UPDATE_KEYS = ("obs", "actions", "logp", "advantages", "returns", "values", "is_weights")


def build_spec(cfg: TrainConfig, info: EnvInfo) -> PolicySpec:
    return PolicySpec.from_config(cfg, info)


@dataclass
class Learner:
    """The Cells one PPO run trains with, built from its config (the Trainer's and the benchmarks')."""

    policy: ActorCritic
    rollout_net: RolloutPolicy
    optimizer: nn.Adam
    train_step: PPOTrainStep
    evaluation: DeterministicPolicy  # what evaluation plays (and export and verify compute)
    split: SplitUpdate | None = None  # ``update_graphs = "split"``: the update as three smaller graphs
    key: str | None = None  # the graph key its Cells compile for (``learner_for_run``); None: never reused
    reused: bool = False  # its graphs were compiled by an earlier run in this process
    compiled: bool = False  # a run compiled its graphs (``Trainer.compile_graphs``): only then is it worth keeping

    def cells(self) -> list[nn.Cell]:
        return [self.train_step, self.rollout_net, self.evaluation, *self.split_cells()]

    def split_cells(self) -> list[nn.Cell]:
        return [] if self.split is None else [self.split.prepare, self.split.gradients, self.split.apply]


def build_learner(cfg: TrainConfig, spec: PolicySpec, world_size: int = 1) -> Learner:
    """``world_size > 1`` adds the gradient AllReduce (and, with ``adv_norm_scope=global``, the advantage one)."""
    policy = ActorCritic(spec, seed=cfg.seed)
    optimizer = nn.Adam(policy.trainable_params(), learning_rate=cfg.learning_rate, eps=1e-5)
    dtype = mp.compute_dtype(cfg.update_precision)
    loss = PPOLoss(policy, cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss, dtype)
    train_step = PPOTrainStep(
        loss,
        optimizer,
        cfg.max_grad_norm,
        cfg.train_call_updates,
        cfg.norm_adv,
        grad_reducer=compat.grad_reducer(optimizer.parameters, world_size) if world_size > 1 else None,
        adv_world_size=world_size if cfg.adv_norm_scope == "global" else 1,
        loss_scale=mp.LossScale() if mp.needs_loss_scale(cfg.update_precision) else None,
        corrects=cfg.rollout_engine == "onnxruntime",
    )
    split = SplitUpdate(train_step) if cfg.update_graphs == "split" else None
    return Learner(policy, RolloutPolicy(policy), optimizer, train_step, DeterministicPolicy(policy), split)


# -- reusing a finished run's compiled Cells -------------------------------------------------------------------------
IDLE_KEPT = 8  # the most recently finished runs' Learners kept for reuse (a 64x64 MLP's graphs: ~15 MB each)
_idle: OrderedDict[str, Learner] = OrderedDict()
_idle_lock = threading.Lock()


def run_graph_key(cfg: TrainConfig, spec: PolicySpec, world_size: int) -> str:
    """What decides a run's graphs in this process (``compile_cache.graph_config``: versions and sources cannot
    change between two runs of one process)."""
    from msrl_consistency.training.compile_cache import graph_config, key_name

    return key_name(graph_config(cfg.to_dict(), spec.to_dict(), world_size))


def learner_for_run(cfg: TrainConfig, spec: PolicySpec, world_size: int = 1) -> Learner:
    """A Learner for a new run: a finished run's with the same graph key, reset to a fresh build's state, else the
    fresh build. Data-parallel ranks always build (their graphs hold the ranks' collectives)."""
    fresh = build_learner(cfg, spec, world_size)
    if world_size > 1:
        return fresh
    fresh.key = run_graph_key(cfg, spec, world_size)
    with _idle_lock:
        idle = _idle.pop(fresh.key, None)
    if idle is None or not _copy_state(fresh, idle):
        return fresh
    idle.reused = True
    return idle


def release(learner: Learner) -> None:
    """Offer a finished run's Cells to the next run with the same graph key (``learner_for_run``)."""
    if learner.key is None or not learner.compiled:
        return
    learner.reused = False
    with _idle_lock:
        _idle[learner.key] = learner
        _idle.move_to_end(learner.key)
        while len(_idle) > IDLE_KEPT:  # the least recently finished go (their graphs with them)
            _idle.popitem(last=False)


@contextlib.contextmanager
def kept_runs_set_aside() -> Iterator[None]:
    """Runs started in the block compile their own graphs: the finished runs kept for reuse are set aside, and put
    back afterwards in place of whatever the block's runs left (a baseline that must compile, as in a fresh process)."""
    with _idle_lock:
        kept = OrderedDict(_idle)
        _idle.clear()
    try:
        yield
    finally:
        with _idle_lock:
            _idle.clear()
            _idle.update(kept)


def _parameters(learner: Learner) -> list[tuple[str, ms.Parameter]]:
    """Every Parameter the Learner's graphs read or write, once each, in a fixed order."""
    seen: dict[int, tuple[str, ms.Parameter]] = {}
    for cell in learner.cells():
        for name, param in cell.parameters_and_names():
            seen.setdefault(id(param), (name, param))
    return list(seen.values())


def _copy_state(source: Learner, into: Learner) -> bool:
    """Set every Parameter of ``into`` to a copy of ``source``'s value (True); if the two do not hold the same
    Parameters (names, shapes, dtypes), change nothing (False: the run takes the fresh build)."""
    theirs, mine = _parameters(source), _parameters(into)
    if [(n, p.shape, p.dtype) for n, p in theirs] != [(n, p.shape, p.dtype) for n, p in mine]:
        return False
    for (_, value), (_, param) in zip(theirs, mine, strict=True):
        param.set_data(Tensor(value.asnumpy().copy()))
    return True


class Updater:
    """One iteration's PPO update through the compiled train step (``fused``) or ``SplitUpdate``'s graphs.

    Owns the minibatch shuffle stream: every epoch's permutation is drawn in order, so a call's minibatches may span
    an epoch boundary and the updates are the same whatever ``updates_per_call`` groups them into.
    """

    def __init__(self, cfg: TrainConfig, learner: Learner, shuffle_rng: np.random.Generator, profile: Profile) -> None:
        self.cfg, self.learner, self.shuffle_rng, self.profile = cfg, learner, shuffle_rng, profile
        self.train_step = learner.train_step
        # Hot-path calls skip Cell.__call__'s per-call bookkeeping (see compat.CompiledCall).
        self._train_call = compat.CompiledCall(self.train_step)
        self.split = learner.split
        if self.split is not None:
            self._split_calls = [compat.CompiledCall(c) for c in learner.split_cells()]
            self._minibatch = [Tensor(u, ms.int32) for u in range(cfg.iteration_updates)]

    def update(self, buf: dict[str, np.ndarray]) -> dict[str, float]:
        """``update_epochs`` passes of shuffled minibatches (the means of the train step's metric rows)."""
        cfg = self.cfg
        batch = cfg.batch_size
        flat = [Tensor(buf[k].reshape(batch, *buf[k].shape[2:])) for k in UPDATE_KEYS]
        sums = np.zeros(len(STEP_METRICS))
        count = 0
        per_call = self.train_step.updates_per_call
        perms = np.stack([self.shuffle_rng.permutation(batch) for _ in range(cfg.update_epochs)]).astype(np.int32)
        if self.split is not None:
            return self._split_update(flat, perms.reshape(-1, cfg.minibatch_size))
        for idx in perms.reshape(-1, per_call, cfg.minibatch_size):
            t0 = time.perf_counter()
            sums += self._train_call(*flat, Tensor(idx)).asnumpy().sum(axis=0)
            self.profile.graph_call("train", "update", time.perf_counter() - t0)
            count += per_call
        return dict(zip(STEP_METRICS, (sums / count).tolist(), strict=True))

    def _split_update(self, flat: list[Tensor], idx: np.ndarray) -> dict[str, float]:
        """``update`` as ``SplitUpdate``'s graphs: one prepare call, then gradients and apply per minibatch."""
        prepare, gradients, apply = self._split_calls
        obs, actions, logp, adv, returns, values, is_weights = flat
        idx_t = Tensor(idx)
        t0 = time.perf_counter()
        x, actions, mb_adv = prepare(obs, actions, adv, idx_t, is_weights)
        sums = np.zeros(len(STEP_METRICS))
        for u in range(len(idx)):
            aux, *grads = gradients(x, actions, logp, mb_adv, returns, values, idx_t, self._minibatch[u])
            apply(*grads)
            sums += aux.asnumpy()
        self.profile.graph_call("train", "update", time.perf_counter() - t0)
        return dict(zip(STEP_METRICS, (sums / len(idx)).tolist(), strict=True))

    def compile(self, spec: PolicySpec) -> int:
        """Compile the update's graphs without running them (a run would change Adam's state); how many."""
        cfg = self.cfg
        rows, per_call = cfg.batch_size, self.train_step.updates_per_call
        act_shape = () if spec.discrete else (spec.action_dim,)
        shapes = [(rows, spec.obs_dim), (rows, *act_shape), (rows,), (rows,), (rows,), (rows,), (rows,)]  # ``update``
        zeros = [Tensor(np.zeros(shape, np.float32)) for shape in shapes]
        if self.split is None:
            self.train_step.compile(*zeros, Tensor(np.zeros((per_call, cfg.minibatch_size), np.int32)))
            return 1
        obs, actions, logp, adv, returns, values, is_weights = zeros
        idx = Tensor(np.zeros((cfg.iteration_updates, cfg.minibatch_size), np.int32))
        x, acts, mb_adv = self._split_calls[0](obs, actions, adv, idx, is_weights)  # stateless: harmless to run
        self.split.gradients.compile(x, acts, logp, mb_adv, returns, values, idx, self._minibatch[0])
        self.split.apply.compile(*(Tensor(np.zeros(p.shape, np.float32)) for p in self.learner.optimizer.parameters))
        return 3
