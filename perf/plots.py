"""PNG plots of a perf run's result: throughput over time, the latency CDFs, allocation over
time. Drawn with matplotlib's non-interactive Agg backend from the result JSON alone, so a
stored result can be plotted again (`write_plots(result, directory)`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)

PLOTS = ("throughput.png", "latency_cdf.png", "allocation.png")


def write_plots(result: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write the three plots of `result` into `directory`; returns their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    name = result.get("scenario", "run")
    paths = []

    fig, ax = plt.subplots(figsize=(8, 3.5))
    series = result.get("throughput_series", [])
    ax.step(range(len(series)), series, where="post")
    ax.axhline(result.get("throughput_pods_per_s", 0.0), linestyle="--", label="average")
    ax.set(title=f"{name}: bindings per second", xlabel="seconds from the first pod published", ylabel="pods/s")
    ax.legend()
    paths.append(_save(fig, out / PLOTS[0]))

    fig, ax = plt.subplots(figsize=(8, 3.5))
    cdfs = result.get("latency_cdf_ms", {})
    for label, points in cdfs.items():
        if points:
            ax.plot(points, [100.0 * (i + 1) / len(points) for i in range(len(points))], label=label)
    ax.set(title=f"{name}: latency CDF", xlabel="milliseconds", ylabel="% of pods")
    if any(cdfs.values()):
        ax.legend()
    paths.append(_save(fig, out / PLOTS[1]))

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for resource, values in result.get("allocation_series_pct", {}).items():
        ax.plot(range(len(values)), values, label=resource)
    ax.set(title=f"{name}: allocated share of the cluster", xlabel="seconds from the first pod published",
           ylabel="%", ylim=(0, 100))
    if result.get("allocation_series_pct"):
        ax.legend()
    paths.append(_save(fig, out / PLOTS[2]))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
