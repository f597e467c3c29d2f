"""``python -m inference.build_runner [--sdk DIR] [--out DIR] [--runner-only]``: build the Lite runner.

Runs ``lite/build_lite.sh`` (shipped inside this package) so an installed deploy package can build its runner
against the device's Lite SDK with one command. Outside a source checkout the runner goes to this
environment's ``bin`` (where ``LiteRunner`` looks for it) and a fetched PyPI SDK to ``<prefix>/share/msrl-lite``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def in_checkout() -> bool:
    """True when this package runs from its source folder (an installed copy ships no ``pyproject.toml``): the
    binaries then go to the tree's ``.lite/``, as ``build_lite.sh`` does by default."""
    return (HERE / "pyproject.toml").is_file()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    if not in_checkout():
        if "--out" not in args and not env.get("MSRL_LITE_OUT"):
            args += ["--out", str(Path(sys.prefix) / "bin")]
        env.setdefault("MSRL_LITE_HOME", str(Path(sys.prefix) / "share" / "msrl-lite"))
    return subprocess.call(["bash", str(HERE / "lite" / "build_lite.sh"), *args], env=env)


if __name__ == "__main__":
    sys.exit(main())
