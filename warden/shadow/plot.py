"""The PNG of both runs' curves, one panel per judged metric (matplotlib, Agg: no display)."""

from __future__ import annotations

import io
import math

from warden.errors import ConfigError
from warden.safeio import atomic_write_bytes
from warden.shadow.align import RunSeries
from warden.shadow.compare import Comparison


def curve(series: RunSeries, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``metric`` in ``series``, by step. Pure."""
    points = sorted((s, m[metric]) for s, m in series.metrics.items() if metric in m)
    return [s for s, _ in points], [v for _, v in points]


def write_png(path: str, a: RunSeries, b: RunSeries, comparison: Comparison, label_a: str, label_b: str) -> None:
    """Writes the figure to ``path`` (atomically): A and B per metric, the first divergence marked."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'warden[shadow]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = list(comparison.metrics)
    cols = 2 if len(names) > 1 else 1
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    first = comparison.first_divergence
    for ax, name in zip(axes.flat, names, strict=False):
        for series, label, style in ((a, label_a, "-o"), (b, label_b, "--x")):
            steps, values = curve(series, name)
            ax.plot(steps, values, style, markersize=3, label=label[-48:])
        if first is not None:
            ax.axvline(first.step, color="red", linewidth=0.8, label=f"first divergence (step {first.step})")
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.suptitle("warden compare: " + ("within tolerance" if first is None else f"diverged at step {first.step}"))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
