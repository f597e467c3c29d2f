"""Policy checkpoints: atomic save, strict load (every Parameter present, same shape, same dtype).

Strict, except for what MindSpore itself writes next to a network's Parameters (``bookkeeping``): the counters of
``save_checkpoint(..., append_dict=...)`` and of the training wrappers (``epoch_num``, ``step``, ``global_step``,
loss scale), and an optimizer's state saved with the network (``learning_rate``, ``beta1_power``, and a slot per
Parameter such as ``moment1.fc.weight``). Those are listed, never loaded; any other unknown entry is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mindspore as ms

from inference.bundle.files import atomic_path
from inference.errors import UsageError, first_line
from msrl_consistency.agent.policy import ActorCritic
from msrl_consistency.agent.spec import PolicySpec


def save_policy(policy: ActorCritic, path: str | Path) -> None:
    """Write the policy's Parameters (weights, log_std, normalisation stats, action bounds) with a CRC."""
    # Names relative to the policy: a Parameter's own ``.name`` depends on which Cell wrapped it first.
    entries = [{"name": name, "data": param.value()} for name, param in policy_parameters(policy).items()]
    with atomic_path(path) as tmp:
        # save_checkpoint appends ".ckpt" to names without it, so give the temp file that suffix.
        target = tmp.with_suffix(".ckpt")
        ms.save_checkpoint(entries, str(target), crc_check=True)
        target.replace(tmp)


def restore_parameters(params: dict[str, ms.Parameter], saved: dict[str, Any], source: str) -> None:
    """Set ``params`` from saved arrays, strictly: the same names and shapes, or a ``UsageError``."""
    if set(params) != set(saved):
        raise UsageError(f"{source} does not match this configuration's networks (changed --hidden-sizes?)")
    for name, value in saved.items():
        if tuple(params[name].shape) != value.shape:
            raise UsageError(f"{source}: {name} has shape {value.shape}, expected {params[name].shape}")
        params[name].set_data(ms.Tensor(value))


# Scalars MindSpore's optimizers, training wrappers and ``append_dict`` habits put in a checkpoint.
BOOKKEEPING = {"epoch_num", "step_num", "step", "global_step", "cur_epoch_num", "cur_step_num", "learning_rate",
               "beta1_power", "beta2_power", "momentum", "scale_sense", "loss_scale", "current_iterator_step",
               "last_overflow_iterator_step"}  # fmt: skip
# The prefixes MindSpore's optimizers clone each Parameter under (``moment1.fc.weight`` for ``fc.weight``).
OPTIMIZER_SLOTS = {"moment1", "moment2", "moments", "moment", "accum", "accum_update", "stat", "mean_square",
                   "mean_grad", "adam_m", "adam_v", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "lamb_m",
                   "lamb_v", "linear", "prev", "step_size", "vhat", "ax", "ax_", "momentum_buf"}  # fmt: skip


def bookkeeping(saved: list[str], parameters: list[str]) -> list[str]:
    """The entries of ``saved`` that MindSpore adds around a network whose Parameters are ``parameters`` (module
    docstring): never a Parameter's own name; an optimizer slot only for a Parameter of this network, under its
    name or with one leading scope stripped (``moment1.fc.weight`` for ``inner.fc.weight``)."""
    own = set(parameters)
    own |= {p.split(".", 1)[1] for p in parameters if "." in p}
    found = []
    for name in saved:
        if name in parameters:
            continue
        slot, _, rest = name.partition(".")
        if name in BOOKKEEPING or (slot in OPTIMIZER_SLOTS and rest in own):
            found.append(name)
    return found


def describe_ignored(names: list[str]) -> str:
    """One phrase for the ignored entries, e.g. "18 entries MindSpore adds (epoch_num, step, moment1.fc.weight...)"."""
    shown = ", ".join(names[:4]) + ("..." if len(names) > 4 else "")
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} MindSpore adds ({shown})"


def policy_parameters(policy: ActorCritic) -> dict[str, ms.Parameter]:
    return dict(policy.parameters_and_names())


def read_checkpoint(path: str | Path) -> dict[str, ms.Parameter]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint not found: {path}")
    try:
        return ms.load_checkpoint(str(path), crc_check=True)
    except (ValueError, RuntimeError, OSError, TypeError) as exc:
        raise UsageError(f"checkpoint {path} is corrupt or truncated ({first_line(exc, 160)})") from None


def load_policy(path: str | Path, spec: PolicySpec) -> ActorCritic:
    """Rebuild the policy from ``spec`` and load ``path`` strictly: no missing, extra or reshaped Parameters."""
    params = read_checkpoint(path)
    policy = ActorCritic(spec)
    expected = policy_parameters(policy)
    for name in bookkeeping(list(params), list(expected)):
        del params[name]
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    if missing or extra:
        raise UsageError(f"checkpoint {path} does not match the policy: missing {missing[:4]}, unexpected {extra[:4]}")
    for name, param in expected.items():
        got = params[name]
        if tuple(got.shape) != tuple(param.shape) or got.dtype != param.dtype:
            raise UsageError(
                f"checkpoint {path}: {name} is {got.dtype}{tuple(got.shape)}, the policy expects "
                f"{param.dtype}{tuple(param.shape)}"
            )
    for name, param in expected.items():
        param.set_data(params[name].value())
    return policy
