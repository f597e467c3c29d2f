"""Training configuration: one dataclass, a docstring per field, every field a CLI flag.

Precedence (lowest first): dataclass defaults → the env's preset (``presets/<env-id>.toml``) →
``--config FILE.toml`` → explicit command-line flags.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import math
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.bundle.files import read_document
from inference.errors import UsageError

PRESET_DIR = Path(__file__).with_name("presets")
LOWERINGS = ("fp32", "int8", "fp16")  # what --lower trains the actor in (``agent.lowered``)
MAX_UPDATES_PER_CALL = 8  # minibatch updates unrolled in one train-step graph: more compile time and memory
AUTO_UPDATES_PER_CALL = 4  # the automatic choice stays at or below this (8 cost CartPole ~40 MB more, no faster)


@dataclass
class TrainConfig:
    env_id: str = "CartPole-v1"
    """Gymnasium environment id (Box observations; Discrete or Box actions)."""
    total_steps: int = 50_000
    """Total environment steps over all vector envs."""
    seed: int = 1
    """Master seed: env resets, weight init, sampling noise and minibatch shuffles derive from it."""
    run_dir: str = ""
    """Output directory; default runs/<env-id>-s<seed>."""
    resume: str = ""
    """Continue the run in this directory from its last checkpoint."""
    device: str = "cpu"
    """MindSpore device: cpu, gpu or ascend."""
    threads: int = 1
    """CPU op threads for MindSpore (1 is fastest for small MLPs and keeps results bitwise reproducible)."""
    workers: int = 1
    """Data-parallel worker processes: N > 1 launches N ranks on this machine with msrun (each with num_envs envs;
    gradients averaged by AllReduce). Under your own msrun the world size comes from msrun."""
    master_addr: str = "127.0.0.1"
    """Address msrun's scheduler listens on (--workers > 1); the default keeps every listener on loopback."""
    master_port: int = 0
    """Port of msrun's scheduler (--workers > 1); 0 picks a free one."""
    check_every: int = 10
    """Data parallel: compare every rank's weights and normaliser checksums every N iterations (and at the end)."""
    adv_norm_scope: str = "global"
    """Data parallel: normalise minibatch advantages over all ranks' minibatches (global) or each rank's (rank)."""
    update_precision: str = "fp32"
    """Precision of the PPO update's forward/backward: fp32, fp16 (loss-scaled) or bf16; weights, rollouts and
    exported graphs stay fp32."""
    num_envs: int = 8
    """Number of parallel environments."""
    async_envs: bool = False
    """Use gymnasium AsyncVectorEnv (subprocesses) instead of SyncVectorEnv (implies the gymnasium backend)."""
    env_backend: str = "auto"
    """Training env engine: envpool (C++, steps outside the GIL), gymnasium, or auto (EnvPool where it supports the
    env id: classic control, Box2D, MuJoCo; gymnasium otherwise). A run records the engine it resolved to.
    Evaluation, verify and play always use gymnasium."""
    env_threads: int = 0
    """Env steppers working at once: EnvPool's threads, or on gymnasium the processes that step its envs (this one
    and spawned helpers). 0: one per core (up to num_envs) for Box2D and MuJoCo, whose steps are costly; else 1."""
    rollout_engine: str = "auto"
    """What the rollouts act through: mindspore (the learner's compiled graph), onnxruntime (the policy's exported
    ONNX graph, the learner's weights pushed after each update, the mismatch corrected by truncated importance
    weights), or auto (onnxruntime for an fp32 actor on the CPU). A run records the engine it resolved to."""
    cpu_pin: str = "auto"
    """Keep the training process's threads on one CPU: auto (where every thread works in turn: the CPU device, one op
    thread, an env engine stepping in at most one thread), off, or a CPU index. On a VM this saves waking another
    vCPU at every hand-off inside a MindSpore call (CartPole and Pendulum ran 1.2-2.7x faster); no arithmetic
    changes."""
    num_steps: int = 128
    """Rollout length per env per iteration."""
    learning_rate: float = 2.5e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Linearly anneal the learning rate to zero over the run."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    num_minibatches: int = 4
    """Minibatches per epoch; must divide num_envs * num_steps."""
    update_epochs: int = 4
    """PPO epochs per iteration."""
    updates_per_call: int = 0
    """Minibatch updates per compiled train-step call, at most 8 (0: the largest divisor of num_minibatches x
    update_epochs up to 4); a call may span an epoch boundary. Each one is unrolled in the graph: fewer cost less
    compile time and memory (BipedalWalker preset: 784 MB peak RSS with 8, 692 MB with 2, at the same speed) and
    change results only in the last bits."""
    update_graphs: str = "fused"
    """fused: updates_per_call whole minibatch updates per compiled call. split: each minibatch update as two small
    graphs (gradients; clip + Adam), which MindSpore's CPU runtime runs in the calling thread when each has at most 100
    kernels (64-64 MLPs); one process, fp32 only (see training/ppo.py, SplitUpdate)."""
    graph_kernel: bool = False
    """Compile the act and train-step graphs with MindSpore's graph-kernel fusion (AKG; needs g++): 20-40% off a 64-64
    policy's minibatch update on the CPU, but 2-2.6x slower for 256-wide layers, and ~4 s more per process, compile
    cache or not (bench/results/graph_kernel.md). One process, fp32, CPU only."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    clip_coef: float = 0.2
    """Surrogate clipping coefficient."""
    clip_vloss: bool = True
    """Clip the value loss like the policy ratio."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Widths of the actor and critic MLP trunks, e.g. 256,256,128."""
    activation: str = "tanh"
    """Trunk activation: tanh or relu."""
    normalize_obs: bool = True
    """Normalise observations in-graph with running statistics (frozen in the checkpoint)."""
    clip_obs: float = 10.0
    """Clip normalised observations to [-clip_obs, clip_obs]."""
    action_postprocess: str = "clip"
    """Box actions: 'clip' to [-1, 1] or 'tanh' squash, then rescale to the env bounds."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian head."""
    lower: str = "fp32"
    """Numerics the actor trunk computes in, in rollouts and updates: fp32, or the device's int8 (Lite's full
    quantization) or fp16, with straight-through gradients; the critic stays fp32. Export then writes a .ms that
    computes what the trained actor computes."""
    keep: list[str] = field(default_factory=list)
    """With --lower: actor layers kept in fp32 (names as verify and precision plans print them, e.g. actor.layers.0)."""
    init_from: str = ""
    """Start from this run directory's last checkpoint (weights and observation statistics; a fresh optimizer), e.g.
    to fine-tune an fp32 policy in its device's numerics with --lower."""
    reward_scale: float = 1.0
    """Multiply rewards by this before GAE (training signal only; returns are reported unscaled). Keeps the value
    targets near unit scale, so the critic's gradients do not swamp the actor's under the shared global-norm clip
    (Hopper-v5: 0.01; unscaled, its policy stalled)."""
    normalize_reward: bool = False
    """Also divide rewards by the running std of each env's discounted return, then clip them to [-10, 10]
    (CleanRL's reward normalisation; statistics updated between iterations, merged over ranks, kept on resume).
    An alternative to choosing --reward-scale, which still multiplies first."""
    checkpoint_every: int = 10
    """Write a checkpoint every N iterations (and always at the end)."""
    eval_episodes: int = 10
    """Deterministic evaluation episodes at the end of training (and at every --eval-every)."""
    eval_every: int = 0
    """Also evaluate every N iterations (0: only at the end); logged to evals.csv, excluded from SPS."""
    stop_at_return: str = ""
    """Stop once a periodic evaluation's mean return reaches this number (needs --eval-every; empty: train all
    total_steps). The run checkpoints and evaluates as at its end; the learning rate still anneals over total_steps,
    so the steps to the target are those of an uninterrupted run."""
    progress: bool = True
    """Show a progress bar with live return and SPS."""
    profile: bool = False
    """At the end, print where the time went (env stepping, acting, GAE, update, ...) and write profile.json."""
    compile_cache: bool = True
    """Reuse this config's compiled graphs from an earlier run (keyed by everything that shapes them; bitwise the
    same training). Stored under $MSRL_COMPILE_CACHE_DIR, default ~/.cache/msrl_consistency/graphs."""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def iteration_updates(self) -> int:
        """Minibatch updates per iteration (every epoch's minibatches)."""
        return self.num_minibatches * self.update_epochs

    @property
    def train_call_updates(self) -> int:
        """Minibatch updates per train-step call: ``updates_per_call``, or the largest divisor of the iteration's
        updates up to ``AUTO_UPDATES_PER_CALL``."""
        updates = self.iteration_updates
        return self.updates_per_call or max(d for d in range(1, AUTO_UPDATES_PER_CALL + 1) if updates % d == 0)

    @property
    def global_batch_size(self) -> int:
        """Env steps per iteration over all data-parallel ranks."""
        return self.batch_size * self.workers

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_steps // self.global_batch_size)

    def validate(self) -> None:
        """Reject inconsistent settings before anything is written."""
        self._check_numbers()
        self._check_choices()

    def _check_numbers(self) -> None:
        """Every number finite and in its range, the batch divisible as the update splits it."""
        positive = ("total_steps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "checkpoint_every",
                    "workers", "check_every")  # fmt: skip
        for name in positive:
            if getattr(self, name) <= 0:
                raise UsageError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        for f in dataclasses.fields(self):  # NaN and infinities pass every comparison below: refuse them first
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UsageError(f"--{_flag(f.name)} must be a finite number, got {value}")
        ranges = {  # name: (low, high, low inclusive), for the numbers whose meaning breaks outside a range
            "seed": (0, 2**32 - 1, True), "threads": (1, 1024, True), "learning_rate": (0.0, 1.0, False),
            "gamma": (0.0, 1.0, False), "gae_lambda": (0.0, 1.0, True), "clip_coef": (0.0, 10.0, False),
            "vf_coef": (0.0, 1e6, True), "ent_coef": (0.0, 1e6, True), "max_grad_norm": (0.0, 1e9, False),
            "clip_obs": (0.0, 1e9, False), "reward_scale": (0.0, 1e9, False), "init_log_std": (-20.0, 20.0, True),
            "eval_episodes": (0, 10**6, True),
        }  # fmt: skip
        for name, (low, high, inclusive) in ranges.items():
            value = getattr(self, name)
            if not ((low <= value) if inclusive else (low < value)) or value > high:
                interval = f"{'[' if inclusive else '('}{low}, {high}]"
                raise UsageError(f"--{_flag(name)} must be in {interval}, got {value}")
        per_call, updates = self.updates_per_call, self.iteration_updates
        if not 0 <= per_call <= MAX_UPDATES_PER_CALL or (per_call and updates % per_call):
            raise UsageError(f"--updates-per-call must be 0 (auto) or a divisor of --num-minibatches x --update-epochs "
                             f"({updates}) up to {MAX_UPDATES_PER_CALL}, got {self.updates_per_call}")  # fmt: skip
        if self.batch_size % self.num_minibatches:
            raise UsageError(
                f"--num-minibatches {self.num_minibatches} does not divide the batch "
                f"(num_envs {self.num_envs} x num_steps {self.num_steps} = {self.batch_size})"
            )
        if self.eval_every < 0:
            raise UsageError(f"--eval-every must be 0 (off) or positive, got {self.eval_every}")
        if self.eval_every and self.eval_episodes <= 0:
            raise UsageError("--eval-every needs --eval-episodes > 0")
        if self.stop_at_return:
            try:
                target = float(self.stop_at_return)
            except ValueError:
                raise UsageError(f"--stop-at-return must be a number, got {self.stop_at_return!r}") from None
            if not math.isfinite(target):
                raise UsageError(f"--stop-at-return must be a finite number, got {self.stop_at_return!r}")
            if not self.eval_every:
                raise UsageError("--stop-at-return needs --eval-every (the periodic evaluations it watches)")

    def _check_choices(self) -> None:
        """Every named choice one of its values, and the combinations one process or msrun can run."""
        if self.activation not in ("tanh", "relu"):
            raise UsageError(f"--activation must be tanh or relu, got {self.activation!r}")
        if self.action_postprocess not in ("clip", "tanh"):
            raise UsageError(f"--action-postprocess must be clip or tanh, got {self.action_postprocess!r}")
        if not self.hidden_sizes or any(h <= 0 for h in self.hidden_sizes):
            raise UsageError(f"--hidden-sizes must be positive widths, got {self.hidden_sizes}")
        if self.device.lower() not in ("cpu", "gpu", "ascend"):
            raise UsageError(f"--device must be cpu, gpu or ascend, got {self.device!r}")
        if self.env_backend not in ("auto", "envpool", "gymnasium"):
            raise UsageError(f"--env-backend must be auto, envpool or gymnasium, got {self.env_backend!r}")
        if self.cpu_pin not in ("auto", "off") and not (self.cpu_pin.isdigit() and int(self.cpu_pin) < 4096):
            raise UsageError(f"--cpu-pin must be auto, off or a CPU index, got {self.cpu_pin!r}")
        if not 0 <= self.env_threads <= 1024:
            raise UsageError(f"--env-threads must be in [0, 1024], got {self.env_threads}")
        if self.adv_norm_scope not in ("global", "rank"):
            raise UsageError(f"--adv-norm-scope must be global or rank, got {self.adv_norm_scope!r}")
        if self.lower not in LOWERINGS:
            raise UsageError(f"--lower must be one of {', '.join(LOWERINGS)}, got {self.lower!r}")
        if self.keep and self.lower == "fp32":
            raise UsageError("--keep names layers kept in fp32 under --lower int8|fp16; this run computes in fp32")
        bad = [k for k in self.keep if not _actor_layer(k, len(self.hidden_sizes))]
        if bad:
            last = 2 * len(self.hidden_sizes)
            raise UsageError(f"--keep {bad[0]!r}: not an actor layer (actor.layers.0 .. actor.layers.{last})")
        if self.lower != "fp32" and (self.workers > 1 or self.update_precision != "fp32"):
            raise UsageError("--lower trains one process with --update-precision fp32 (the update then computes the "
                             "actor as the rollouts do)")  # fmt: skip
        if self.update_precision not in ("fp32", "fp16", "bf16"):
            raise UsageError(f"--update-precision must be fp32, fp16 or bf16, got {self.update_precision!r}")
        if self.rollout_engine not in ("auto", "mindspore", "onnxruntime"):
            raise UsageError(f"--rollout-engine must be auto, mindspore or onnxruntime, got {self.rollout_engine!r}")
        if self.rollout_engine == "onnxruntime" and (self.lower != "fp32" or self.device.lower() != "cpu"):
            raise UsageError("--rollout-engine onnxruntime acts for an fp32 actor on the CPU (a --lower actor acts "
                             "in its own Cell)")  # fmt: skip
        if self.update_graphs not in ("fused", "split"):
            raise UsageError(f"--update-graphs must be fused or split, got {self.update_graphs!r}")
        if self.update_graphs == "split" and (self.update_precision != "fp32" or self.workers > 1):
            raise UsageError("--update-graphs split runs one process with --update-precision fp32; use fused for "
                             "data parallel or a mixed-precision update")  # fmt: skip
        if self.graph_kernel and (self.update_precision != "fp32" or self.workers > 1 or self.device.lower() != "cpu"):
            raise UsageError("--graph-kernel true is measured on the CPU with one process and --update-precision fp32 "
                             "only")  # fmt: skip
        if not 0 <= self.master_port <= 65535:
            raise UsageError(f"--master-port must be 0 (a free port) or a port number, got {self.master_port}")
        if not self.master_addr.strip():
            raise UsageError("--master-addr must not be empty")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _actor_layer(name: str, hidden: int) -> bool:
    prefix, _, index = name.rpartition(".")
    return prefix == "actor.layers" and index.isdigit() and int(index) <= 2 * hidden


def _flag(name: str) -> str:
    return name.replace("_", "-")


def field_docs(cls: type) -> dict[str, str]:
    """Read the attribute docstrings (the string literal after each field) from the class source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = nxt.value.value.strip()
    return docs


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _parse_int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace("x", ",").split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _parse_str_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser(prog: str = "python -m msrl_consistency.train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a PPO policy with MindSpore; preprocessing and sampling live inside the graph.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", default="", help="TOML file with any of the fields below")
    docs = field_docs(TrainConfig)
    hints = typing.get_type_hints(TrainConfig)
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        hint = hints[f.name]
        kind: Any = {bool: _parse_bool, int: int, float: float, str: str, list[str]: _parse_str_list}.get(
            hint, _parse_int_list
        )
        # argparse %-formats help texts: a docstring's "20-40%" made --help raise
        text = f"{docs.get(f.name, '')} (default: {getattr(defaults, f.name)})".replace("%", "%%")
        if hint is bool:  # a switch as users type it (--profile, --no-profile); --profile true|false still works
            text = text[:-1] + f"; --no-{_flag(f.name)}: off)"
            parser.add_argument(f"--{_flag(f.name)}", dest=f.name, type=kind, nargs="?", const=True,
                                default=argparse.SUPPRESS, metavar="BOOL", help=text)  # fmt: skip
            parser.add_argument(f"--no-{_flag(f.name)}", dest=f.name, action="store_false", default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)  # fmt: skip
            continue
        parser.add_argument(f"--{_flag(f.name)}", dest=f.name, type=kind, default=argparse.SUPPRESS, help=text)
    return parser


def load_toml(path: str | Path) -> dict[str, Any]:
    data = read_document(path, "config file", UsageError)
    data = {k.replace("-", "_"): v for k, v in data.items()}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"config file {path}: unknown field(s) {', '.join(unknown)}")
    return data


def preset_path(env_id: str) -> Path:
    return PRESET_DIR / f"{env_id}.toml"


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def from_dict(values: dict[str, Any]) -> TrainConfig:
    """Build a config from a plain dict (run.json, TOML), checking field types."""
    cfg = TrainConfig()
    hints = typing.get_type_hints(TrainConfig)
    for key, value in values.items():
        if key not in hints:
            raise UsageError(f"unknown config field {key!r}")
        expected = hints[key]
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = isinstance(value, list) if expected in (list[int], list[str]) else isinstance(value, expected)
        if expected is int and isinstance(value, bool):
            ok = False
        if not ok:
            raise UsageError(f"config field {key!r} expects {getattr(expected, '__name__', expected)}, got {value!r}")
        setattr(cfg, key, value)
    return cfg


def explicit_flags(argv: list[str] | None = None) -> dict[str, Any]:
    """Only the fields given on the command line (every flag defaults to SUPPRESS)."""
    return vars(build_parser().parse_args(argv))


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Merge defaults, the env preset, ``--config`` and flags into a validated config."""
    args = explicit_flags(argv)
    config_file = args.pop("config", "")
    file_values = load_toml(config_file) if config_file else {}
    env_id = args.get("env_id", file_values.get("env_id", TrainConfig.env_id))
    values: dict[str, Any] = {}
    if preset_path(env_id).exists():
        values.update(load_toml(preset_path(env_id)))
    values.update(file_values)
    values.update(args)
    # A preset's split update and graph-kernel fusion run one process in fp32 (fusion: on the CPU): data parallel,
    # mixed precision and other devices go without them unless asked otherwise.
    chosen = {**file_values, **args}
    needs_fused = values.get("workers", 1) > 1 or values.get("update_precision", "fp32") != "fp32"
    if "update_graphs" not in chosen and needs_fused:
        values["update_graphs"] = "fused"
    if "graph_kernel" not in chosen and (needs_fused or str(values.get("device", "cpu")).lower() != "cpu"):
        values["graph_kernel"] = False
    cfg = from_dict(values)
    if not cfg.run_dir and not cfg.resume:
        cfg.run_dir = f"runs/{cfg.env_id}-s{cfg.seed}"
    if not cfg.resume:  # a resumed run's config is its stored one: validated with the flags that may change applied
        cfg.validate()
    return cfg
