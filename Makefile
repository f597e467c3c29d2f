# Everything a fresh machine needs: `make demo` and `make test` create/refresh .venv and the Lite SDK first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LITE_RUNNER := .lite/bin/msrl-lite-runner
LITE_CONVERT := .lite/bin/msrl-lite-convert
LITE_AARCH64 := .lite/bin-aarch64/msrl-lite-runner
AARCH64_TOOLS := g++-aarch64-linux-gnu qemu-user
RUNNER_SRC := $(wildcard inference/lite/runner/*.cc inference/lite/runner/*.h)
export GLOG_v ?= 3

.PHONY: setup lite lite-aarch64 aarch64-tools browser deploy-venv demo test gate gate-aarch64 lint bench clean

# The training distribution depends on the deploy one (./inference, on no index): both in one command, so the
# installer takes the local checkout for that dependency.
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The packages install with uv, which pip puts in the venv: MindSpore alone unpacks to 2.5 GB, and uv unpacks wheels
# in parallel (on 2 cores the whole install took 17 s where pip took 52). uv reads no pip.conf: where it cannot
# install (an index only pip is configured for, no uv wheel for this platform), pip installs, as it did before;
# INSTALLER=pip skips uv (an index policy uv would bypass). install(REQUIREMENTS): one resolution for all of them.
INSTALLER ?= uv
PIP_INSTALL = $(PY) -m pip install -q --no-compile $(1)
ifeq ($(INSTALLER),pip)
install = $(PIP_INSTALL)
else
install = ( $(PY) -m pip install -q --only-binary=:all: uv && $(VENV)/bin/uv pip install -q --python $(PY) $(1) ) \
	|| { echo "uv could not install; pip installs instead" >&2; $(PIP_INSTALL); }
endif

# Neither installer byte-compiles here (pip would on one core, ~23 s for 10k files); compileall does it on every core,
# skipping the packages no command here imports (PyOpenGL's 2.9k files, pip, setuptools), and adds this checkout's
# own packages (installed editable: never compiled, and each process compiles them again where
# PYTHONDONTWRITEBYTECODE is set). A file edited later is compiled on import as before; as with pip, a file that
# does not compile is left to compile on import.
NOT_IMPORTED := /site-packages/(OpenGL|pip|setuptools|pkg_resources)/
$(STAMP): pyproject.toml inference/pyproject.toml | $(PY)
	$(call install,-e ./inference -e ".[dev]")
	-$(PY) -m compileall -q -j 0 -x '$(NOT_IMPORTED)' msrl_consistency inference tests \
		$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null 2>&1
	@touch $(STAMP)

# The Lite builds need only the venv's pip (it fetches the SDK wheel), not the installed packages: `setup` runs them
# while the packages install (on 2 cores a fresh clone's set-up took 77 s instead of 87).
$(LITE_RUNNER) $(LITE_CONVERT) &: $(RUNNER_SRC) export/lite_converter.cc inference/lite/build_lite.sh | $(PY)
	bash inference/lite/build_lite.sh
	@touch $(LITE_RUNNER) $(LITE_CONVERT)

setup: | $(PY)
	$(MAKE) --no-print-directory -j3 $(STAMP) $(LITE_RUNNER) lite-aarch64

lite: $(LITE_RUNNER)

# The browser test (tests/test_report_page.py) opens report.html in headless Chromium: Debian's chromium package and
# a font. As root (CI) this installs them; elsewhere it says the command (without Chromium the test skips, under CI
# it fails).
BROWSER_PACKAGES := chromium fonts-dejavu-core
browser:
	@if command -v chromium >/dev/null; then echo "chromium: $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(BROWSER_PACKAGES) >/dev/null && echo "chromium: $$(command -v chromium)"; \
	else echo "the browser test needs Chromium: sudo apt-get install $(BROWSER_PACKAGES)" >&2; exit 1; fi

# lite-aarch64, Lite's ARM kernels under qemu-user: PyPI's aarch64 SDK, cross-built where the cross compiler and qemu
# are installed (`make aarch64-tools`). Elsewhere one line says what to install; with MSRL_REQUIRE_AARCH64=1 (CI) that
# is an error. On an aarch64 host the `lite` runtime already runs the ARM kernels.
$(LITE_AARCH64): $(RUNNER_SRC) inference/lite/build_lite.sh | $(PY)
	bash inference/lite/build_lite.sh --arch aarch64 --runner-only
	@touch $(LITE_AARCH64)

lite-aarch64:
	@if [ "$$(uname -m)" = aarch64 ]; then \
		echo "lite-aarch64: this host is aarch64, the lite runtime runs Lite's ARM kernels"; \
	elif command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory $(LITE_AARCH64); \
	elif [ "$${MSRL_REQUIRE_AARCH64:-0}" = 1 ]; then \
		echo "error: lite-aarch64 needs aarch64-linux-gnu-g++ and qemu-aarch64: apt-get install $(AARCH64_TOOLS)" >&2; \
		exit 1; \
	else \
		echo "lite-aarch64 not built (verify on Lite's ARM kernels): apt-get install $(AARCH64_TOOLS), or make aarch64-tools"; \
	fi

# The Debian packages lite-aarch64 needs, on a developer machine (sudo unless root).
aarch64-tools:
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -q
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(AARCH64_TOOLS)

# The deploy side alone, as on an inference box: a separate venv with `pip install ./inference` (no MindSpore)
# and the runner built into it against the Lite SDK of .lite/sdk (or MSRL_LITE_SDK=DIR).
DEPLOY_VENV := .venv-deploy
deploy-venv: $(LITE_RUNNER)
	rm -rf $(DEPLOY_VENV)
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/python -m pip install -q ./inference
	$(DEPLOY_VENV)/bin/python -m inference.build_runner --sdk $${MSRL_LITE_SDK:-.lite/sdk} \
		--out $(CURDIR)/$(DEPLOY_VENV)/bin --runner-only
	cd $(DEPLOY_VENV) && bin/msrl-doctor  # outside the checkout: the installed package and its runner

demo: setup
	rm -rf runs/demo-cartpole bundles/demo-cartpole
	$(PY) -m msrl_consistency.train --env-id CartPole-v1 --run-dir runs/demo-cartpole
	$(PY) -m msrl_consistency.export --ckpt runs/demo-cartpole/checkpoint.ckpt --out bundles/demo-cartpole
	$(PY) -m msrl_consistency.verify --mindir bundles/demo-cartpole/policy.mindir \
		--ckpt runs/demo-cartpole/checkpoint.ckpt --out reports/demo-cartpole

# Tests run on every logical CPU (pytest-xdist; at most 4 workers: each holds a MindSpore runtime). The longest
# tests are subprocess-heavy (msrun ranks, g++ builds, venvs), so 2 workers on 2 cores cut the suite by ~40%.
# --dist loadfile: a test file runs on one worker, so its module fixtures (trained runs, exported bundles) are built
# once, not on every worker that runs some of its tests. TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= logical
PYTEST_XDIST = -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile
test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q $(PYTEST_XDIST)

# The inner loop: every test not marked slow (end-to-end training, msrun, venv builds, full verifies).
quick: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q $(PYTEST_XDIST) -m "not slow"

# The consistency gate CI runs: for each env, a small policy, a full export, and verify must exit 0.
GATE_ENVS := CartPole-v1 Pendulum-v1
define gate_env
	$(PY) -m msrl_consistency.train --env-id $(1) --total-steps 8192 --run-dir runs/gate-$(1) \
		--progress false --eval-episodes 3
	$(PY) -m msrl_consistency.export --ckpt runs/gate-$(1)/checkpoint.ckpt --out bundles/gate-$(1) \
		--require-lite --force
	$(PY) -m msrl_consistency.verify --mindir bundles/gate-$(1)/policy.mindir \
		--ckpt runs/gate-$(1)/checkpoint.ckpt --require ms-mindir,lite,onnxruntime --out reports/gate-$(1)

endef

gate: setup
	rm -rf runs/gate-* bundles/gate-* reports/gate-*
	$(foreach env,$(GATE_ENVS),$(call gate_env,$(env)))

# The gate's bundles (make gate first) on Lite's ARM kernels, emulated: lite-aarch64 required, never skipped.
define gate_aarch64
	$(PY) -m msrl_consistency.verify --mindir bundles/gate-$(1)/policy.mindir \
		--ckpt runs/gate-$(1)/checkpoint.ckpt --runtimes lite-aarch64 --require lite-aarch64 \
		--out reports/gate-$(1)-aarch64

endef

gate-aarch64: lite-aarch64
	$(foreach env,$(GATE_ENVS),$(call gate_aarch64,$(env)))

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# pip, as configured: PyTorch's CPU wheel comes from the index or find-links pip.conf names (uv would take PyPI's
# CUDA build of the same version).
bench: setup
	$(PY) -m pip install -q -e ./inference -e ".[bench,box2d]"
	$(PY) bench/train_throughput.py
	$(PY) bench/update_cost.py
	$(PY) bench/inference_latency.py
	$(PY) bench/verify_speed.py

clean:
	rm -rf runs bundles reports build .pytest_cache .ruff_cache rank_0
