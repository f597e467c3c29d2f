"""Shared fixtures. MindSpore settings are process-global, so every test sets up through ``compat``."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")

import pytest  # noqa: E402

from msrl_consistency import compat  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Under CI a runner build that broke fails the suite at once: the Lite path's tests never skip there (nor
    lite-aarch64's, with MSRL_REQUIRE_AARCH64=1)."""
    import lite_build

    missing = [p for p in (lite_build.runner_path(), *(lite_build.runner_path().with_name(n) for n in
               ("msrl-lite-runner-test", "msrl-lite-convert"))) if not p.is_file()]  # fmt: skip
    if lite_build.required() and (missing or not lite_build.BUILT):
        why = lite_build.WHY_NOT if not lite_build.BUILT else f"{missing[0]} not built"
        raise pytest.UsageError(f"the Lite runner is required here (CI / MSRL_REQUIRE_RUNNER=1): {why}")
    why_not_arm = lite_build.aarch64_why_not() if lite_build.aarch64_required() else None
    if why_not_arm is not None:  # likewise Lite's ARM kernels, where CI installed what they need
        raise pytest.UsageError(f"lite-aarch64 is required here (MSRL_REQUIRE_AARCH64=1): {why_not_arm}")


REPO = Path(__file__).resolve().parents[1]
_NOT_OURS = {".git", ".venv", ".venv-deploy", ".lite", "__pycache__", ".pytest_cache", ".ruff_cache"}


def _checkout_files() -> set[str]:
    found = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _NOT_OURS and not d.endswith(".egg-info")]
        found.update(os.path.relpath(os.path.join(root, f), REPO) for f in files)
    return found


@pytest.fixture(scope="session", autouse=True)
def _checkout_left_alone():
    """No test writes into the checkout: everything a test makes lives in its temporary directory."""
    before = _checkout_files()
    yield
    new = sorted(_checkout_files() - before)
    assert not new, f"tests wrote into the checkout: {new[:10]}"


@pytest.fixture(scope="session", autouse=True)
def _mindspore_cpu() -> None:
    compat.set_device("cpu")
    compat.set_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _private_compile_cache(tmp_path_factory) -> None:
    """Training CLIs started by the tests cache their graphs here, not in the user's ~/.cache."""
    os.environ["MSRL_COMPILE_CACHE_DIR"] = str(tmp_path_factory.mktemp("graph-cache"))


import dataclasses  # noqa: E402
from pathlib import Path  # noqa: E402

from msrl_consistency.artifacts import run_dir as rd  # noqa: E402
from msrl_consistency.config import TrainConfig  # noqa: E402
from msrl_consistency.training.run import RunResult  # noqa: E402

# One update per compiled call: the smallest train-step graph (2 per call compile ~0.45 s longer). Grouped updates
# keep their tests: test_training.py's epoch-boundary and updates-per-call tests; test_compile_cache.py,
# test_data_parallel.py and test_update_precision.py train with 2 per call.
TINY_RUN = dict(num_envs=2, num_steps=32, num_minibatches=2, update_epochs=2, updates_per_call=1,
                checkpoint_every=100, progress=False, eval_episodes=0)  # fmt: skip


class SimulatedCrash(Exception):
    """What ``run_trainer(stop_at=N)`` raises as iteration N + 1 starts: the run ends there as a killed one would."""


def run_trainer(cfg: TrainConfig, run_dir: Path, stop_at: int | None = None, resume: bool = False) -> RunResult | None:
    """Train in-process through ``msrl_consistency.train_policy(config)``, as ``python -m msrl_consistency.train`` does.

    ``stop_at`` "crashes" the run once that many iterations are done (the last checkpoint is the periodic one; no
    result), ``resume`` continues the run in ``run_dir`` from its checkpoint. The compile cache stays off: MindSpore
    keeps the first cache path of a process, and would put this test process's later graph-kernel builds there.
    """
    from msrl_consistency import train_policy as train

    cfg = dataclasses.replace(cfg, run_dir=str(run_dir), resume=str(run_dir) if resume else "", compile_cache=False)
    if stop_at is None:
        return train(cfg)

    def crash(trainer) -> None:
        if trainer.iteration == stop_at:
            raise SimulatedCrash(f"after iteration {stop_at}")

    with pytest.raises(SimulatedCrash):
        train(cfg, on_iteration=crash)
    return None


def train_tiny(run_dir: Path, env_id: str, seed: int = 1, total_steps: int = 256) -> Path:
    """A few PPO iterations: enough for non-trivial normalisation statistics and weights."""
    run_trainer(TrainConfig(env_id=env_id, seed=seed, total_steps=total_steps, **TINY_RUN), run_dir)
    return run_dir / rd.CHECKPOINT


@pytest.fixture(scope="session")
def cartpole_ckpt(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("runs") / "cartpole", "CartPole-v1")


@pytest.fixture(scope="session")
def pendulum_ckpt(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("runs") / "pendulum", "Pendulum-v1")


@pytest.fixture(scope="session")
def cartpole_bundle(cartpole_ckpt, tmp_path_factory):
    from msrl_consistency.api import export_run
    from msrl_consistency.artifacts.bundle import ExportOptions

    return export_run(cartpole_ckpt, tmp_path_factory.mktemp("bundles") / "cartpole", ExportOptions())


@pytest.fixture(scope="session")
def pendulum_bundle(pendulum_ckpt, tmp_path_factory):
    from msrl_consistency.api import export_run
    from msrl_consistency.artifacts.bundle import ExportOptions

    return export_run(pendulum_ckpt, tmp_path_factory.mktemp("bundles") / "pendulum", ExportOptions())
