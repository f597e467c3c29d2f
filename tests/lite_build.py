"""Facts about the Lite runner this checkout built (``.lite/bin/msrl-lite-runner.json``), for tests that check what
the runner reports: the SDK decides the version, so tests compare with the build's record, never a pinned number."""

from __future__ import annotations

import json
import os

from inference.lite.common import runner_available, runner_path

BUILT, WHY_NOT = runner_available()
INFO_FILE = runner_path().with_name("msrl-lite-runner.json")
INFO: dict = json.loads(INFO_FILE.read_text()) if INFO_FILE.is_file() else {}
VERSION: str = INFO.get("lite_version", "?")
MAX_MINDIR: int = INFO.get("max_mind_ir_version", -1)


def required() -> bool:
    """Under CI (``CI=true`` or ``MSRL_REQUIRE_RUNNER=1``, which ``.ci/run`` sets) a missing runner fails the suite
    instead of skipping the tests of the Lite path."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("MSRL_REQUIRE_RUNNER") == "1"


# lite-aarch64: the aarch64 runner (`make lite-aarch64`, which `make test` runs where the cross compiler and qemu are).


def aarch64_why_not() -> str | None:
    """Why lite-aarch64 cannot run here (None: it can)."""
    from inference.lite.emulation import unavailable_reason

    return unavailable_reason()


def aarch64_required() -> bool:
    """Under CI (``MSRL_REQUIRE_AARCH64=1``, which ``.ci/run`` sets, after installing the Debian packages) an
    unavailable lite-aarch64 fails its tests instead of skipping them."""
    return os.environ.get("MSRL_REQUIRE_AARCH64") == "1"
