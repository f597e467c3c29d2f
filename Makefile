# Everything a fresh machine needs: `make demo` and `make test` create/refresh .venv and the Lite SDK first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LITE_RUNNER := .lite/bin/msrl-lite-runner
LITE_CONVERT := .lite/bin/msrl-lite-convert
export GLOG_v ?= 3

.PHONY: setup lite demo test gate lint bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

$(LITE_RUNNER) $(LITE_CONVERT) &: inference/lite_runner.cc export/lite_converter.cc inference/build_lite.sh $(STAMP)
	bash inference/build_lite.sh

setup: $(STAMP) $(LITE_RUNNER)

lite: $(LITE_RUNNER)

demo: setup
	rm -rf runs/demo-cartpole bundles/demo-cartpole
	$(PY) -m msrl_consistency.train --env-id CartPole-v1 --run-dir runs/demo-cartpole
	$(PY) -m msrl_consistency.export --ckpt runs/demo-cartpole/checkpoint.ckpt --out bundles/demo-cartpole
	$(PY) -m msrl_consistency.verify --mindir bundles/demo-cartpole/policy.mindir \
		--ckpt runs/demo-cartpole/checkpoint.ckpt --out reports/demo-cartpole

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q

# The consistency gate CI runs: small policies, full export, verify must exit 0.
gate: setup
	rm -rf runs/gate-* bundles/gate-* reports/gate-*
	$(PY) -m msrl_consistency.train --env-id CartPole-v1 --total-steps 8192 --run-dir runs/gate-cartpole \
		--progress false --eval-episodes 3
	$(PY) -m msrl_consistency.export --ckpt runs/gate-cartpole/checkpoint.ckpt --out bundles/gate-cartpole \
		--require-lite --force
	$(PY) -m msrl_consistency.verify --mindir bundles/gate-cartpole/policy.mindir \
		--ckpt runs/gate-cartpole/checkpoint.ckpt --require ms-mindir,lite,onnxruntime --out reports/gate-cartpole
	$(PY) -m msrl_consistency.train --env-id Pendulum-v1 --total-steps 8192 --run-dir runs/gate-pendulum \
		--progress false --eval-episodes 3
	$(PY) -m msrl_consistency.export --ckpt runs/gate-pendulum/checkpoint.ckpt --out bundles/gate-pendulum \
		--require-lite --force
	$(PY) -m msrl_consistency.verify --mindir bundles/gate-pendulum/policy.mindir \
		--ckpt runs/gate-pendulum/checkpoint.ckpt --require ms-mindir,lite,onnxruntime --out reports/gate-pendulum

lint: $(STAMP)
	$(PY) -m ruff check .

bench: setup
	$(PY) -m pip install -q -e ".[bench,box2d]"
	$(PY) bench/train_throughput.py
	$(PY) bench/inference_latency.py
	$(PY) bench/verify_speed.py

clean:
	rm -rf runs bundles reports build .pytest_cache .ruff_cache rank_0
