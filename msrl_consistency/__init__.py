"""msrl-consistency: train PPO with MindSpore, export it, and prove every runtime acts like training.

The library API (``export_policy``, ``verify_policy``, ``assert_policy_consistent``, ``PolicyContract``,
``localize``) takes any team's own policy Cell, and ``train_policy(config)`` trains ours; it is imported lazily, so
``import msrl_consistency`` stays light (``python -m msrl_consistency.train`` is the command).

Data flow, one sub-package per stage:
``envs`` → ``agent`` (policy Cells, in-graph pre/post-processing) → ``training`` (PPO) → ``artifacts``
(checkpoint, run.json, MindIR/ONNX/.ms, manifest) → ``runtimes`` → ``compare`` → ``report``.
"""

__version__ = "0.1.0"

import os as _os

# Silence MindSpore's WARNING-level log lines (e.g. nn.Adam's FusedSparseAdam deprecation). GLOG_v is read
# when mindspore is first imported, so it must be set here, before any submodule imports it.
_os.environ.setdefault("GLOG_v", "3")


_API = {
    "train_policy": "msrl_consistency.training.run",
    "RunResult": "msrl_consistency.training.run",
    "export_policy": "msrl_consistency.api",
    "export_run": "msrl_consistency.api",
    "verify_policy": "msrl_consistency.api",
    "verify_run": "msrl_consistency.api",
    "PolicyContract": "inference.bundle.contract",
    "assert_policy_consistent": "msrl_consistency.testing",
    "localize": "msrl_consistency.localization",
}


def __getattr__(name: str):  # noqa: ANN202 - lazy: importing the package must not import MindSpore
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'msrl_consistency' has no attribute {name!r}")
