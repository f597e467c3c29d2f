"""Policy checkpoints: atomic save, strict load (every Parameter present, same shape, same dtype)."""

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
