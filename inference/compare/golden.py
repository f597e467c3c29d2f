"""Golden files: the reference's inputs, outputs and episode traces in one portable ``.npz``.

Recorded on the training box (``verify --save-golden``) and compared on a deploy box without MindSpore
(``verify --golden``), Polygraphy's ``--save-outputs`` / ``--load-outputs`` for policies.

Layout (v3): ``obs`` (rows of the contract's ``obs_dtype``: a structured array for a ``Dict`` observation),
``source``, ``state`` (the carried states fed with each row, for a policy that has them), ``noise/<graph>``,
``out/<graph>/<output>``, ``episode_noise/<mode>``, ``trace/<mode>/{obs,actions,rewards,alive,states}``,
``top2/<mode>`` (discrete actions: per step the reference's margin
between its two best scores, the magnitudes of those two scores and the row's largest, ``contract.top2_margin``)
and ``meta`` (JSON: format, version, env, seed, episodes, manifest_sha256). v2 files (``top2`` as margin and
scale) and v1 files (two fixed graphs) still load.

Every version records the sha256 of the manifest it was recorded from, and a golden file is compared only with
that bundle: one from another bundle of the same env is refused (exit 2), as it would otherwise fail the check as
"weights or layers differ". A golden file recorded from a MindIR outside a bundle has no manifest to hash
(``null``): it still loads, with a warning in the report that its origin cannot be checked.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, sha256_file
from inference.bundle.files import loads_strict
from inference.compare.episodes import EpisodeTrace
from inference.compare.feeds import Feeds
from inference.compare.judge.localize import LayerPlan, RecordedLayers
from inference.compare.reference import Reference
from inference.errors import UsageError, first_line

GOLDEN_FORMAT = "msrl-consistency/golden"
GOLDEN_VERSION = 3
TRACE_FIELDS = ("obs", "actions", "rewards", "alive")
_V1_GRAPHS = {"det": "policy", "sto": "policy_sample"}


def save_golden(
    path: Path, reference: Reference, bundle: Bundle, env_label: str | None, layers: dict[str, np.ndarray] | None = None
) -> None:
    """The reference in one ``.npz``; ``layers`` (``verify --save-golden --golden-layers``) adds the arrays a
    deploy box needs to name the first diverging layer."""
    arrays: dict[str, np.ndarray] = {"obs": reference.feeds.obs, "source": reference.feeds.source.astype("U8")}
    if reference.feeds.state is not None:
        arrays["state"] = reference.feeds.state
    arrays.update({f"noise/{g}": v for g, v in reference.feeds.noise.items()})
    for graph, outs in reference.outputs.items():
        arrays.update({f"out/{graph}/{k}": v for k, v in outs.items()})
    arrays.update({f"episode_noise/{m}": v for m, v in reference.episode_noise.items()})
    arrays.update({f"top2/{m}": v for m, v in reference.top2.items()})
    for mode, trace in reference.traces.items():
        arrays.update({f"trace/{mode}/{f}": getattr(trace, f) for f in TRACE_FIELDS})
        if trace.states is not None:
            arrays[f"trace/{mode}/states"] = trace.states
    meta = {
        "format": GOLDEN_FORMAT,
        "version": GOLDEN_VERSION,
        "env": env_label,
        "seed": reference.seed,
        "episodes": reference.episodes,
        "skipped_episodes": reference.skipped_episodes,
        "manifest_sha256": sha256_file(bundle.root / "manifest.json") if (bundle.root / "manifest.json").is_file()
        else None,
    }  # fmt: skip
    arrays.update(layers or {})
    arrays["meta"] = np.array(json.dumps(meta))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def read_golden(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The meta dict and the arrays; UsageError for anything that is not a golden file."""
    if not path.is_file():
        raise UsageError(f"golden file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        text = str(arrays.pop("meta"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(
            f"{path} is not a golden file written by verify --save-golden ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    meta = loads_strict(text, f"golden file {path}: its meta", UsageError)
    if not isinstance(meta, dict):
        raise UsageError(f"{path} is not a golden file written by verify --save-golden (its meta is not an object)")
    if "version" not in meta:  # v1: fixed graph names and a single env id
        arrays = _upgrade_v1(arrays)
        meta = {**meta, "env": meta.get("env_id"), "version": 1}
    return meta, arrays


def load_golden(path: Path, bundle: Bundle) -> Reference:
    """The reference a golden file recorded, for ``bundle``: UsageError (exit 2) for a golden file recorded from
    another bundle (its manifest's sha256 is not this bundle's), or one that lacks a graph of the bundle."""
    meta, arrays = read_golden(path)
    unchecked = golden_origin(meta, path, bundle)
    missing = [g for g in bundle.graphs if not any(k.startswith(f"out/{g}/") for k in arrays)]
    if missing:
        raise UsageError(f"golden file {path.name} has no outputs for graph(s) {missing} of bundle {bundle.root}")
    if bundle.env_id and meta.get("env") and meta["env"] != bundle.env_id:
        raise UsageError(f"golden file is for {meta['env']}, the bundle for {bundle.env_id}")
    outputs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        if key.startswith("out/"):
            _, graph, name = key.split("/", 2)
            outputs.setdefault(graph, {})[name] = value
    _check_fields(path, bundle, arrays, outputs)
    modes = {k.split("/")[1] for k in arrays if k.startswith("trace/")}
    traces = {m: EpisodeTrace(*(arrays[f"trace/{m}/{f}"] for f in TRACE_FIELDS), arrays.get(f"trace/{m}/states"))
              for m in sorted(modes)}  # fmt: skip
    noise = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("noise/")}
    feeds = Feeds(arrays["obs"], arrays["source"], noise, arrays.get("state"))
    episode_noise = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("episode_noise/")}
    top2 = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("top2/")}
    return Reference(
        feeds, outputs, traces, episode_noise, int(meta["seed"]), int(meta["episodes"]),
        origin=f"golden:{path.name}", skipped_episodes=meta.get("skipped_episodes"), top2=top2,
        origin_unchecked=unchecked,
    )  # fmt: skip


def _check_fields(path: Path, bundle: Bundle, arrays: dict[str, np.ndarray],
                  outputs: dict[str, dict[str, np.ndarray]]) -> None:  # fmt: skip
    """Every field the comparison reads is there with one row per observation and the contract's shape: a damaged
    golden file is one line naming the file and the field, not a failure deep in a comparison."""
    for field in ("obs", "source"):
        if field not in arrays:
            raise UsageError(f"golden file {path}: field {field!r} is missing")
    rows = len(arrays["obs"])
    for graph in bundle.graphs:
        for out in bundle.graph(graph)["outputs"]:
            if out["name"] not in outputs.get(graph, {}):
                raise UsageError(f"golden file {path}: field 'out/{graph}/{out['name']}' is missing")
    counted = {k: v for k, v in arrays.items() if k == "source" or k.startswith(("out/", "noise/"))}
    for key, value in counted.items():
        if np.ndim(value) < 1 or len(value) != rows:
            raise UsageError(f"golden file {path}: field {key!r} has {len(value) if np.ndim(value) else 0} rows, "
                             f"'obs' {rows}")  # fmt: skip
    graph = bundle.mode_graph("deterministic") or bundle.graphs[0]
    want = [tuple(t["shape"][1:]) for t in bundle.graph(graph)["inputs"]]
    got = tuple(arrays["obs"].shape[1:])
    if arrays["obs"].dtype.names is None and want and got != want[0] and int(np.prod(got)) != int(np.prod(want[0])):
        raise UsageError(f"golden file {path}: field 'obs' has rows of shape {list(got)}, the bundle's "
                         f"{graph!r} takes {list(want[0])}")  # fmt: skip


def golden_origin(meta: dict[str, Any], path: Path, bundle: Bundle) -> str | None:
    """``UsageError`` naming both hashes when the golden file was recorded from another bundle; why its origin
    cannot be checked when it records no manifest hash (a MindIR outside a bundle); None when it is this bundle's."""
    recorded = meta.get("manifest_sha256")
    manifest = bundle.root / "manifest.json"
    if recorded is None:
        return (f"golden file {path.name} records no manifest hash (it was recorded from a model outside a bundle): "
                f"that it belongs to {bundle.root} is not checked")  # fmt: skip
    mine = sha256_file(manifest)
    if recorded != mine:
        raise UsageError(f"golden file {path} was recorded from another bundle (manifest sha256 "
                         f"{str(recorded)[:12]}…), not {bundle.root} ({mine[:12]}…)")  # fmt: skip
    return None


def _upgrade_v1(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {"obs": arrays["obs"], "source": arrays["source"]}
    for key, value in arrays.items():
        prefix, _, rest = key.partition("/")
        if prefix in _V1_GRAPHS:
            out[f"out/{_V1_GRAPHS[prefix]}/{rest}"] = value
        elif prefix == "trace":
            out[key] = value
    out["noise/policy_sample"] = arrays["noise"]
    out["episode_noise/stochastic"] = arrays["episode_noise"]
    return out


def golden_layers(path: Path, bundle: Bundle, device: str = "cpu") -> RecordedLayers | None:
    """The layers a golden file recorded (``verify --golden-layers``), as the deploy side's localizer; None if none."""
    _, arrays = read_golden(path)
    if "layers/plan" not in arrays:
        return None
    count = lambda prefix: sum(k.startswith(prefix) for k in arrays)  # noqa: E731
    inputs = [arrays[f"layers/input/{k}"] for k in range(count("layers/input/"))]
    outputs = [arrays[f"layers/output/{k}"] for k in range(count("layers/output/"))]
    plan = LayerPlan.from_dict(loads_strict(str(arrays["layers/plan"]), f"golden file {path}: its layers", UsageError))
    return RecordedLayers(str(arrays["layers/graph"]), plan, arrays["layers/rows"], inputs, outputs, bundle, device)
