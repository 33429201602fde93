"""What the provider costs on top of the agent, on a local backend (`gym-substrate bench provider`).

The baseline is measured in the same run: the same command is posted to the same agent through
the same router with a bare aiohttp session (one keep-alive connection), so "added" is exactly
the provider's own overhead (job bookkeeping, semaphore, idle tracking, result mapping), with
no network or agent variance. The router hop is measured the same way: `GET /readyz` through
the router (its per-request ResumeActor round trip to the API server included, as atenet's)
against the same request sent straight to the agent's address. The hand-made requests name the
actor in `ate-target-actor`, as the provider does. Lifecycle and transfer figures are absolute.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gym_substrate.lab.bench import BenchError

__all__ = ["rows", "run_bench"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_bench(*, runtime: str, execs: int, cycles: int, transfer_mib: int) -> dict[str, Any]:
    import aiohttp

    from gym_substrate import SubstrateProvider
    from gym_substrate.core.names import TARGET_ACTOR_HEADER
    from gym_substrate.lab.experiments import ExperimentError
    from gym_substrate.lab.experiments.backend import wait_for_golden
    from gym_substrate.local.backend import local_provider_kwargs
    from gym_substrate.nemo.types import SandboxSpec

    out: dict[str, Any] = {"runtime": runtime}
    async with local_provider_kwargs({}, runtime=runtime, workers=2) as (kwargs, backend):
        out["runtime"] = backend.runtime_name
        try:  # create-to-ready is an actor's, not its template's golden build
            await wait_for_golden(kwargs)
        except ExperimentError as exc:
            raise BenchError(str(exc)) from exc
        provider = SubstrateProvider(**kwargs)
        try:
            create_s: list[float] = []
            handle = None
            for _ in range(cycles):
                t0 = time.perf_counter()
                h = await provider.create(SandboxSpec())
                create_s.append(time.perf_counter() - t0)
                if handle is None:
                    handle = h
                else:
                    await provider.close(h)
            assert handle is not None

            actor = handle.raw
            headers = {
                TARGET_ACTOR_HEADER: actor.target,
                "X-Sandbox-Actor-Id": actor.actor_id,
                "Content-Type": "application/json",
            }
            url = backend.router_url + "/v1/exec"
            via_provider: list[float] = []
            direct: list[float] = []
            # Interleaved, so load from anything else on the machine hits both paths alike.
            async with aiohttp.ClientSession() as session:
                for i in range(execs + 20):
                    t0 = time.perf_counter()
                    r = await provider.exec(handle, "true")
                    t1 = time.perf_counter()
                    if r.return_code != 0:
                        raise BenchError(f"exec failed: {r}")
                    body = json.dumps(
                        {
                            "id": f"b-{uuid.uuid4().hex}",
                            "command": "true",
                            "shell": "/bin/sh",
                            "env": {},
                            "timeout_s": 180.0,
                        }
                    )
                    t2 = time.perf_counter()
                    async with session.post(
                        url, params={"wait": "8.000"}, data=body, headers=headers
                    ) as resp:
                        job = json.loads(await resp.read())
                    t3 = time.perf_counter()
                    if job.get("exit_code") != 0:
                        raise BenchError(f"direct exec failed: {job}")
                    if i >= 20:  # the first 20 warm both paths
                        via_provider.append(t1 - t0)
                        direct.append(t3 - t2)

                via_router, to_agent = await _router_hop(session, backend, actor, execs)

            pause_s: list[float] = []
            resume_s: list[float] = []
            for _ in range(cycles):
                t0 = time.perf_counter()
                await provider.pause(handle)
                pause_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await provider.resume(handle)
                resume_s.append(time.perf_counter() - t0)

            size = transfer_mib * 1024 * 1024
            with tempfile.TemporaryDirectory(prefix="gym-substrate-bench-") as tmp:
                src, dst = Path(tmp) / "src.bin", Path(tmp) / "dst.bin"
                src.write_bytes(os.urandom(size))
                # the sandbox's own /tmp (a private one under either runtime), not the host's
                remote = f"/tmp/gym-substrate-bench-{uuid.uuid4().hex}.bin"
                t0 = time.perf_counter()
                await provider.upload_file(handle, src, remote)
                up = time.perf_counter() - t0
                t0 = time.perf_counter()
                await provider.download_file(handle, remote, dst)
                down = time.perf_counter() - t0
                if dst.read_bytes() != src.read_bytes():
                    raise BenchError("downloaded bytes differ")
                await provider.exec(handle, f"rm -f {remote}")
            await provider.close(handle)
        finally:
            await provider.aclose()

    p50_p, p50_d = statistics.median(via_provider), statistics.median(direct)
    out.update(
        {
            "exec_p50_ms_provider": p50_p * 1e3,
            "exec_p90_ms_provider": _pct(via_provider, 0.9) * 1e3,
            "exec_p50_ms_direct": p50_d * 1e3,
            "exec_p90_ms_direct": _pct(direct, 0.9) * 1e3,
            "exec_added_ms_p50": (p50_p - p50_d) * 1e3,
            "readyz_p50_ms_router": statistics.median(via_router) * 1e3,
            "readyz_p50_ms_agent": statistics.median(to_agent) * 1e3,
            "router_added_ms_p50": (statistics.median(via_router) - statistics.median(to_agent))
            * 1e3,
            "create_to_ready_p50_s": statistics.median(create_s),
            "pause_p50_s": statistics.median(pause_s),
            "resume_p50_s": statistics.median(resume_s),
            "upload_mb_s": size / 1e6 / up,
            "download_mb_s": size / 1e6 / down,
            "transfer_mib": transfer_mib,
            "execs": execs,
            "cycles": cycles,
        }
    )
    return out


async def _router_hop(
    session: Any, backend: Any, actor: Any, count: int
) -> tuple[list[float], list[float]]:
    """`GET /readyz` through the router and straight to the agent, interleaved, warm."""
    from gym_substrate.core.names import TARGET_ACTOR_HEADER
    from gym_substrate.local.router import upstream_authority

    record = backend.plane.lookup(actor.atespace, actor.actor_id)
    authority = upstream_authority(record.address) if record is not None else None
    if authority is None:
        raise BenchError(f"actor {actor.target} has no address to measure the router against")
    routed, straight = backend.router_url + "/readyz", f"http://{authority}/readyz"
    routing = {TARGET_ACTOR_HEADER: actor.target}
    via_router: list[float] = []
    to_agent: list[float] = []
    for i in range(count + 20):
        t0 = time.perf_counter()
        async with session.get(routed, headers=routing) as resp:
            await resp.read()
            ok = resp.status == 200
        t1 = time.perf_counter()
        async with session.get(straight) as resp:
            await resp.read()
            ok = ok and resp.status == 200
        t2 = time.perf_counter()
        if not ok:
            raise BenchError("GET /readyz failed through the router or at the agent")
        if i >= 20:
            via_router.append(t1 - t0)
            to_agent.append(t2 - t1)
    return via_router, to_agent


def rows(f: dict[str, Any]) -> list[dict[str, str]]:
    """The figures as table rows: measure, value, and its baseline or target."""
    added = f["exec_added_ms_p50"]
    return [
        {
            "measure": "exec p50 via provider",
            "value": f"{f['exec_p50_ms_provider']:.3f} ms",
            "baseline": f"direct {f['exec_p50_ms_direct']:.3f} ms",
        },
        {
            "measure": "exec p90 via provider",
            "value": f"{f['exec_p90_ms_provider']:.3f} ms",
            "baseline": f"direct {f['exec_p90_ms_direct']:.3f} ms",
        },
        {
            "measure": "added by the provider (p50)",
            "value": f"{added:.3f} ms",
            "baseline": "target <= 1 ms " + ("met" if added <= 1.0 else "MISSED"),
        },
        {
            "measure": "router hop, GET /readyz (p50)",
            "value": f"{f['router_added_ms_p50']:.3f} ms",
            "baseline": f"agent {f['readyz_p50_ms_agent']:.3f} ms, routed "
            f"{f['readyz_p50_ms_router']:.3f} ms",
        },
        {"measure": "create to ready (p50)", "value": f"{f['create_to_ready_p50_s'] * 1e3:.1f} ms"},
        {"measure": "pause (p50)", "value": f"{f['pause_p50_s'] * 1e3:.1f} ms"},
        {"measure": "resume to ready (p50)", "value": f"{f['resume_p50_s'] * 1e3:.1f} ms"},
        {"measure": f"upload {f['transfer_mib']} MiB", "value": f"{f['upload_mb_s']:.0f} MB/s"},
        {
            "measure": f"download {f['transfer_mib']} MiB",
            "value": f"{f['download_mb_s']:.0f} MB/s",
            "baseline": "incl. sha256 in sandbox",
        },
    ]
