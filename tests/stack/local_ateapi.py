"""A real current-API ateapi for the stack tests: the local backend, run in a thread.

The stack's `ActorTemplate` resource is a blocking gRPC client inside Pulumi's dynamic provider;
the local backend is asyncio. `BackendThread` runs `gym_substrate.local.LocalBackend` (TLS, and
jwt auth unless asked otherwise) on its own event loop in a daemon thread, so a test, or a
`pulumi up` in a subprocess, talks to it over 127.0.0.1 as to a cluster's ateapi.

The stack's templates use the backend's own images, which have exactly the shape a cluster's
have: the workload is `local/debian-bookworm@sha256:...` (a Debian root filesystem built once per
machine, tests/conftest.py's cache) and the agent `local/sandbox-agent@sha256:...`, the static
agent on an image volume at /opt/sandbox-agent, as the backend's own `local/sandbox` template
mounts it. The backend's workers get the labels a WorkerPool would give them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_substrate.local import LocalBackend


@dataclass
class LocalApi:
    backend: LocalBackend
    loop: asyncio.AbstractEventLoop
    workload_image: str  # local/debian-bookworm@sha256:...
    agent_image: str  # local/sandbox-agent@sha256:... (a files image: the static agent)
    snapshots: Path  # for templates.storageLocation (file://localhost<snapshots>/)

    @property
    def api(self) -> str:
        return self.backend.api_address

    @property
    def ca_pem(self) -> str:
        assert self.backend.ca_file is not None
        return self.backend.ca_file.read_text()

    def token(self) -> str:
        assert self.backend.token_file is not None
        return self.backend.token_file.read_text().strip()

    def connection(self, **extra: Any) -> dict[str, Any]:
        """The stack's connection mapping for this backend (TLS as on a cluster)."""
        conn: dict[str, Any] = {"api": self.api, "serverName": "api.ate-system.svc"}
        if self.backend.tls:
            conn["caPem"] = self.ca_pem
        else:
            conn["plaintext"] = True
        if self.backend.auth == "jwt":
            conn["token"] = {"value": self.token()}
        return {**conn, **extra}

    def run(self, coro: Any, timeout: float = 60) -> Any:
        """Run a coroutine on the backend's loop (e.g. a plane call) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def templates(self) -> dict[str, Any]:
        """The backend's templates by `atespace/name` (its own `local/sandbox` included)."""
        assert self.backend.plane is not None
        return dict(self.backend.plane.state.templates)

    def label_workers(self, labels: dict[str, str]) -> None:
        """Add `labels` to every worker, as atecontroller's syncer copies a WorkerPool's
        metadata.labels onto its Worker records (UpdateWorker may change labels; the
        templates' workerSelector matches them)."""
        plane = self.backend.plane
        assert plane is not None

        async def update() -> None:
            for worker in plane.pool.all():
                plane.pool.update(worker.meta.name, {**worker.labels, **labels}, worker.epoch)

        self.run(update())

    def atespaces(self) -> set[str]:
        assert self.backend.plane is not None
        return set(self.backend.plane.state.atespaces)


@contextmanager
def local_ateapi(
    state: Path,
    *,
    api_port: int = 0,
    router_port: int = 0,
    tls: bool = True,
    auth: str = "jwt",
    runtime: str = "process",
    workers: int = 2,
    actors_per_worker: int = 2,
    worker_labels: tuple[tuple[str, str], ...] = (("workload", "sandbox"),),
    api_era: str | None = None,
) -> Iterator[LocalApi]:
    """A started local backend (its own templates built), stopped when the block ends;
    `api_era` is the release era it speaks on the wire (default: current)."""
    ready: dict[str, Any] = {}
    started = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        try:
            backend = LocalBackend(
                state / "state",
                runtime=runtime,
                workers=workers,
                actors_per_worker=actors_per_worker,
                api_port=api_port,
                router_port=router_port,
                tls=tls,
                auth=auth,
                default_rootfs="debian",
                api_era=api_era,
            )
            async with backend:
                plane = backend.plane
                assert plane is not None
                for record in list(plane.state.templates.values()):
                    await plane.golden.wait(record)
                ready["backend"] = backend
                started.set()
                await stop.wait()
        except BaseException as exc:  # surfaced to the test below
            ready["error"] = exc
            started.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        if not started.wait(180):
            raise TimeoutError("the local backend did not start within 180 s")
        if "error" in ready:
            raise RuntimeError(f"the local backend did not start: {ready['error']!r}")
        backend: LocalBackend = ready["backend"]
        debian = backend.images.latest("local/debian-bookworm")
        agent = backend.images.latest("local/sandbox-agent")
        assert debian is not None
        assert agent is not None
        snapshots = state / "snapshots"
        snapshots.mkdir(exist_ok=True)
        api = LocalApi(backend, loop, debian.reference, agent.reference, snapshots)
        api.label_workers(dict(worker_labels))
        yield api
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(120)
        loop.close()
