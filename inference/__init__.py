"""Everything that needs no MindSpore, so an inference box runs it as it is (``pip install ./inference``).

The bundle format and the policy contract, the runtimes without MindSpore (Lite in this process or in the runner
process, ONNX Runtime), the comparison and its reports, the deploy commands (``check``, ``doctor``, ``bench``,
``play``) and ``load(BUNDLE)``, a bundle's policy for a control loop. The training package builds on this one,
never the other way round.
"""

from inference.lite_client import LiteRunner
from inference.lite_common import (
    DeviceUnavailable,
    InferenceError,
    LiteRunnerError,
    MindIRVersionError,
    ModelLoadError,
    RunnerCrashed,
    RunnerTimeout,
    RunnerUnavailable,
    runner_available,
    runner_path,
)
from inference.policy import Policy, load
from inference.tensors import FeedError, TensorMeta

__all__ = [
    "DeviceUnavailable",
    "FeedError",
    "InferenceError",
    "LiteRunner",
    "LiteRunnerError",
    "MindIRVersionError",
    "ModelLoadError",
    "RunnerCrashed",
    "RunnerTimeout",
    "RunnerUnavailable",
    "Policy",
    "TensorMeta",
    "runner_available",
    "load",
    "runner_path",
]
