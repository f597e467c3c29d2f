"""Shared fixtures. MindSpore settings are process-global, so every test sets up through ``compat``."""

from __future__ import annotations

import os

os.environ.setdefault("GLOG_v", "3")

import pytest  # noqa: E402

from msrl_consistency import compat  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _mindspore_cpu() -> None:
    compat.set_device("cpu")
    compat.set_threads(1)
