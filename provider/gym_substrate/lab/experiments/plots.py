"""PNG plots of experiment results, drawn with matplotlib's Agg canvas.

matplotlib is the optional extra `experiments`; it is imported only here and only when a plot is
drawn, so the base install runs every experiment and writes its CSV and JSON, and the output
says how to get the plots. Figures are built with the object API (`Figure` + `FigureCanvasAgg`)
and never touch pyplot's global state, so drawing is safe from any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_substrate.core.states import STATES
from gym_substrate.lab.experiments._vocab import PHASES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from gym_substrate.lab.experiments._arm_records import ArmResult

__all__ = [
    "PLOTS_MISSING",
    "Plots",
    "arm_plots",
    "bars_plot",
    "compare_plot",
    "ladder_plot",
    "lines_plot",
    "plots_problem",
]

PLOTS_MISSING = (
    "plots skipped: matplotlib is not installed; install the `experiments` extra "
    "(uv sync --extra experiments, or pip install 'gym-substrate[experiments]')"
)

_STATUS_COLOURS = {
    "RUNNING": "#2e7d32",
    "RESUMING": "#f9a825",
    "PAUSING": "#8e24aa",
    "PAUSED": "#1565c0",
    "SUSPENDING": "#6d4c41",
    "SUSPENDED": "#90a4ae",
    "CRASHED": "#000000",
    "REVERTING": "#ff7043",
    "DELETING": "#e0e0e0",
}
_PHASE_COLOURS = {
    "thinking": "#90caf9",
    "waiting": "#e53935",
    "resuming": "#f9a825",
    "executing": "#2e7d32",
    "creating": "#8d6e63",
    "closing": "#bdbdbd",
}


@dataclass
class Plots:
    """The PNGs written (name -> path) and, when some were not, why."""

    files: dict[str, str] = field(default_factory=dict)
    note: str | None = None


def plots_problem() -> str | None:
    """None when plots can be drawn, else the line to print instead."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return PLOTS_MISSING
    return None


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _draw(plots: Plots, name: str, path: Path, draw: Callable[[], Figure]) -> None:
    if plots.note == PLOTS_MISSING:
        return
    problem = plots_problem()
    if problem is not None:
        plots.note = problem
        return
    fig = draw()
    fig.savefig(path, format="png")
    plots.files[name] = str(path)


def _cdf(ax: Axes, values: Sequence[float], label: str, **style: Any) -> None:
    if not values:
        return
    ordered = sorted(values)
    n = len(ordered)
    ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label, **style)


# ---------------------------------------------------------------------------------- arm


def _slots(target: dict[str, Any]) -> int | None:
    """The actor slots of a run's target (`workers` in results written before the slots were)."""
    slots = target.get("slots", target.get("workers"))
    return int(slots) if slots else None


def _occupancy(ax: Axes, result: ArmResult, workers: int | None, *, legend: bool = True) -> None:
    t = [s.t_s for s in result.samples]
    layers = [[s.statuses.get(k, 0) for s in result.samples] for k in STATES]
    ax.stackplot(t, layers, labels=list(STATES), colors=[_STATUS_COLOURS[k] for k in STATES])
    if workers:
        ax.axhline(workers, color="black", linestyle="--", linewidth=1, label="actor slots")
    ax.set_ylabel("actors")
    if legend:
        ax.legend(loc="upper right", fontsize=7, ncol=2)


def arm_plots(result: ArmResult, folder: Path) -> Plots:
    """occupancy.png (actors by status and rollouts by phase over time) and step_latency.png."""
    plots = Plots()
    workers = _slots(result.target)
    title = (
        f"{result.config.name}: {result.config.rollouts} rollouts, policy "
        f"{result.config.policy}, {result.target.get('where', '')}"
    )

    def occupancy() -> Figure:
        fig = _figure(9, 6)
        top, bottom = fig.subplots(2, 1, sharex=True)
        _occupancy(top, result, workers)
        top.set_title(title, fontsize=9)
        t = [s.t_s for s in result.samples]
        layers = [[s.phases.get(k, 0) for s in result.samples] for k in PHASES]
        bottom.stackplot(t, layers, labels=list(PHASES), colors=[_PHASE_COLOURS[k] for k in PHASES])
        bottom.set_ylabel("rollouts")
        bottom.set_xlabel("seconds since the arm started")
        bottom.legend(loc="upper right", fontsize=7, ncol=3)
        return fig

    def latency() -> Figure:
        fig = _figure(9, 4)
        left, right = fig.subplots(1, 2)
        ok = [s for s in result.steps if not s.failure]
        left.hist([s.total_s for s in ok], bins=40, color="#1565c0")
        left.set_xlabel("step latency, s (think time excluded)")
        left.set_ylabel("steps")
        left.set_title(f"{result.config.name}: {len(ok)} steps", fontsize=9)
        _cdf(right, [s.total_s for s in ok], "total")
        _cdf(right, [s.exec_s for s in ok], "exec")
        _cdf(right, [s.resume_s for s in ok if s.resumed], "resume (resumed steps)")
        _cdf(right, [s.wait_s for s in ok if s.resumed], "wait for a worker (resumed steps)")
        right.set_xlabel("seconds")
        right.set_ylabel("fraction of steps")
        right.legend(fontsize=7)
        return fig

    _draw(plots, "occupancy_plot", folder / "occupancy.png", occupancy)
    _draw(plots, "latency_plot", folder / "step_latency.png", latency)
    return plots


# ---------------------------------------------------------------------------------- compare


def compare_plot(results: Sequence[ArmResult], path: Path) -> Plots:
    """One figure for a comparison: throughput bars, latency CDFs, occupancy of each arm."""
    plots = Plots()

    def draw() -> Figure:
        fig = _figure(11, 3 + 2.2 * len(results))
        grid = fig.add_gridspec(1 + len(results), 2)
        bars = fig.add_subplot(grid[0, 0])
        names = [r.config.name for r in results]
        bars.bar(names, [r.summary.get("rollouts_per_min") or 0 for r in results], color="#2e7d32")
        bars.set_ylabel("rollouts / min")
        bars.set_title("throughput", fontsize=9)
        cdf = fig.add_subplot(grid[0, 1])
        for r in results:
            _cdf(cdf, [s.total_s for s in r.steps if not s.failure], r.config.name)
        cdf.set_xlabel("step latency, s")
        cdf.set_ylabel("fraction of steps")
        cdf.set_title("step latency (CDF)", fontsize=9)
        cdf.legend(fontsize=7)
        for row, r in enumerate(results, start=1):
            ax = fig.add_subplot(grid[row, :])
            _occupancy(ax, r, _slots(r.target), legend=row == 1)
            ax.set_title(
                f"{r.config.name}: {r.config.rollouts} rollouts, policy {r.config.policy}",
                fontsize=9,
            )
        ax.set_xlabel("seconds since the arm started")
        return fig

    _draw(plots, "compare_plot", path, draw)
    return plots


# ---------------------------------------------------------------------------------- ladder


def ladder_plot(rows: Sequence[Mapping[str, Any]], path: Path, knee: float | None) -> Plots:
    """Throughput and p95 step latency against concurrency (think arms and burn arms)."""
    plots = Plots()

    def draw() -> Figure:
        fig = _figure(9, 5)
        ax = fig.subplots()
        other = ax.twinx()
        for kind, marker in (("think", "o"), ("burn", "s"), ("baseline", "*")):
            picked = [r for r in rows if r.get("kind") == kind and r.get("concurrency_x")]
            if not picked:
                continue
            xs = [float(r["concurrency_x"]) for r in picked]
            ax.plot(
                xs,
                [r.get("rollouts_per_min") or 0 for r in picked],
                marker=marker,
                markersize=10 if kind == "baseline" else 6,
                linestyle="-" if kind == "think" else "none",
                color="#2e7d32",
                label=f"rollouts/min ({kind})",
            )
            other.plot(
                xs,
                [r.get("step_p95_s") or 0 for r in picked],
                marker=marker,
                linestyle="--" if kind == "think" else "none",
                color="#c62828",
                label=f"p95 step latency ({kind})",
            )
        if knee is not None:
            ax.axvline(knee, color="black", linestyle=":", label=f"knee at {knee:g}x")
        ax.set_xlabel("concurrent rollouts / worker slots (x)")
        ax.set_ylabel("rollouts / min", color="#2e7d32")
        other.set_ylabel("p95 step latency, s", color="#c62828")
        lines, labels = ax.get_legend_handles_labels()
        more, more_labels = other.get_legend_handles_labels()
        ax.legend(lines + more, labels + more_labels, fontsize=7, loc="upper left")
        ax.set_title("saturation ladder", fontsize=9)
        return fig

    _draw(plots, "ladder_plot", path, draw)
    return plots


# ---------------------------------------------------------------------------------- generic


def lines_plot(
    path: Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    name: str,
    logx: bool = False,
    marker: str = "o",
) -> Plots:
    """Named (x, y) series as lines: the probes' cost-against-size and counts-over-time plots."""
    plots = Plots()

    def draw() -> Figure:
        fig = _figure(8, 4.5)
        ax = fig.subplots()
        for label, (xs, ys) in series.items():
            ax.plot(list(xs), list(ys), marker=marker, label=label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        return fig

    _draw(plots, name, path, draw)
    return plots


def bars_plot(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    ylabel: str,
    name: str,
) -> Plots:
    """Grouped bars: one group per entry of `groups`, one bar per series (None: no bar)."""
    plots = Plots()

    def draw() -> Figure:
        fig = _figure(8, 4.5)
        ax = fig.subplots()
        width = 0.8 / max(1, len(series))
        for n, (label, values) in enumerate(series.items()):
            xs = [i + n * width for i in range(len(groups))]
            ax.bar(xs, [v or 0 for v in values], width=width, label=label)
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(groups))])
        ax.set_xticklabels(list(groups), fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        return fig

    _draw(plots, name, path, draw)
    return plots
