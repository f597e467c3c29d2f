"""Everything that needs no MindSpore, so an inference box runs it as it is (``pip install ./inference``).

The bundle format and the policy contract, the runtimes without MindSpore (the Lite runner and its NumPy client,
ONNX Runtime), the comparison and its reports, and the deploy commands (``check``, ``doctor``, ``bench``,
``play``). The training package builds on this one, never the other way round.
"""

from inference.lite_client import (
    DeviceUnavailable,
    FeedError,
    InferenceError,
    LiteRunner,
    LiteRunnerError,
    MindIRVersionError,
    ModelLoadError,
    RunnerCrashed,
    RunnerTimeout,
    RunnerUnavailable,
    TensorMeta,
    runner_available,
    runner_path,
)

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
    "TensorMeta",
    "runner_available",
    "runner_path",
]
