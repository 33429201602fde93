"""`LocalBackend`: control plane + router + runtime in one process, as an async context manager.

This is the in-process API the CLI, the provider's tests and the env's tools share, so a test
gets exactly what `gym-substrate local up` serves. A state folder belongs to one backend at a
time (an flock on `backend.lock`); `backend.json` beside it tells `local down`/`status` where the
running backend listens. Leaving the context stops every sandbox (`local down` semantics); only a
crash leaves sandboxes behind, and the next start adopts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from aiohttp import web

from gym_substrate.local.errors import ApiError
from gym_substrate.local.lifecycle import ControlPlane
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.router import Router, json_error
from gym_substrate.local.runtimes import RUNTIME_NAMES, create_runtime, select_runtime
from gym_substrate.local.runtimes.base import (
    RuntimeConfig,
    RuntimeFailure,
    SandboxRuntime,
    TemplateSpec,
)
from gym_substrate.local.servicer import add_ateapi_services
from gym_substrate.local.store import Store
from gym_substrate.local.templates import TemplateError, default_template, parse_template_yaml

__all__ = [
    "BackendError",
    "LocalBackend",
    "cleanup_orphans",
    "cleanup_state_dir",
    "default_state_dir",
    "read_backend_info",
    "registry_dir",
    "runtime_for_state",
    "state_leftovers",
    "stored_status",
]

log = logging.getLogger(__name__)

STATE_ENV = "GYM_SUBSTRATE_STATE_DIR"
REGISTRY_ENV = "GYM_SUBSTRATE_LOCAL_REGISTRY"


class BackendError(RuntimeError):
    """The backend cannot start or stop; the message says why and what to do."""


def default_state_dir() -> Path:
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.local/state/gym-substrate").expanduser()


def instance_name(state_dir: Path) -> str:
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()
    return "gs" + digest[:6]


def read_backend_info(state_dir: Path) -> dict[str, Any] | None:
    """What a running backend wrote to `backend.json`, or None if none is running there."""
    try:
        info: dict[str, Any] = json.loads((state_dir / "backend.json").read_text())
    except (OSError, ValueError):
        return None
    # the flock, not the pid (which the kernel may have reused), says whether it still runs
    return info if _lock_held(state_dir) else None


def runtime_for_state(state_dir: Path) -> SandboxRuntime | None:
    store_path = state_dir / "state.db"
    if not store_path.exists():
        return None
    store = Store(store_path)
    try:
        name = store.get_meta("runtime")
        instance = store.get_meta("instance") or instance_name(state_dir)
        workers = int(store.get_meta("workers") or "1")
    finally:
        store.close()
    if not name:
        return None
    config = RuntimeConfig(state_dir / "runtime" / name, instance, workers)
    return create_runtime(name, config)


async def cleanup_state_dir(state_dir: Path) -> list[str]:
    """Remove every sandbox a (crashed) backend of this state folder left behind."""
    if _lock_held(state_dir):
        raise BackendError(
            f"a backend still holds {state_dir} (starting up, or embedded in another program) "
            "and owns its sandboxes: wait until it answers and run `gym-substrate local down` "
            "again, or stop that program"
        )
    runtime = runtime_for_state(state_dir)
    if runtime is None:
        return []
    removed = await runtime.cleanup()
    await runtime.close()
    return removed


def _lock_held(state_dir: Path) -> bool:
    """True while some process holds the state folder's backend lock."""
    try:
        fd = os.open(state_dir / "backend.lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def registry_dir() -> Path:
    """Machine-wide list of backends that may own sandboxes (one file per instance).

    A backend that dies without stopping its sandboxes (SIGKILL, an interrupted test run whose
    state folder nobody remembers) stays listed here, so `local down --orphans` can find it.
    """
    override = os.environ.get(REGISTRY_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gym-substrate-{os.getuid()}"
    return Path(base) / "gym-substrate-backends"


def _register(instance: str, state_dir: Path, runtime: str, workers: int) -> None:
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = {"state_dir": str(state_dir), "runtime": runtime, "workers": workers}
    tmp = folder / f".{instance}.tmp"
    tmp.write_text(json.dumps(entry))
    tmp.replace(folder / instance)


def _unregister(instance: str) -> None:
    with contextlib.suppress(OSError):
        (registry_dir() / instance).unlink()


async def cleanup_orphans() -> list[str]:
    """Stop the sandboxes of every registered backend that is no longer running."""
    removed: list[str] = []
    folder = registry_dir()
    if not folder.is_dir():
        return removed
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        try:
            entry = json.loads(path.read_text())
            state_dir = Path(entry["state_dir"])
            config = RuntimeConfig(
                state_dir / "runtime" / entry["runtime"], path.name, int(entry["workers"])
            )
            runtime = create_runtime(entry["runtime"], config)
        except (OSError, ValueError, KeyError, TypeError, RuntimeFailure) as exc:
            log.warning("ignoring unreadable backend registration %s: %s", path, exc)
            continue
        if _lock_held(state_dir):
            # alive (or still starting: backend.json is written only once it serves) and owns
            # its sandboxes
            continue
        try:
            removed += [f"{state_dir}: {line}" for line in await runtime.cleanup()]
            left = await runtime.leftovers()
        finally:
            await runtime.close()
        if not left:
            path.unlink(missing_ok=True)
    return removed


def stored_status(state_dir: Path) -> dict[str, Any] | None:
    """What a stopped backend's state folder holds (actors, templates), or None if nothing."""
    if not (state_dir / "state.db").exists():
        return None
    store = Store(state_dir / "state.db")
    try:
        actors = [
            {
                "atespace": a.atespace,
                "actor": a.actor_id,
                "template": f"{a.template_namespace}/{a.template_name}",
                "status": a.status,
                "version": a.version,
                "address": "",
                "worker": "",
                "snapshot": a.snapshot_path,
            }
            for a in store.actors()
        ]
        templates = [
            {
                "template": t.key,
                "rootfs": t.rootfs.kind,
                "snapshots": str(t.snapshot_location),
                "golden_snapshot": golden.path if golden else "",
            }
            for t, golden in store.templates()
        ]
        atespaces = store.atespaces()
        runtime = store.get_meta("runtime") or ""
    finally:
        store.close()
    return {
        "runtime": runtime,
        "state_dir": str(state_dir),
        "workers": [],
        "actors": actors,
        "templates": templates,
        "atespaces": atespaces,
    }


async def state_leftovers(state_dir: Path) -> list[str]:
    """Anything of this state folder's backend still on the host (for leak checks)."""
    runtime = runtime_for_state(state_dir)
    if runtime is None:
        return []
    found = await runtime.leftovers()
    await runtime.close()
    return found


class LocalBackend:
    def __init__(
        self,
        state_dir: Path,
        *,
        runtime: str = "auto",
        workers: int = 4,
        api_port: int = 0,
        router_port: int = 0,
        router_timeout_s: float = 10.0,
        start_timeout_s: float = 60.0,
        suspend_on_stop: bool = False,
    ) -> None:
        if runtime not in RUNTIME_NAMES:
            raise ValueError(f"unknown runtime {runtime!r}: use one of {', '.join(RUNTIME_NAMES)}")
        if workers < 1 or workers > 250:
            raise ValueError(f"workers must be between 1 and 250, got {workers}")
        for label, port in (("api_port", api_port), ("router_port", router_port)):
            if not 0 <= port <= 65535:
                raise ValueError(f"{label} must be 0..65535, got {port}")
        if router_timeout_s <= 0:
            raise ValueError(f"router_timeout_s must be > 0, got {router_timeout_s}")
        self.state_dir = Path(state_dir).expanduser()
        self.requested_runtime = runtime
        self.workers = workers
        self._api_port = api_port
        self._router_port = router_port
        self.router_timeout_s = router_timeout_s
        self.start_timeout_s = start_timeout_s
        self.suspend_on_stop = suspend_on_stop
        self.runtime_name = ""
        self.runtime_reason = ""
        self.runtime: SandboxRuntime | None = None
        self.plane: ControlPlane | None = None
        self.metrics = Metrics()
        self._store: Store | None = None
        self._server: grpc.aio.Server | None = None
        self._router: Router | None = None
        self._lock_fd: int | None = None
        self._instance = ""
        # True when this process exists only to serve the backend (`local up`): `local down`
        # may then SIGTERM it; an embedding program (tests, a trainer) is never signalled
        self.standalone = False
        self.api_port = 0
        self.router_port = 0

    # ------------------------------------------------------------------ addresses
    @property
    def api_address(self) -> str:
        return f"127.0.0.1:{self.api_port}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def provider_config(self) -> dict[str, Any]:
        """The `connection:` block of the NeMo Gym provider config for this backend."""
        return {"api": self.api_address, "router": self.router_url, "tls": {"plaintext": True}}

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> LocalBackend:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _lock(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / "backend.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = read_backend_info(self.state_dir) or {}
            raise BackendError(
                f"another backend (pid {info.get('pid', '?')}) already uses {self.state_dir}; "
                f"stop it with `gym-substrate local down --state-dir {self.state_dir}` or pick "
                "another --state-dir"
            ) from None
        self._lock_fd = fd

    async def start(self) -> None:
        self._lock()
        try:
            await self._start()
        except BaseException:
            await self._teardown(stop_sandboxes=True)
            raise

    async def _start(self) -> None:
        name, reason = select_runtime(self.requested_runtime)
        self.runtime_name, self.runtime_reason = name, reason
        store = Store(self.state_dir / "state.db")
        self._store = store
        instance = store.get_meta("instance") or instance_name(self.state_dir)
        store.set_meta("instance", instance)
        previous = store.get_meta("runtime")
        if previous and previous != name:
            log.warning(
                "this state folder last ran the %s runtime; cleaning up its sandboxes before "
                "starting the %s runtime (running actors fall back to their last snapshot)",
                previous,
                name,
            )
            with contextlib.suppress(Exception):
                old = create_runtime(
                    previous, RuntimeConfig(self.state_dir / "runtime" / previous, instance, 1)
                )
                await old.cleanup()
                await old.close()
        store.set_meta("runtime", name)
        store.set_meta("workers", str(self.workers))
        _register(instance, self.state_dir.resolve(), name, self.workers)
        self._instance = instance
        config = RuntimeConfig(self.state_dir / "runtime" / name, instance, self.workers)
        self.runtime = create_runtime(name, config)
        warning = self.runtime.warning()
        if warning:
            log.warning("%s", warning)
        self.plane = ControlPlane(
            store,
            self.runtime,
            state_dir=self.state_dir,
            instance=instance,
            workers=self.workers,
            metrics=self.metrics,
            start_timeout_s=self.start_timeout_s,
        )
        await self.plane.start([default_template(self.state_dir / "snapshots" / "store")])

        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        add_ateapi_services(server, self.plane)
        try:
            port = server.add_insecure_port(f"127.0.0.1:{self._api_port}")
        except RuntimeError:
            port = 0
        if port == 0:
            raise BackendError(
                f"cannot listen on 127.0.0.1:{self._api_port} for the API; pick another --api-port"
            )
        await server.start()
        self._server = server
        self.api_port = port

        self._router = Router(
            self.plane,
            self.metrics,
            timeout_s=self.router_timeout_s,
            admin={
                ("POST", "/_local/templates"): self._add_template,
                ("GET", "/_local/status"): self._status,
            },
        )
        try:
            self.router_port = await self._router.start("127.0.0.1", self._router_port)
        except OSError as exc:
            raise BackendError(
                f"cannot listen on 127.0.0.1:{self._router_port} for the router ({exc}); pick "
                "another --router-port"
            ) from exc
        info = {
            "pid": os.getpid(),
            "api": self.api_address,
            "router": self.router_url,
            "runtime": name,
            "runtime_reason": reason,
            "runtime_warning": warning or "",
            "instance": instance,
            "workers": self.workers,
            "standalone": self.standalone,
            "started_at": time.time(),
        }
        tmp = self.state_dir / "backend.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(self.state_dir / "backend.json")

    async def stop(self) -> None:
        await self._teardown(stop_sandboxes=True)

    async def detach(self) -> None:
        """Stop serving but leave sandboxes running for the next start to adopt."""
        await self._teardown(stop_sandboxes=False)

    async def _teardown(self, *, stop_sandboxes: bool) -> None:
        try:
            if self._router is not None:
                router, self._router = self._router, None
                await router.close()
            if self._server is not None:
                server, self._server = self._server, None
                await server.stop(grace=1.0)
            if self.plane is not None:
                plane, self.plane = self.plane, None
                if stop_sandboxes:
                    await plane.shutdown(suspend=self.suspend_on_stop)
                    if self._instance:
                        _unregister(self._instance)
                else:
                    await plane.detach()
            elif self.runtime is not None:
                await self.runtime.close()
        finally:
            # whatever failed above, the state folder is released for the next backend
            if self._store is not None:
                self._store.close()
                self._store = None
            with contextlib.suppress(OSError, ValueError):
                info = json.loads((self.state_dir / "backend.json").read_text())
                if info.get("pid") == os.getpid():
                    (self.state_dir / "backend.json").unlink()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # ------------------------------------------------------------------ admin endpoints
    async def _add_template(self, request: web.Request) -> web.StreamResponse:
        assert self.plane is not None
        body = await request.read()
        try:
            text = body.decode()
            template = parse_template_yaml(text, source=request.query.get("source", "<request>"))
        except (UnicodeDecodeError, TemplateError) as exc:
            return json_error(400, "bad_request", str(exc))
        try:
            changed = await self.plane.add_template(template)
        except ApiError as exc:
            return json_error(409, "conflict", exc.message)
        golden = self.plane.golden(template.key)
        return web.json_response(
            {
                "template": template.key,
                "changed": changed,
                "golden_snapshot": golden.path if golden else None,
            }
        )

    async def _status(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.status())

    def status(self) -> dict[str, Any]:
        """Workers, actors and templates as plain data (for `local status`)."""
        plane = self.plane
        if plane is None:
            raise BackendError("the backend is not running")
        workers = []
        for worker, actor in plane.workers_list():
            workers.append(
                {
                    "worker": plane.worker_pod(worker.slot),
                    "version": worker.version,
                    "actor": actor.key if actor else "",
                    "address": actor.address if actor else "",
                    "status": actor.status if actor else "FREE",
                }
            )
        actors, token = plane.list_actors(0, "", "")
        while token:
            more, token = plane.list_actors(0, token, "")
            actors += more
        templates = []
        for key, template in sorted(plane.templates.items()):
            golden = plane.golden(key)
            templates.append(
                {
                    "template": key,
                    "rootfs": template.rootfs.kind,
                    "snapshots": str(template.snapshot_location),
                    "golden_snapshot": golden.path if golden else "",
                }
            )
        return {
            "runtime": self.runtime_name,
            "runtime_reason": self.runtime_reason,
            "api": self.api_address,
            "router": self.router_url,
            "state_dir": str(self.state_dir),
            "workers": workers,
            "actors": [
                {
                    "atespace": a.atespace,
                    "actor": a.actor_id,
                    "template": f"{a.template_namespace}/{a.template_name}",
                    "status": a.status,
                    "version": a.version,
                    "address": a.address,
                    "worker": plane.worker_pod(a.slot) if a.slot is not None else "",
                    "snapshot": a.snapshot_path,
                }
                for a in actors
            ],
            "templates": templates,
            "atespaces": plane.list_atespaces(),
        }


def load_template_file(path: Path) -> TemplateSpec:
    """Read and validate a template file (used by `local templates add`)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TemplateError(f"{path}: cannot read it ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise TemplateError(
            f"{path}: not UTF-8 text (byte {exc.start}); save the template as UTF-8 YAML"
        ) from exc
    return parse_template_yaml(text, source=str(path), base_dir=path.parent.resolve())
