#!/usr/bin/env bash
# Train → export → verify → report for Pendulum-v1 (continuous actions, Gaussian head, clip + rescale in graph).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
make setup
$PY -m msrl_consistency.train --env-id Pendulum-v1 --seed 1 --run-dir runs/pendulum        # preset: 150k steps
$PY -m msrl_consistency.export --ckpt runs/pendulum/checkpoint.ckpt --out bundles/pendulum --force
$PY -m msrl_consistency.verify --mindir bundles/pendulum/policy.mindir --ckpt runs/pendulum/checkpoint.ckpt \
    --out reports/pendulum --save-golden reports/pendulum/golden.npz
$PY -m inference.play bundles/pendulum --episodes 5                                      # deploy side, Lite
# On a deploy box without MindSpore: compare Lite against the recorded reference.
$PY -m msrl_consistency.verify --bundle bundles/pendulum --golden reports/pendulum/golden.npz --out reports/pendulum-golden
# fp16 artefact: expected to FAIL under fp32 tolerance (diagnosis: precision) and pass under fp16.
$PY -m msrl_consistency.export --ckpt runs/pendulum/checkpoint.ckpt --out bundles/pendulum-fp16 --precision fp16 --force
$PY -m msrl_consistency.verify --bundle bundles/pendulum-fp16 --ckpt runs/pendulum/checkpoint.ckpt --tolerance fp32 \
    --out reports/pendulum-fp16 || echo "fp16 under fp32 tolerance: inconsistent, as expected (exit $?)"
