"""PNG plots of a perf run's result: throughput over time, the latency CDFs, allocation over
time (`write_plots`); for the warm pools' runs (`perf.sandbox_run`), the claims' latency CDFs,
the pools' depth over time and allocation over time (`write_sandbox_plots`). Drawn with
matplotlib's non-interactive Agg backend from the result JSON alone, so a stored result can
be plotted again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)

PLOTS = ("throughput.png", "latency_cdf.png", "allocation.png")
SANDBOX_PLOTS = ("claim_latency_cdf.png", "pool_depth.png", "allocation.png")


def write_plots(result: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write the three plots of `result` into `directory`; returns their paths."""
    out = _folder(directory)
    name = result.get("scenario", "run")
    fig, ax = plt.subplots(figsize=(8, 3.5))
    series = result.get("throughput_series", [])
    ax.step(range(len(series)), series, where="post")
    ax.axhline(result.get("throughput_pods_per_s", 0.0), linestyle="--", label="average")
    ax.set(title=f"{name}: bindings per second", xlabel="seconds from the first pod published", ylabel="pods/s")
    ax.legend()
    return [_save(fig, out / PLOTS[0]),
            _latency_cdf(result.get("latency_cdf_ms", {}), f"{name}: latency CDF", "% of pods", out / PLOTS[1]),
            _allocation(result, name, "seconds from the first pod published", out / PLOTS[2])]


def write_sandbox_plots(result: dict[str, Any], directory: str | Path) -> list[Path]:
    """A warm-pool run's plots: the claims' latency CDF per phase (or pool), each pool's depth
    (ready and starting sandboxes) over time, and allocation over time."""
    out = _folder(directory)
    name = result.get("scenario", "run")
    pools = result.get("pool_depth_series", {}) or {"": {"t": [], "ready": [], "starting": []}}
    fig, axes = plt.subplots(len(pools), 1, figsize=(8, 1.2 + 2.0 * len(pools)), squeeze=False)
    for ax, (label, series) in zip(axes[:, 0], pools.items(), strict=True):  # a panel per pool: depths differ a lot
        ax.plot(series["t"], series["ready"], label="ready")
        ax.plot(series["t"], series["starting"], linestyle=":", label="starting")
        ax.set(title=f"{name}: pool depth, {label}", ylabel="sandboxes")
        ax.legend(fontsize="small", loc="upper right")
    axes[-1, 0].set(xlabel="seconds from the first claim")
    depth = _save(fig, out / SANDBOX_PLOTS[1])
    return [_latency_cdf(result.get("latency_cdf_ms", {}), f"{name}: claim latency CDF (to Ready)", "% of claims",
                         out / SANDBOX_PLOTS[0]),
            depth,
            _allocation(result, name, "seconds from the first claim published", out / SANDBOX_PLOTS[2])]


def _latency_cdf(cdfs: dict[str, list[float]], title: str, ylabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for label, points in cdfs.items():
        if points:
            ax.plot(points, [100.0 * (i + 1) / len(points) for i in range(len(points))], label=label)
    ax.set(title=title, xlabel="milliseconds", ylabel=ylabel)
    if any(cdfs.values()):
        ax.legend()
    return _save(fig, path)


def _allocation(result: dict[str, Any], name: str, xlabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for resource, values in result.get("allocation_series_pct", {}).items():
        ax.plot(range(len(values)), values, label=resource)
    ax.set(title=f"{name}: allocated share of the cluster", xlabel=xlabel, ylabel="%", ylim=(0, 100))
    if result.get("allocation_series_pct"):
        ax.legend()
    return _save(fig, path)


def _folder(directory: str | Path) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
