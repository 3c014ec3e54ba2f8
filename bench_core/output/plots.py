"""Distribution plots, one per scenario: every sample of each group (this run, each baseline run, each fresh
process the gate started, or A and B), as points over a box of its quartiles, on one time axis. Rendered to PNG
bytes here; `artifacts` writes them. matplotlib is an optional extra: `pip install -e ".[plots]"`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

NEEDS = 'plots need matplotlib, an optional extra: pip install -e ".[plots]" (or pip install matplotlib)'


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def figure(title: str, groups: Sequence[tuple[str, Sequence[float]]], unit: str = "ms"):
    """The figure: one row per group, top to bottom in the order given."""
    import matplotlib

    matplotlib.use("Agg")   # no display on a CI runner
    import matplotlib.pyplot as plt

    labels = [f"{name} (n={len(values)})" for name, values in groups]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(groups)))
    rows = range(len(groups), 0, -1)
    boxes = dict(positions=list(rows), widths=0.5, showfliers=False)
    try:
        ax.boxplot([list(v) for _, v in groups], orientation="horizontal", **boxes)   # matplotlib >= 3.10
    except TypeError:
        ax.boxplot([list(v) for _, v in groups], vert=False, **boxes)
    rng = np.random.default_rng(0)    # the same jitter every time: the same data gives the same picture
    for y, (_, values) in zip(rows, groups):
        ax.scatter(values, y + rng.uniform(-0.15, 0.15, len(values)), s=8, alpha=0.5)
    ax.set_yticks(list(rows), labels)
    ax.set_xlabel(f"time per call ({unit})")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def png(title: str, groups: Sequence[tuple[str, Sequence[float]]], unit: str = "ms") -> bytes:
    import io

    import matplotlib.pyplot as plt

    fig = figure(title, groups, unit)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
