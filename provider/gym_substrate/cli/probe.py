"""`gym-substrate probe memory|footprint|burst|cancelled-pause`: is this host or class sound?"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click

from gym_substrate.cli._experiments import note, output_options, report_files, run, target_options
from gym_substrate.cli._output import Column, emit, emit_json, fail, progress


def _numbers(kind: type[float] | type[int], label: str) -> Callable[..., Any]:
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> list[Any]:
        try:
            return [kind(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected comma-separated {label}") from None

    return parse


_out_option = output_options("Print the result as JSON.")


def _probe(
    name: str,
    out: str | None,
    as_json: bool,
    config_file: str | None,
    runtime: str,
    workers: int,
    actors_per_worker: int,
    body: Callable[[Any, Callable[[str], None]], Coroutine[Any, Any, Any]],
    plot: Callable[[Any, Path], Any] | None = None,
) -> None:
    """Run one probe: target, progress, table, verdict line, output folder; exit 1 on FAIL."""
    from gym_substrate.lab.experiments import ExperimentError
    from gym_substrate.lab.experiments.artifacts import make_out_dir, write_csv, write_json
    from gym_substrate.lab.experiments.backend import local_or_config

    try:
        folder = make_out_dir(out, f"probe-{name}")
    except ExperimentError as exc:
        raise fail(str(exc)) from exc

    async def main() -> Any:
        async with local_or_config(config_file, runtime, workers, actors_per_worker) as target:
            note(f"target: {target.where} ({target.runtime_reason})", as_json=as_json)
            with progress.status(f"probe {name}") as status:
                return await body(target, lambda text: status.update(f"probe {name}: {text}"))

    result = run(main())
    write_csv(folder / f"{name}.csv", result.rows, result.columns)
    data = result.to_json()
    plot_note = None
    if plot is not None:
        plots = plot(result, folder)
        data["files"] = plots.files
        plot_note = plots.note
    write_json(folder / "summary.json", data)
    if as_json:
        emit_json(data)
    else:
        emit(
            result.rows,
            [Column(c, justify="left" if isinstance(result.rows[0].get(c), str) else "right")
             for c in result.columns] if result.rows else [Column(c) for c in result.columns],
            title=f"probe {name} ({result.target.get('where', '')})",
        )  # fmt: skip
        extra = {k: v for k, v in result.figures.items() if not isinstance(v, dict) or v}
        if extra:
            note(
                ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in extra.items()),
                as_json=False,
            )
        note(f"{result.verdict}: {result.line}", as_json=False)
    report_files(folder, plot_note, as_json=as_json)
    if result.verdict == "FAIL":
        raise SystemExit(1)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


@click.group("probe")
def probe() -> None:
    """Probes for a new host or sandbox class; each prints a verdict line and figures."""


@probe.command("memory")
@click.option(
    "--mib",
    "sizes",
    default="16,64,256",
    show_default=True,
    callback=_numbers(int, "sizes in MiB"),
    help="Sizes of the known data, in MiB.",
)
@target_options
@_out_option
def memory(
    sizes: list[int], config_file: str | None, runtime: str, workers: int, actors_per_worker: int,
    out: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Known data survives pause and suspend byte for byte; pause/resume cost against size."""
    from gym_substrate.lab.experiments.plots import lines_plot
    from gym_substrate.lab.experiments.probes import probe_memory

    def plot(result: Any, folder: Path) -> Any:
        return lines_plot(
            folder / "memory.png",
            result.series,
            title=f"pause and resume cost against held memory ({result.target.get('where')})",
            xlabel="MiB held in the sandbox",
            ylabel="seconds",
            name="memory_plot",
            logx=True,
        )

    _probe(
        "memory", out, as_json, config_file, runtime, workers, actors_per_worker,
        lambda target, tick: probe_memory(target, sizes, on_progress=tick), plot,
    )  # fmt: skip


@probe.command("footprint")
@click.option("--mib", type=int, default=64, show_default=True, help="MiB the sandbox holds.")
@target_options
@_out_option
def footprint(
    mib: int,
    config_file: str | None,
    runtime: str,
    workers: int,
    actors_per_worker: int,
    out: str | None,
    as_json: bool,
) -> None:
    """Guest-side against host-side memory of one sandbox, running and paused."""
    from gym_substrate.lab.experiments.plots import bars_plot
    from gym_substrate.lab.experiments.probes import probe_footprint

    def plot(result: Any, folder: Path) -> Any:
        keys = {
            "guest_tree_rss_mib": "guest: sandbox processes RSS",
            "host_pss_mib": "host: PSS",
            "snapshot_mib": "host: snapshot on disk",
        }
        return bars_plot(
            folder / "footprint.png",
            [r["state"] for r in result.rows],
            {label: [r.get(key) for r in result.rows] for key, label in keys.items()},
            title=f"memory footprint ({result.target.get('where')})",
            ylabel="MiB",
            name="footprint_plot",
        )

    _probe(
        "footprint", out, as_json, config_file, runtime, workers, actors_per_worker,
        lambda target, tick: probe_footprint(target, mib, on_progress=tick), plot,
    )  # fmt: skip


@probe.command("burst")
@click.option("--count", type=int, default=8, show_default=True, help="Creates at once (K).")
@target_options
@_out_option
def burst(
    count: int,
    config_file: str | None,
    runtime: str,
    workers: int,
    actors_per_worker: int,
    out: str | None,
    as_json: bool,
) -> None:
    """K creates at once: time to all ready, failures, host counts before/peak/after close."""
    from gym_substrate.lab.experiments.plots import lines_plot
    from gym_substrate.lab.experiments.probes import probe_burst

    if count < 1:
        raise click.BadParameter(f"K must be >= 1, got {count}", param_hint="--count")

    def plot(result: Any, folder: Path) -> Any:
        return lines_plot(
            folder / "burst.png",
            result.series,
            title=f"host counts during a burst of {count} creates ({result.target.get('where')})",
            xlabel="seconds since the burst started",
            ylabel="count",
            name="burst_plot",
            marker="",
        )

    _probe(
        "burst", out, as_json, config_file, runtime, workers, actors_per_worker,
        lambda target, tick: probe_burst(target, count, on_progress=tick), plot,
    )  # fmt: skip


@probe.command("cancelled-pause")
@click.option(
    "--offsets-ms",
    "offsets",
    default="0,10,50,100,250",
    show_default=True,
    callback=_numbers(float, "milliseconds"),
    help="When the racing call starts, after the pause started.",
)
@click.option(
    "--races",
    default="resume,exec,delete",
    show_default=True,
    help="Calls that race the pause.",
)
@target_options
@_out_option
def cancelled_pause(
    offsets: list[float], races: str, config_file: str | None, runtime: str, workers: int,
    actors_per_worker: int, out: str | None, as_json: bool,
) -> None:  # fmt: skip
    """A pause raced by a resume, an exec and a delete: no state lost, nothing stuck."""
    from gym_substrate.lab.experiments.probes import probe_cancelled_pause

    names = [r.strip() for r in races.split(",") if r.strip()]
    _probe(
        "cancelled-pause", out, as_json, config_file, runtime, workers, actors_per_worker,
        lambda target, tick: probe_cancelled_pause(
            target, [o / 1000 for o in offsets], names, on_progress=tick
        ),
    )  # fmt: skip
