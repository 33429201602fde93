"""`gym-substrate bench env`: SandboxEnv steps per second against the raw provider, same run.

The action is `true`, so the figure is the env's own cost per step: the loop-thread hop, the
provider's exec round trip through the router to the sandbox agent, and building observation and
info. The baseline is the same provider's `exec("true")` driven directly from asyncio on the same
backend, one sandbox for the single env and N concurrent sandboxes for the vector env; the
difference between the two rows is what the Gymnasium layer adds. Episodes are made long enough
that no reset falls inside a timed window (create/release are measured by `bench provider`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

__all__ = ["BenchResult", "env"]

TARGET_STEPS_PER_S = 200.0
WARMUP_STEPS = 10


@dataclass
class BenchResult:
    name: str
    kind: str  # "baseline" or "env"
    sandboxes: int
    steps: int
    seconds: float
    errors: int
    latencies: list[float] = field(default_factory=list, repr=False)
    """Seconds per call: one exec, one env step, or one vector step (all its envs at once)."""

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("inf")

    def percentile_ms(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["latencies"]
        data["steps_per_s"] = round(self.steps_per_s, 1)
        data["call_p50_ms"] = round(self.percentile_ms(0.50), 2)
        data["call_p99_ms"] = round(self.percentile_ms(0.99), 2)
        return data


def _never(obs: str, info: Mapping[str, Any]) -> bool:
    return False


async def _baseline(provider_cfg: dict[str, Any], sandboxes: int, steps: int) -> BenchResult:
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.types import SandboxSpec

    provider = SubstrateProvider(**provider_cfg)
    handles = []
    try:
        for _ in range(sandboxes):
            handles.append(await provider.create(SandboxSpec()))
        errors = 0
        latencies: list[float] = []

        async def drive(handle: Any, n: int) -> None:
            nonlocal errors
            for _ in range(n):
                t0 = time.perf_counter()
                result = await provider.exec(handle, "true")
                latencies.append(time.perf_counter() - t0)
                errors += result.return_code != 0 or result.error_type is not None

        await asyncio.gather(*(drive(h, WARMUP_STEPS) for h in handles))
        errors = 0
        latencies.clear()
        started = time.perf_counter()
        await asyncio.gather(*(drive(h, steps) for h in handles))
        seconds = time.perf_counter() - started
    finally:
        for handle in handles:
            await provider.close(handle)
        await provider.aclose()
    return BenchResult(
        f"provider.exec ×{sandboxes}",
        "baseline",
        sandboxes,
        steps * sandboxes,
        seconds,
        errors,
        latencies,
    )


def _make_env(provider: dict[str, Any], steps: int) -> Any:
    from gym_substrate.envs import ExitCodeReward, SandboxEnv, SparseTaskTermination

    return SandboxEnv(
        ExitCodeReward(),
        SparseTaskTermination(_never),
        provider,
        max_episode_steps=steps + WARMUP_STEPS + 1,
    )


def _single_env(provider: dict[str, Any], steps: int) -> BenchResult:
    env = _make_env(provider, steps)
    try:
        env.reset()
        for _ in range(WARMUP_STEPS):
            env.step("true")
        errors = 0
        latencies = []
        started = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            info = env.step("true")[4]
            latencies.append(time.perf_counter() - t0)
            errors += info["exit_code"] != 0
        seconds = time.perf_counter() - started
    finally:
        env.close()
    return BenchResult("SandboxEnv ×1", "env", 1, steps, seconds, errors, latencies)


def _vector_env(provider: dict[str, Any], num_envs: int, steps: int, mode: str) -> BenchResult:
    from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

    fns = [functools.partial(_make_env, provider, steps) for _ in range(num_envs)]
    vec: Any = AsyncVectorEnv(fns, context="spawn") if mode == "async" else SyncVectorEnv(fns)
    actions = ("true",) * num_envs
    try:
        vec.reset()
        for _ in range(WARMUP_STEPS):
            vec.step(actions)
        errors = 0
        latencies = []
        started = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            infos = vec.step(actions)[4]
            latencies.append(time.perf_counter() - t0)
            errors += int(sum(int(code) != 0 for code in infos["exit_code"]))
        seconds = time.perf_counter() - started
    finally:
        vec.close()
    name = f"{'AsyncVectorEnv' if mode == 'async' else 'SyncVectorEnv'} ×{num_envs}"
    return BenchResult(name, "env", num_envs, steps * num_envs, seconds, errors, latencies)


@contextlib.contextmanager
def _provider_config(
    config: Path | None, runtime: str, workers: int, console: Console
) -> Iterator[tuple[dict[str, Any], str]]:
    if config is not None:
        from gym_substrate._errors import ConfigError
        from gym_substrate._yaml import load_substrate_block
        from gym_substrate.nemo import SubstrateProvider

        try:  # the same reading (and ${oc.env:...} resolution) as `gym-substrate smoke`
            block = load_substrate_block(config)
            SubstrateProvider(**block)  # validates every key and value; does no I/O
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--config") from exc
        yield block, f"stack from {config.name}"
        return
    from gym_substrate.envs._backend import running_local_backend

    with contextlib.ExitStack() as stack:
        with console.status(f"starting the local backend (runtime {runtime}, {workers} workers)"):
            background = stack.enter_context(
                running_local_backend(runtime=runtime, workers=workers)
            )
        try:
            yield background.provider_config(), f"local, runtime {background.runtime}"
        finally:
            with console.status("stopping the local backend"):
                stack.close()


def _table(results: list[BenchResult], where: str) -> Table:
    table = Table(title=f"SandboxEnv, action `true` ({where})")
    for column in ("measurement", "steps", "steps/s", "p50 ms", "p99 ms", "errors", "vs base"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    baseline: dict[int, BenchResult] = {r.sandboxes: r for r in results if r.kind == "baseline"}
    for r in results:
        base = baseline.get(r.sandboxes)
        versus = (
            "baseline"
            if r.kind == "baseline"
            else (f"{100 * r.steps_per_s / base.steps_per_s:.0f}%" if base else "-")
        )
        table.add_row(
            r.name,
            str(r.steps),
            f"{r.steps_per_s:.0f}",
            f"{r.percentile_ms(0.5):.2f}",
            f"{r.percentile_ms(0.99):.2f}",
            str(r.errors),
            versus,
        )
    return table


@click.command("env")
@click.option(
    "--runtime",
    type=click.Choice(["auto", "process", "gvisor"]),
    default="auto",
    show_default=True,
    help="Local backend runtime (ignored with --config).",
)
@click.option(
    "--steps",
    type=click.IntRange(10, 1_000_000),
    default=500,
    show_default=True,
    help="Timed steps for the single env and its baseline.",
)
@click.option(
    "--vector-steps",
    type=click.IntRange(10, 1_000_000),
    default=150,
    show_default=True,
    help="Timed vector steps (each is one step of every env).",
)
@click.option(
    "--num-envs", type=click.IntRange(1, 64), default=4, show_default=True, help="Vector env size."
)
@click.option(
    "--vector",
    "vector_mode",
    type=click.Choice(["async", "sync"]),
    default="async",
    show_default=True,
    help="AsyncVectorEnv (worker processes) or SyncVectorEnv.",
)
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="YAML with a `substrate:` sandbox block: bench that stack instead of a local backend.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def env(
    runtime: str,
    steps: int,
    vector_steps: int,
    num_envs: int,
    vector_mode: str,
    config: Path | None,
    as_json: bool,
) -> None:
    """Steps per second of SandboxEnv (action `true`): one env and a vector env, with baselines."""
    console = Console(stderr=True)
    results: list[BenchResult] = []
    with _provider_config(config, runtime, max(4, num_envs), console) as (provider_cfg, where):
        provider = {"substrate": provider_cfg}
        plan: list[tuple[str, Any]] = [
            (
                "baseline: provider.exec, 1 sandbox",
                lambda: asyncio.run(_baseline(provider_cfg, 1, steps)),
            ),
            ("SandboxEnv, 1 env", lambda: _single_env(provider, steps)),
            (
                f"baseline: provider.exec, {num_envs} sandboxes",
                lambda: asyncio.run(_baseline(provider_cfg, num_envs, vector_steps)),
            ),
            (
                f"{vector_mode} vector env, {num_envs} envs",
                lambda: _vector_env(provider, num_envs, vector_steps, vector_mode),
            ),
        ]
        from gym_substrate._errors import SubstrateError

        for label, run in plan:
            with console.status(f"measuring {label}"):
                try:
                    results.append(run())
                except SubstrateError as exc:  # e.g. the stack is unreachable
                    raise click.ClickException(f"{label} failed: {exc}") from exc
    single = next(r for r in results if r.name == "SandboxEnv ×1")
    gvisor = "gvisor" in where
    verdict = "met" if single.steps_per_s >= TARGET_STEPS_PER_S else "missed"
    target = {
        "target_steps_per_s": TARGET_STEPS_PER_S,
        "measured_steps_per_s": round(single.steps_per_s, 1),
        "applies": gvisor,
        "verdict": verdict if gvisor else "not applicable: the target is for the gVisor runtime",
    }
    load = os.getloadavg()[0]
    if as_json:
        print(
            json.dumps(
                {
                    "where": where,
                    "cpus": os.cpu_count(),
                    "loadavg_1m": round(load, 2),
                    "results": [r.to_json() for r in results],
                    "target": target,
                },
                indent=2,
            )
        )
    else:
        out = Console()
        out.print(_table(results, where))
        out.print(
            f"machine: {os.cpu_count()} CPUs, load average {load:.2f} (1 min) at the end; "
            "other load skews both rows alike"
        )
        out.print(
            f"target: >= {TARGET_STEPS_PER_S:.0f} steps/s for one env with gVisor; measured "
            f"{single.steps_per_s:.0f} steps/s: {target['verdict']}"
        )
    if any(r.errors for r in results):
        click.echo("some steps failed (see the errors column)", err=True)
        sys.exit(1)
