"""PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from inference.bundle.files import atomic_path  # noqa: E402
from msrl_consistency.artifacts.run_dir import read_log  # noqa: E402


def plot_reward_curve(episodes_csv: Path, out: Path, title: str) -> bool:
    """Episode returns against env steps, with a moving average; False when there is nothing to plot."""
    rows = read_log(episodes_csv)
    if not rows:
        return False
    steps = np.array([int(r["global_step"]) for r in rows])
    returns = np.array([float(r["return"]) for r in rows])
    window = max(1, min(20, len(returns) // 5))
    smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, returns, ".", alpha=0.25, label="episode return")
    ax.plot(steps[window - 1 :], smooth, lw=2, label=f"moving average ({window})")
    ax.set(xlabel="environment steps", ylabel="return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return True
