"""SandboxEnv steps per second against the raw provider, same run (`gym-substrate bench env`).

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
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate.lab.bench import BenchConfigError, BenchError

__all__ = ["BenchResult", "provider_config", "rows", "run", "target_verdict"]

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
    from gym_substrate.nemo.types import SandboxSpec

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
def provider_config(
    config: Path | None, runtime: str, workers: int, progress: Any
) -> Iterator[tuple[dict[str, Any], str]]:
    """The `substrate:` block of `config`, or of a local backend started for the run.

    Yields the block and where it points; `progress` is a rich Console for status lines.
    """
    if config is not None:
        from gym_substrate.nemo import SubstrateProvider
        from gym_substrate.nemo.config_file import load_substrate_block
        from gym_substrate.nemo.errors import ConfigError

        try:  # the same reading (and ${oc.env:...} resolution) as `gym-substrate smoke`
            block = load_substrate_block(config)
            SubstrateProvider(**block)  # validates every key and value; opens no connection
        except ConfigError as exc:
            raise BenchConfigError(str(exc)) from exc
        yield block, f"stack from {config.name}"
        return
    from gym_substrate.envs.backend import running_local_backend

    with contextlib.ExitStack() as stack:
        with progress.status(f"starting the local backend (runtime {runtime}, {workers} workers)"):
            background = stack.enter_context(
                running_local_backend(runtime=runtime, workers=workers)
            )
        try:
            yield background.provider_config(), f"local, runtime {background.runtime}"
        finally:
            with progress.status("stopping the local backend"):
                stack.close()


def rows(results: list[BenchResult]) -> list[dict[str, Any]]:
    """One row per measurement, each env row against its baseline's steps/s."""
    baseline: dict[int, BenchResult] = {r.sandboxes: r for r in results if r.kind == "baseline"}
    out = []
    for r in results:
        base = baseline.get(r.sandboxes)
        versus = (
            "baseline"
            if r.kind == "baseline"
            else (f"{100 * r.steps_per_s / base.steps_per_s:.0f}%" if base else "-")
        )
        out.append(
            {
                "measurement": r.name,
                "steps": r.steps,
                "steps/s": f"{r.steps_per_s:.0f}",
                "p50 ms": f"{r.percentile_ms(0.5):.2f}",
                "p99 ms": f"{r.percentile_ms(0.99):.2f}",
                "errors": r.errors,
                "vs base": versus,
            }
        )
    return out


def run(
    provider_cfg: dict[str, Any],
    *,
    steps: int,
    vector_steps: int,
    num_envs: int,
    vector_mode: str,
    progress: Any,
) -> list[BenchResult]:
    """The four measurements: baseline and env, single and vector."""
    from gym_substrate.nemo.errors import SubstrateError

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
    results: list[BenchResult] = []
    for label, measure in plan:
        with progress.status(f"measuring {label}"):
            try:
                results.append(measure())
            except SubstrateError as exc:  # e.g. the stack is unreachable
                raise BenchError(f"{label} failed: {exc}") from exc
    return results


def target_verdict(results: list[BenchResult], where: str) -> dict[str, Any]:
    """The single env's steps/s against the gVisor target (which applies only on gVisor)."""
    single = next(r for r in results if r.name == "SandboxEnv ×1")
    gvisor = "gvisor" in where
    verdict = "met" if single.steps_per_s >= TARGET_STEPS_PER_S else "missed"
    return {
        "target_steps_per_s": TARGET_STEPS_PER_S,
        "measured_steps_per_s": round(single.steps_per_s, 1),
        "applies": gvisor,
        "verdict": verdict if gvisor else "not applicable: the target is for the gVisor runtime",
    }
