"""The "Sandbox lifecycle" dashboard against a real Prometheus, a real local backend and a real
NeMo Gym provider.

Prometheus is Debian's (trixie's `prometheus` package, unpacked by `.ci/build-tools
prometheus`), started here with a 1 s scrape of the local backend's `/metrics` (the admin
listener) and the provider's opt-in metrics port. A short run then does what the panels watch:
sandboxes created, commands run, a suspend and a resume, a pause, a request parked until its
budget ran out because the only worker slot was taken, and a crash (the sandbox's process
killed, which the backend's watchdog turns into CRASHED). Every panel's every query, with
Grafana's `$__rate_interval` and the constants filled in, is then evaluated by that Prometheus
over its HTTP API: it must parse, and return at least one finite number, unless the panel is
listed in EMPTY_LOCALLY with the reason it has nothing to show on the local backend.

Metric names and labels: the dashboard uses upstream's (docs/metrics/registry/metrics.yaml@
09c2ac9c, Prometheus spelling as in upstream's troubleshooting docs; test_dashboard.py pins
them), which the local backend exports too (gym_substrate/local/metrics.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from ci_policy import build_tools, missing
from local_ateapi import LocalApi, local_ateapi
from stack_harness import stack_config

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.stack import observability

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RATE = "2m"
# Panels with no data on the local backend, and why (each names upstream's emitter).
EMPTY_LOCALLY = {
    "Workers by state": (
        "ate_workerpool_workers is ateapi's gauge of worker actor slots by state; the local "
        "backend exports its slots as gym_substrate_local_workers{state=busy|free} instead"
    ),
    "Desired vs ready workers": (
        "ate_workerpool_desired_workers/ready_workers are atecontroller's WorkerPool gauges; "
        "the local backend has no WorkerPool and no controller"
    ),
    "Scheduler outcomes": (
        "ate_scheduler_assignment_duration_seconds is ateapi's scheduler histogram; the local "
        "backend assigns worker slots without one"
    ),
    "Restore time on the node": (
        "ate_actor_restore_duration_seconds is atelet's per-phase restore histogram; the local "
        "backend has no atelet"
    ),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prometheus_binary() -> Path:
    bin_dir, build = build_tools("prometheus")
    binary = bin_dir / "prometheus"
    if build.returncode != 0 or not binary.exists():
        missing(f".ci/build-tools prometheus failed:\n{build.stderr[-2000:]}")
    return binary


class Prometheus:
    def __init__(self, binary: Path, folder: Path, targets: dict[str, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "prometheus.log"
        self.proc = subprocess.Popen(
            [str(binary), f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise AssertionError("Prometheus did not get ready:\n" + self.log.read_text()[-3000:])

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read()))

    def targets_up(self) -> dict[str, str]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as r:
            active = json.loads(r.read())["data"]["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in active}

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


async def _short_run(local: LocalApi, metrics_port: int, tmp: Path) -> None:
    """What the panels watch, each thing at least twice, seconds apart (so each series has a
    rate over the 1 s scrapes)."""
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.types import SandboxSpec

    block = local.backend.provider_config()
    provider = SubstrateProvider(
        **block,
        pause_mode="suspend",
        metrics={"port": metrics_port},
        lifecycle={"ledger": str(tmp / "ledger.jsonl")},
    )
    channel = grpc.aio.insecure_channel(local.api)
    stub: Any = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
    try:
        for _ in range(2):
            handle = await provider.create(SandboxSpec())
            for _ in range(3):
                result = await provider.exec(handle, "echo hi")
                assert result.stdout == "hi\n"
                await asyncio.sleep(1.2)
            await provider.pause(handle)  # pause_mode suspend: SuspendActor, a snapshot
            await asyncio.sleep(1.2)
            await provider.resume(handle)
            await provider.exec(handle, "echo again")
            await asyncio.sleep(1.2)
            await provider.close(handle)
            await asyncio.sleep(1.2)

        # A pause (PauseActor) and a request parked on a full pool: the only worker slot is
        # taken by `held`; `waiting` cannot resume, its request parks for the budget, then 503.
        held = await provider.create(SandboxSpec())
        actor = held.raw.actor_id
        ref = pb.ObjectRef(atespace=held.raw.atespace, name=actor)
        await stub.PauseActor(pb.PauseActorRequest(actor=ref))
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref))
        await stub.CreateActor(
            pb.CreateActorRequest(
                actor=pb.Actor(
                    metadata=pb.ResourceMetadata(atespace="gym", name="waiting"),
                    actor_template=pb.ObjectRef(atespace="local", name="sandbox"),
                )
            )
        )
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.get(
                    f"{local.backend.router_url}/readyz",
                    headers={"ate-target-actor": "gym/waiting"},
                    timeout=aiohttp.ClientTimeout(total=60),
                ) as r:
                    assert r.status == 503, await r.text()
                await asyncio.sleep(1.2)

        # A crash: the sandbox's process killed; the backend's watchdog moves it to CRASHED.
        plane = local.backend.plane
        assert plane is not None
        record = plane.state.actors[f"gym/{actor}"]
        runtime: Any = local.backend.runtime  # the process runtime keeps each sandbox's pid
        os.kill(int(runtime._entry(record.handle)["pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while plane.state.actors[f"gym/{actor}"].state != "CRASHED":
            assert time.monotonic() < deadline, "the killed sandbox never became CRASHED"
            await asyncio.sleep(0.3)
        await provider.close(held)
        await stub.DeleteActor(
            pb.DeleteActorRequest(
                actor=pb.ObjectRef(atespace="gym", name="waiting"), any_state=True
            )
        )
    finally:
        await channel.close()
        await provider.aclose()


def _fill(expr: str) -> str:
    return expr.replace("$__rate_interval", RATE).replace("$pool_sandboxes", "1")


def test_every_panel_has_data_from_a_local_backend_and_a_provider(tmp_path: Path) -> None:
    binary = _prometheus_binary()
    metrics_port = _free_port()
    with local_ateapi(
        tmp_path / "backend", tls=False, auth="mtls", workers=1, actors_per_worker=1
    ) as local:
        admin = local.backend.admin_url.removeprefix("http://")
        prom = Prometheus(
            binary,
            tmp_path / "prometheus",
            {"local-backend": admin, "gym-substrate-provider": f"127.0.0.1:{metrics_port}"},
        )
        try:
            asyncio.run(_short_run(local, metrics_port, tmp_path))
            time.sleep(3)  # two more scrapes after the run
            assert prom.targets_up() == {"local-backend": "up", "gym-substrate-provider": "up"}
            report: dict[str, str] = {}
            for panel in observability.dashboard(stack_config("kind-gvisor"))["panels"]:
                title = panel["title"]
                values: list[float] = []
                for target in panel["targets"]:
                    answer = prom.query(_fill(target["expr"]))
                    assert answer["status"] == "success", (title, target["expr"], answer)
                    for series in answer["data"]["result"]:
                        values.append(float(series["value"][1]))
                has_data = any(math.isfinite(v) for v in values)
                report[title] = "data" if has_data else "empty"
                if title in EMPTY_LOCALLY:
                    assert not has_data, f"{title!r} has data now: take it off EMPTY_LOCALLY"
                else:
                    assert has_data, (title, [_fill(t["expr"]) for t in panel["targets"]], values)
            print(json.dumps(report, indent=1))
            for title, why in EMPTY_LOCALLY.items():
                print(f"empty locally: {title}: {why}")
        finally:
            prom.stop()
