"""Policy contracts of schema-v1 bundles: our trainer's, exported before manifests recorded a contract per graph.

A v1 manifest records the trainer's ``policy_spec`` instead; its two graphs are described from that here. This
describes a file format that no longer changes, so it stays apart from what the trainer exports today (the
training side describes that, and every v2 manifest records it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inference.bundle.contract import OBS, ActionSpec, Field, PolicyContract


def v1_contracts(
    policy_spec: Mapping[str, Any],
    log_std: Sequence[float] | None,
    env_id: str | None,
    sample_outputs: Sequence[str],
) -> dict[str, PolicyContract]:
    """``policy``: obs → (env action, logits | mean), the action post-processed in the graph; ``policy_sample``:
    (obs, noise) → (env action, log-prob, value[, logits | mean]), sampling in the graph from the given noise.
    ``sample_outputs`` is the sampling graph's output list: early v1 bundles had no logits/mean output there, and
    their sampling graph is then described as the deterministic kind (the action output is the action)."""
    discrete = policy_spec["action_kind"] == "discrete"
    obs = (Field(OBS, (int(policy_spec["obs_dim"]),)),)
    param = "logits" if discrete else "mean"
    if discrete:
        det = ActionSpec("categorical", logits=param, action="action")
    else:
        mode = policy_spec.get("action_postprocess", "clip")
        det = ActionSpec(
            "gaussian",
            mean=param,
            log_std=tuple(float(v) for v in (log_std or [])) or None,
            action="action",
            squash=mode,
            rescale=mode == "clip",
            low=tuple(policy_spec["action_low"]),
            high=tuple(policy_spec["action_high"]),
        )
    names = ("action", "log_prob", "value")
    if param in sample_outputs:
        names, sample = (*names, param), det
    else:
        sample = ActionSpec("deterministic", action="action", discrete=discrete)
    noise = {"noise_shape": (int(policy_spec["action_dim"]),), "noise_kind": "uniform" if discrete else "normal"}
    contracts = {
        "policy": PolicyContract(obs, ("action", param), det, env_id=env_id),
        "policy_sample": PolicyContract(obs, names, sample, env_id=env_id, value="value", log_prob="log_prob", **noise),
    }
    for contract in contracts.values():
        contract.validate()
    return contracts
