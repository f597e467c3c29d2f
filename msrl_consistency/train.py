"""``python -m msrl_consistency.train``: train PPO and write a run directory that ``export`` consumes.

Exit codes: 0 success, 2 bad input (nothing half-written), 130 interrupted (last checkpoint kept).
"""

from __future__ import annotations

import sys
from pathlib import Path

from inference.errors import UsageError, run_cli
from msrl_consistency.config import TrainConfig, explicit_flags, from_dict, parse_config


def _resume_config(cfg_cli: TrainConfig, argv: list[str]) -> tuple[TrainConfig, Path, dict]:
    """The resumed run keeps its stored config; only --total-steps, --progress and --resume may change."""
    from msrl_consistency.artifacts import run_dir as rd

    run_dir = Path(cfg_cli.resume)
    info = rd.read_run_json(run_dir)
    stored = from_dict({k: v for k, v in info["config"].items() if k in TrainConfig.__dataclass_fields__})
    flags = explicit_flags(argv)
    given_env = flags.get("env_id")
    if given_env and given_env != stored.env_id:
        raise UsageError(f"{run_dir} is a run of {stored.env_id}, not {given_env}")
    state = rd.load_resume_state(run_dir / rd.RESUME_STATE)
    if state.get("env_id") != stored.env_id:
        raise UsageError(f"{run_dir}: resume state is for {state.get('env_id')}, run.json for {stored.env_id}")
    stored.total_steps = flags.get("total_steps", stored.total_steps)
    stored.progress = cfg_cli.progress
    stored.resume, stored.run_dir = str(run_dir), str(run_dir)
    stored.validate()
    return stored, run_dir, state


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(argv)

    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.envs import describe_env

    if cfg.resume:
        cfg, run_dir, state = _resume_config(cfg, argv)
    else:
        run_dir, state = Path(cfg.run_dir), None
        describe_env(cfg.env_id)  # unknown ids and unsupported spaces fail before anything is written
    if cfg.device.lower() != "cpu":
        from msrl_consistency import compat

        try:
            compat.set_device(cfg.device)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if state is None:
        rd.prepare_new_run_dir(run_dir)

    from tqdm import tqdm

    from msrl_consistency.artifacts.plots import plot_reward_curve
    from msrl_consistency.training.loop import Trainer

    trainer = Trainer(cfg, run_dir, state)
    total = cfg.num_iterations * cfg.batch_size
    bar = tqdm(
        total=total,
        initial=trainer.global_step,
        unit="step",
        disable=not cfg.progress,
        desc=cfg.env_id,
        mininterval=0.5 if sys.stderr.isatty() else 30.0,  # CI logs get a line every 30 s, not every iteration
    )
    try:
        if state is None:
            trainer.checkpoint()  # a resumable starting point and a valid run.json from the first second
        trainer.run(bar)
        bar.close()
        eval_returns = trainer.evaluate(cfg.eval_episodes) if cfg.eval_episodes > 0 else []
        trainer.checkpoint(eval_returns)
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted; resume with: --resume {run_dir} (from step {_stored_step(run_dir)})", file=sys.stderr)
        return 130
    finally:
        trainer.close()
        plot_reward_curve(run_dir / rd.EPISODES_CSV, run_dir / rd.REWARD_PLOT, f"PPO on {cfg.env_id}")
    summary = f"trained {cfg.env_id} for {trainer.global_step} steps → {run_dir}"
    if eval_returns:
        summary += (
            f"; deterministic eval return {sum(eval_returns) / len(eval_returns):.1f} over {len(eval_returns)} ep"
        )
    print(summary)
    return 0


def _stored_step(run_dir: Path) -> int | str:
    from msrl_consistency.artifacts import run_dir as rd

    try:
        return rd.read_run_json(run_dir)["global_step"]
    except UsageError:
        return "?"


if __name__ == "__main__":
    run_cli(main)
