"""msrl-consistency: train PPO with MindSpore, export it, and prove every runtime acts like training.

Data flow, one sub-package per stage:
``envs`` → ``agent`` (policy Cells, in-graph pre/post-processing) → ``training`` (PPO) → ``artifacts``
(checkpoint, run.json, MindIR/ONNX/.ms, manifest) → ``runtimes`` → ``compare`` → ``report``.
"""

__version__ = "0.1.0"

import os as _os

# Silence MindSpore's WARNING-level log lines (e.g. nn.Adam's FusedSparseAdam deprecation). GLOG_v is read
# when mindspore is first imported, so it must be set here, before any submodule imports it.
_os.environ.setdefault("GLOG_v", "3")
