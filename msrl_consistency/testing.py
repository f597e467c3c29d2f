"""The one-liner a team puts in its own CI: ``assert_policy_consistent`` fails a pytest test with the table of
the failing checks.

    from msrl_consistency.testing import assert_policy_consistent

    def test_deployed_policy_matches_training():
        assert_policy_consistent(make_policy(), "contract.toml", "policy_model.mindir", checkpoint="policy.ckpt")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.compare.checks import VerifyResult
from inference.compare.judge.stats import Tolerance
from inference.compare.verifier import VerifyOptions
from inference.report.writers import write_reports
from msrl_consistency.api import CellLike, ContractLike, verify_policy


def assert_policy_consistent(
    cell: CellLike,
    contract: ContractLike | None,
    model: str | Path,
    *,
    checkpoint: str | Path | None = None,
    env_id: str | None = None,
    env: str | Callable[[], Any] | None = None,
    observations: str | Path | np.ndarray | None = None,
    runtimes: Sequence[str] | None = None,
    require: Sequence[str] = (),
    n_observations: int = 2000,
    episodes: int = 5,
    seed: int = 0,
    tolerance: str | None = None,
    tol: dict[str, tuple[float, float]] | None = None,
    report_dir: str | Path | None = None,
) -> VerifyResult:
    """Verify ``model`` (a MindIR or bundle) against ``cell``; ``AssertionError`` with the failing checks if not.

    Defaults are smaller than the CLI's (2,000 observations, 5 episodes per mode) to keep a test quick; every
    argument of ``verify_policy`` is available. Reports are written to ``report_dir`` when given.
    """
    options = VerifyOptions(
        observations=n_observations,
        episodes=episodes,
        seed=seed,
        tolerance=tolerance,
        overrides={k: Tolerance(*v) for k, v in (tol or {}).items()},
        runtimes=tuple(runtimes) if runtimes is not None else None,
        required=tuple(require),
    )
    result = verify_policy(
        cell, contract, model, checkpoint=None if checkpoint is None else Path(checkpoint), env_id=env_id, env=env,
        observations=observations, options=options,
    )  # fmt: skip
    if report_dir is not None:
        write_reports(result, report_dir)
    if not result.ok:
        what = "does not act like the training path" if result.failed else "could not be verified"
        raise AssertionError(f"{model} {what}:\n{result.console_table(only_failed=True)}")
    return result
