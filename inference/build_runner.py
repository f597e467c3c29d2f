"""``python -m inference.build_runner [--sdk DIR] [--out DIR] [--runner-only] [--arch aarch64]``: build the Lite runner.

Runs ``lite/build_lite.sh`` (shipped inside this package) so an installed deploy package can build its runner
against the device's Lite SDK with one command. Outside a source checkout the runner goes to this
environment's ``bin`` (where ``LiteRunner`` looks for it) and a fetched PyPI SDK to ``<prefix>/share/msrl-lite``.

``--arch aarch64`` on another host builds the ``lite-aarch64`` runtime's runner: PyPI's aarch64 Lite SDK, the cross
compiler, and qemu-user to run it (Debian: ``apt-get install g++-aarch64-linux-gnu qemu-user``); it goes to
``.lite/bin-aarch64`` in a checkout, ``<prefix>/share/msrl-lite/bin-aarch64`` when installed
(``inference.lite.emulation``).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def in_checkout() -> bool:
    """True when this package runs from its source folder (an installed copy ships no ``pyproject.toml``): the
    binaries then go to the tree's ``.lite/``, as ``build_lite.sh`` does by default."""
    return (HERE / "pyproject.toml").is_file()


def foreign_arch(args: list[str]) -> bool:
    """``--arch`` names another architecture than this host's (its runner then goes next to its SDK, not to bin)."""
    arch = next((args[k + 1] for k, a in enumerate(args[:-1]) if a == "--arch"), None)
    return arch is not None and arch != platform.machine()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    if not in_checkout():
        if "--out" not in args and not env.get("MSRL_LITE_OUT") and not foreign_arch(args):
            args += ["--out", str(Path(sys.prefix) / "bin")]
        env.setdefault("MSRL_LITE_HOME", str(Path(sys.prefix) / "share" / "msrl-lite"))
    return subprocess.call(["bash", str(HERE / "lite" / "build_lite.sh"), *args], env=env)


if __name__ == "__main__":
    sys.exit(main())
