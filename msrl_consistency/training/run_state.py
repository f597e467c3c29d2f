"""What a checkpoint takes from a Trainer and ``--resume`` gives back: resume.state's content and run.json's, as
methods of the Trainer (``RunState``, a base of ``training.loop.Trainer``), which owns what they read.

resume.state holds what every rank shares once (Parameters with the optimizer moments, statistics, counters) and,
under ``ranks``, what each rank owns (its RNG streams, envs and unfinished episodes): with it a resumed run is
bitwise the uninterrupted one. The files themselves are written by ``artifacts/run_dir.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from msrl_consistency import compat
from msrl_consistency.agent.lowered import lowered_numerics
from msrl_consistency.agent.preprocess import RunningMeanStd
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.checkpoint import restore_parameters
from msrl_consistency.training.profile import peak_rss_mb
from msrl_consistency.training.rollout import REWARD_CLIP, reward_factor
from msrl_consistency.training.seeds import resume_reset_seed, seed_plan


class RunState:
    """The Trainer's checkpoint and resume methods. They read and restore the Trainer's own attributes, set in
    ``training.loop.Trainer.__init__`` (config, compiled Cells, statistics, counters, rollout)."""

    def shared_state(self, named: dict[str, np.ndarray]) -> dict[str, Any]:
        """What every rank holds identically (``named``: the ``named_state()`` that the consistency check checked)."""
        return {
            "env_id": self.cfg.env_id,
            "world_size": self.world_size,
            "iteration": self.iteration,
            "global_step": self.global_step,
            "episodes": self.episodes,
            "params": {p.name: named[p.name] for p in self.train_step.get_parameters()},
            "rms": (self.rms.mean, self.rms.var, self.rms.count),
            "ret_rms": (self.ret_rms.mean, self.ret_rms.var, self.ret_rms.count),
        }

    def local_state(self) -> dict[str, Any]:
        """What this rank alone owns: its RNG streams, envs and unfinished episodes."""
        rollout = self.rollout
        blobs = rollout.envs.get_attr("state_blob")
        return {
            "noise_rng": rollout.noise_rng.bit_generator.state,
            "shuffle_rng": self.updater.shuffle_rng.bit_generator.state,
            "obs": rollout.obs,
            "env_blobs": None if any(b is None for b in blobs) else list(blobs),
            "ep_return": rollout.ep_return,
            "ep_length": rollout.ep_length,
            "disc_return": rollout.disc_return,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a ``resume.state`` (see ``rd.load_resume_state``) with the same world size."""
        rd.check_world_size(self.run_dir, state["world_size"], self.world_size)
        restore_parameters({p.name: p for p in self.train_step.get_parameters()}, state["params"], "resume state")
        self.rms = RunningMeanStd(*state["rms"])
        self.rms.copy_to(self.policy.normalizer)
        if "ret_rms" in state:  # resume states from before --normalize-reward hold neither
            self.ret_rms = RunningMeanStd(*state["ret_rms"])
        self.iteration, self.global_step = state["iteration"], state["global_step"]
        self.episodes = state["episodes"]
        mine, rollout = state["ranks"][self.rank], self.rollout
        rollout.noise_rng.bit_generator.state = mine["noise_rng"]
        self.updater.shuffle_rng.bit_generator.state = mine["shuffle_rng"]
        rollout.ep_return, rollout.ep_length = mine["ep_return"], mine["ep_length"]
        rollout.disc_return = mine.get("disc_return", np.zeros(self.cfg.num_envs))
        if mine["env_blobs"] is not None:
            rollout.envs.set_attr("state_blob", mine["env_blobs"])
            rollout.obs = mine["obs"]
        else:
            # Envs holding C handles cannot be snapshotted: restart their episodes from a derived seed.
            self.resume_exact = False
            rollout.reset(resume_reset_seed(rollout.env_seed, self.iteration))
            rollout.ep_return[:], rollout.ep_length[:] = 0.0, 0
            rollout.disc_return[:] = 0.0

    def trained_scales(self) -> dict[str, Any]:
        """An int8 actor's calibrated ranges and the scales and zero points they give (the checkpoint holds them)."""
        actor = self.policy.actor
        if actor.lower != "int8":
            return {}
        return {"ranges": actor.ranges.asnumpy().tolist(), "scales_zero_points": actor.qparams.asnumpy().tolist()}

    def run_info(self, eval_returns: list[float] | None = None) -> dict[str, Any]:
        """run.json's content for the self as it is now (``rd.run_info`` lays it out)."""
        cfg = self.cfg
        scale = self.train_step.loss_scale
        return rd.run_info(
            cfg=cfg.to_dict(),
            env=self.info.to_dict(),
            policy_spec=self.spec.to_dict(),
            normalization={
                "mean": self.rms.mean.tolist(),
                "var": self.rms.var.tolist(),
                "count": self.rms.count,
                "clip": cfg.clip_obs,
                "enabled": cfg.normalize_obs,
                "reward": {
                    "enabled": cfg.normalize_reward,
                    "return_var": float(self.ret_rms.var[0]),
                    "count": self.ret_rms.count,
                    "factor": reward_factor(cfg, self.ret_rms),
                    "clip": REWARD_CLIP,
                },
            },  # fmt: skip
            seeds=seed_plan(cfg, self.world_size),
            progress={
                "iteration": self.iteration,
                "global_step": self.global_step,
                "episodes": self.episodes,
                "resume_exact": self.resume_exact,
                "env_backend": self.backend.to_dict(),
                "env_steppers": self.rollout.steppers(),
                "stopped_at_return": self.reached_return,
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "rss_mb": self.profile.rss_marks(),
                "private_rss_mb": self.profile.private_rss_marks(),
                "cpu_pin": self.pinning.describe(),
            },
            distributed={
                "world_size": self.world_size,
                "rank_checksums": list(self.rank_checksums),
                "data_parallel": None
                if self.world_size == 1
                else {
                    "backend": compat.collective_backend(cfg.device),
                    "gradients": f"AllReduce mean in the train step, fused ({compat.ALLREDUCE_FUSION_MB} MB buckets)",
                    "advantage_normalisation": cfg.adv_norm_scope,
                    "observation_statistics": "merged over ranks every iteration (count, mean, M2)",
                    "envs_per_rank": cfg.num_envs,
                },
            },  # fmt: skip
            precision={
                "update": cfg.update_precision,
                "master_weights": "fp32",
                "rollouts": "fp32" if cfg.lower == "fp32" else f"actor trunk in {cfg.lower}",
                "actor": {**lowered_numerics(cfg.lower, cfg.keep), **self.trained_scales()},
                "started_from": getattr(self, "started_from", None),
                "loss_scale": None if scale is None else float(scale.scale.asnumpy()),
                "skipped_updates": None if scale is None else int(scale.skipped.asnumpy()),
            },
            versions=self.versions,
            compile_cache=self.compile_cache,
            git_commit=self.git_commit,
            eval_returns=eval_returns,
        )
