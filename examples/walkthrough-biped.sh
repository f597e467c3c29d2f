#!/usr/bin/env bash
# BipedalWalker-v3 with the 256-256-128 network (needs the box2d extra; a 3M-step run takes hours on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
make setup
$PY -m pip install -q -e ".[box2d]"
$PY -m msrl_consistency.train --env-id BipedalWalker-v3 --run-dir runs/biped "$@"   # e.g. --total-steps 200000
$PY -m msrl_consistency.export --ckpt runs/biped/checkpoint.ckpt --out bundles/biped --force
$PY -m msrl_consistency.verify --mindir bundles/biped/policy.mindir --ckpt runs/biped/checkpoint.ckpt --out reports/biped
