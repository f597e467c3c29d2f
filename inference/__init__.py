"""Deploy-side inference: a NumPy-only client for the MindSpore Lite runner process."""

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
