"""`local bench --phases`: the gVisor runtime's time above runsc, step by step (issue 22 item 4).

The runtime records each step of its calls (``runtimes/gvisor/phases.py``); this prints them
after the bench's actors went through create, pause, resume, suspend and resume, plus one
figure measured here: the `unshare` wrapper every ``runsc run``/``restore`` goes through
(a private mount namespace with /proc/sys/net masked), timed around `true` against `true`
alone, interleaved.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["phase_table", "wrapper_overhead"]


async def wrapper_overhead(runsc: Any, repetitions: int) -> dict[str, list[float]]:
    """ms of `true` started directly and through runsc's unshare wrapper, interleaved."""
    direct: list[float] = []
    wrapped: list[float] = []
    for _ in range(repetitions):
        for argv, into in ((["true"], direct), (runsc._masked(["true"]), wrapped)):
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(*argv)
            await asyncio.wait_for(proc.wait(), timeout=10)
            into.append((time.perf_counter() - started) * 1000)
    return {"start of `true`": direct, "start of `true` through the unshare wrapper": wrapped}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def phase_table(console: Console, samples: dict[str, list[float]]) -> dict[str, Any]:
    """Print p50/p90/n/total per step; the same figures as a dict for --json."""
    table = Table(title="gVisor runtime, step by step (this run's actors)")
    for column in ("step", "p50 ms", "p90 ms", "n", "total ms"):
        table.add_column(column, justify="left" if column == "step" else "right")
    figures: dict[str, Any] = {}
    for name in sorted(samples):
        values = samples[name]
        if not values:
            continue
        figures[name] = {
            "p50_ms": statistics.median(values),
            "p90_ms": _pct(values, 0.9),
            "n": len(values),
            "total_ms": sum(values),
        }
        table.add_row(
            name,
            f"{figures[name]['p50_ms']:.2f}",
            f"{figures[name]['p90_ms']:.2f}",
            str(len(values)),
            f"{sum(values):.0f}",
        )
    console.print(table)
    return figures
