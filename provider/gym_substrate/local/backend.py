"""`LocalBackend`: control plane + router + runtime in one process, as an async context manager.

This is the in-process API the CLI, the provider's tests and the env's tools share, so a test
gets exactly what `gym-substrate local up` serves. It listens on three ports of 127.0.0.1: the
gRPC API, the router (actor traffic only, as Substrate's) and the admin listener (`/readyz`,
`/metrics`, `/_local/*`; `admin.py`). A state folder belongs to one backend at a
time: it holds the folder's lock while it runs and writes `backend.json` once it serves
(`statedir.py`). Leaving the context stops every sandbox (`local down` semantics); only a
crash leaves sandboxes behind, and the next start adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from aiohttp import web

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import rootfs, statedir
from gym_substrate.local.admin import AdminServer
from gym_substrate.local.admin_images import ADMIN_BODY_LIMIT, image_routes
from gym_substrate.local.apiserver import create_api_server
from gym_substrate.local.backend_options import (
    DEFAULT_ROOTFS_CHOICES,
    WARM_POOL_ENV,
    BackendOptions,
    check_options,
    default_actors_per_worker,
)
from gym_substrate.local.backend_security import Security, load_security, refresh_token_forever
from gym_substrate.local.client_config import provider_config
from gym_substrate.local.control.identity import Identity
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.store import StaleStateError, StateFolderFull, Store
from gym_substrate.local.crashpoint import check_crash_env
from gym_substrate.local.errors import BackendError
from gym_substrate.local.heap import malloc_trim, trim_heap_forever
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.resume_client import ResumeClient
from gym_substrate.local.router import Router
from gym_substrate.local.runtimes import create_runtime, select_runtime
from gym_substrate.local.runtimes.base import RuntimeConfig, SandboxRuntime
from gym_substrate.local.runtimes.process import bwrap_problem
from gym_substrate.local.templates import default_template

__all__ = [
    "ADMIN_BODY_LIMIT",
    "DEFAULT_ROOTFS_CHOICES",
    "MAX_MESSAGE_BYTES",
    "WARM_POOL_ENV",
    "LocalBackend",
    "default_actors_per_worker",
    "local_provider_kwargs",
]

log = logging.getLogger(__name__)

# ateapi's gRPC server sets no MaxRecvMsgSize, so grpc-go's default holds: a request over 4 MiB
# is refused with RESOURCE_EXHAUSTED before any handler runs. Same cap here, set explicitly.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class LocalBackend:
    def __init__(self, state_dir: Path, **options: Any) -> None:
        """Check every option at once (`backend_options.py`); nothing runs until `start`.

        ``options`` are the keywords of `option_table.OPTIONS` (runtime, workers, ports,
        router limits, TLS and auth, pause tier, warm pool, root filesystem, API era), each
        with its row's default and check; an unknown one raises TypeError.
        """
        self._take_options(Path(state_dir).expanduser(), check_options(**options))
        self._clear_serving_state()

    def _take_options(self, state_dir: Path, options: BackendOptions) -> None:
        """The checked options as the attributes callers read (`local status`, the CLI)."""
        self.options = options
        self.state_dir = state_dir
        self.requested_runtime = options.runtime
        self.workers = options.workers
        self.actors_per_worker = options.actors_per_worker
        self._api_port = options.api_port
        self._router_port = options.router_port
        self._admin_port = options.admin_port
        self.router_timeout_s = options.router_timeout_s
        self.parked_request_max = options.parked_request_max
        self.parked_request_budget_s = options.parked_request_budget_s
        self.suspend_on_stop = options.suspend_on_stop
        # gVisor's PauseActor: "freeze" keeps paused sandboxes frozen in memory up to
        # frozen_memory bytes of PSS (default: a quarter of the memory available at start)
        self.pause_tier = options.pause_tier
        self.frozen_memory = options.frozen_memory
        # golden sandboxes kept frozen per template (gVisor)
        self.warm_pool = options.warm_pool
        # bytes of files each actor may write (None: the default 1 GiB): the process runtime's
        # actor folder, gVisor's root overlay
        self.actor_disk = options.actor_disk
        self.tls = options.tls
        self.auth = options.auth
        # the ateapi release era served on the wire (v0.3, v0.4, current): one model inside
        self.api_era = options.api_era
        # "debian": the default template runs in the built rootfs (rootfs.py); "host": on `/`
        self.default_rootfs = options.default_rootfs
        self.rootfs_dir = options.rootfs_dir
        # templates on the host's `/` (local/host) through the API: the operator's opt-in
        # (`local up --allow-host-rootfs`); a default template on the host's `/` opts in already
        self.allow_host_rootfs = options.allow_host_rootfs

    def _clear_serving_state(self) -> None:
        """What a running backend fills in: nothing runs or listens yet."""
        # the admin listener's `/_local/*` credential (`<state>/admin.token`), set at start
        self.admin_token = ""
        # with tls: the CA clients pin (`tls/ca.crt`); with jwt: the token file they send
        self.ca_file: Path | None = None
        self.token_file: Path | None = None
        self.runtime_name = ""
        self.runtime_reason = ""
        self.runtime: SandboxRuntime | None = None
        self.plane: ControlPlane | None = None
        self.metrics = Metrics()
        self.images = ImageCatalogue(self.state_dir)
        self._store: Store | None = None
        self._server: grpc.aio.Server | None = None
        self._router: Router | None = None
        self._admin: AdminServer | None = None
        self._trimmer: asyncio.Task[None] | None = None
        self._token_refresher: asyncio.Task[None] | None = None
        self._lock_fd: int | None = None
        self._instance = ""
        # True when this process exists only to serve the backend (`local up`): `local down`
        # may then SIGTERM it; an embedding program (tests, a trainer) is never signalled
        self.standalone = False
        self.api_port = 0
        self.router_port = 0
        self.admin_port = 0

    # ------------------------------------------------------------------ addresses
    @property
    def api_address(self) -> str:
        return f"127.0.0.1:{self.api_port}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def admin_url(self) -> str:
        """The backend's own endpoints: /readyz, /metrics, /_local/status, /_local/templates."""
        return f"http://127.0.0.1:{self.admin_port}"

    def provider_config(self) -> dict[str, Any]:
        """The NeMo Gym provider's `substrate:` block for this backend (`client_config.py`)."""
        return provider_config(
            self.api_address,
            self.router_url,
            ca_file=str(self.ca_file) if self.ca_file else None,
            token_file=str(self.token_file) if self.token_file else None,
        )

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

    async def start(self) -> None:
        check_crash_env()
        self._lock_fd = statedir.acquire_lock(self.state_dir)
        try:
            await self._start()
        except StateFolderFull as exc:  # a start that cannot record its state: say where
            await self._teardown(stop_sandboxes=True)
            raise BackendError(exc.message) from exc
        except BaseException:
            await self._teardown(stop_sandboxes=True)
            raise

    async def _start(self) -> None:
        """The start-up sequence, in the order that makes a failure cheap: TLS material and
        the default template before any sandbox, the plane before its listeners, and
        `backend.json` last, once everything serves."""
        # first, so a missing cryptography package fails before any sandbox starts
        security = await self._secure()
        name, reason = select_runtime(self.requested_runtime)
        self.runtime_name, self.runtime_reason = name, reason
        # before any sandbox or listener: a first start builds it (minutes, progress on stderr)
        template = await asyncio.to_thread(self._default_template, name)
        store = self._open_store()
        instance = store.get_meta("instance") or statedir.instance_name(self.state_dir)
        store.set_meta("instance", instance)
        await self._retire_other_runtime(store, name, instance)
        warning = await self._start_plane(store, name, instance, template)
        await self._serve_api(security, instance)
        trim = malloc_trim()
        if trim is not None:
            self._trimmer = asyncio.get_running_loop().create_task(trim_heap_forever(trim))
        await self._serve_router()
        await self._serve_admin()
        statedir.write_backend_info(self.state_dir, self._info(warning))

    async def _secure(self) -> Security:
        """With tls: the TLS material (`backend_security.py`), and the API token kept fresh."""
        security = await asyncio.to_thread(
            load_security, self.state_dir, tls=self.tls, auth=self.auth
        )
        self.ca_file, self.token_file = security.ca_file, security.token_file
        if security.issuer is not None:
            self._token_refresher = asyncio.get_running_loop().create_task(
                refresh_token_forever(security.issuer, security.next_refresh_s)
            )
        return security

    def _open_store(self) -> Store:
        """The state folder's database; one a newer version wrote is refused with a fix."""
        try:
            store = Store(self.state_dir / "state.db")
        except StaleStateError as exc:
            raise BackendError(str(exc)) from exc
        self._store = store
        return store

    async def _retire_other_runtime(self, store: Store, name: str, instance: str) -> None:
        """A state folder that last ran the other runtime: its sandboxes go first."""
        previous = store.get_meta("runtime")
        if previous and previous != name:
            log.warning(
                "this state folder last ran the %s runtime; cleaning up its sandboxes before "
                "starting the %s runtime (its running actors will show CRASHED)",
                previous,
                name,
            )
            with contextlib.suppress(Exception):
                old = create_runtime(
                    previous, RuntimeConfig(self.state_dir / "runtime" / previous, instance, 1)
                )
                await old.cleanup()
                await old.close()

    async def _start_plane(
        self, store: Store, name: str, instance: str, template: pb.ActorTemplate
    ) -> str | None:
        """Record the pool's shape, make the runtime and start the control plane on it (it
        adopts what a crashed run left); the runtime's warning, if any."""
        store.set_meta("runtime", name)
        slots = self.workers * self.actors_per_worker
        store.set_meta("workers", str(self.workers))
        store.set_meta("actors_per_worker", str(self.actors_per_worker))
        statedir.register(instance, self.state_dir.resolve(), name, slots)
        self._instance = instance
        extra = {"gvisor.pause_tier": self.pause_tier, "gvisor.warm_pool": str(self.warm_pool)}
        if self.frozen_memory is not None:
            extra["gvisor.frozen_memory"] = str(self.frozen_memory)
        if self.actor_disk is not None:
            extra["actor_disk"] = str(self.actor_disk)
        config = RuntimeConfig(self.state_dir / "runtime" / name, instance, slots, extra)
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
            actors_per_worker=self.actors_per_worker,
            metrics=self.metrics,
            images=self.images,
            allow_host_rootfs=self.allow_host_rootfs,
        )
        await self.plane.start([template])
        return warning

    async def _serve_api(self, security: Security, instance: str) -> None:
        """The gRPC API on its port, with the identity endpoints the TLS material allows."""
        assert self.plane is not None
        identity = Identity(
            self.plane,
            issuer=f"https://api.ate-system.svc/{instance}",
            sign_jwt=security.sign_jwt,
            issue_certificate=security.issue_certificate,
        )
        server = create_api_server(
            self.plane,
            verifier=security.verifier if self.auth == "jwt" else None,
            identity=identity,
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
            era=self.api_era,
        )
        address = f"127.0.0.1:{self._api_port}"
        try:
            if security.credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, security.credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            raise BackendError(
                f"cannot listen on 127.0.0.1:{self._api_port} for the API; pick another --api-port"
            )
        await server.start()
        self._server = server
        self.api_port = port

    async def _serve_router(self) -> None:
        """The router on its port; it reaches the plane the way atenet reaches ateapi: over
        gRPC, with the CA and, in jwt mode, the token a client would use."""
        assert self.plane is not None
        resumer = ResumeClient(
            f"127.0.0.1:{self.api_port}", ca_file=self.ca_file, token_file=self.token_file
        )
        self._router = Router(
            self.plane,
            resumer,
            self.metrics,
            route_timeout_s=self.router_timeout_s,
            parked_request_max=self.parked_request_max,
            parked_request_budget_s=self.parked_request_budget_s,
        )
        try:
            self.router_port = await self._router.start("127.0.0.1", self._router_port)
        except OSError as exc:
            raise BackendError(
                f"cannot listen on 127.0.0.1:{self._router_port} for the router ({exc}); pick "
                "another --router-port"
            ) from exc

    async def _serve_admin(self) -> None:
        """The admin listener (`admin.py`), its `/_local/*` endpoints behind a fresh token."""
        self.admin_token = await asyncio.to_thread(statedir.new_admin_token, self.state_dir)
        self._admin = AdminServer(
            self.metrics,
            {
                **image_routes(self.images),
                ("GET", "/_local/status"): self._status,
            },
            token=self.admin_token,
            token_file=str(self.state_dir / statedir.ADMIN_TOKEN_FILE),
        )
        try:
            self.admin_port = await self._admin.start("127.0.0.1", self._admin_port)
        except OSError as exc:
            raise BackendError(
                f"cannot listen on 127.0.0.1:{self._admin_port} for the admin endpoints ({exc}); "
                "pick another --admin-port"
            ) from exc

    def _info(self, warning: str | None) -> dict[str, Any]:
        """`backend.json`: where this backend serves and how, for `local status`/`down`."""
        return {
            "pid": os.getpid(),
            "api": self.api_address,
            "router": self.router_url,
            "admin": self.admin_url,
            "runtime": self.runtime_name,
            "runtime_reason": self.runtime_reason,
            "runtime_warning": warning or "",
            "instance": self._instance,
            "workers": self.workers,
            "actors_per_worker": self.actors_per_worker,
            "standalone": self.standalone,
            "started_at": time.time(),
            "tls": self.tls,
            "auth": self.auth,
            "ca_file": str(self.ca_file or ""),
            "token_file": str(self.token_file or ""),
            "admin_token_file": str(self.state_dir / statedir.ADMIN_TOKEN_FILE),
            "allow_host_rootfs": self.allow_host_rootfs,
            "api_era": self.api_era,
        }

    def _default_template(self, runtime: str) -> pb.ActorTemplate:
        """`local/sandbox`: the agent on an image volume over the Debian image (built on first
        use), or on the host's own `/`; the images join the catalogue."""
        store = self.state_dir / "snapshots" / "store"
        store.mkdir(parents=True, exist_ok=True)
        host = self.images.latest("local/host")
        assert host is not None
        if self.default_rootfs == "host":
            return default_template(store, host, None)
        if runtime == "process":
            problem = bwrap_problem()
            if problem is not None:
                raise BackendError(
                    f"the default template's own root filesystem needs bubblewrap under the "
                    f"process runtime, and {problem}; install it, or opt in to the host's root "
                    "filesystem with `--rootfs host` (LocalBackend(default_rootfs='host'))"
                )
        try:
            built = rootfs.ensure_rootfs(self.rootfs_dir)
            if rootfs.agent_form(runtime) == "unpacked":
                agent = rootfs.agent_folder(self.rootfs_dir)
            else:
                agent = rootfs.agent_binary(self.rootfs_dir)
        except rootfs.RootfsError as exc:
            raise BackendError(str(exc)) from exc
        image = self.images.add_rootfs_build(built.path, built.path / rootfs.MARKER)
        return default_template(store, image, self.images.add_agent(agent))

    async def stop(self) -> None:
        await self._teardown(stop_sandboxes=True)

    async def detach(self) -> None:
        """Stop serving but leave sandboxes running for the next start to adopt."""
        await self._teardown(stop_sandboxes=False)

    async def _teardown(self, *, stop_sandboxes: bool) -> None:
        try:
            for task in (self._trimmer, self._token_refresher):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self._trimmer = self._token_refresher = None
            if self._admin is not None:
                admin, self._admin = self._admin, None
                await admin.close()
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
                        statedir.unregister(self._instance)
                else:
                    await plane.detach()
            elif self.runtime is not None:
                await self.runtime.close()
        finally:
            # whatever failed above, the state folder is released for the next backend
            if self._store is not None:
                self._store.close()
                self._store = None
            statedir.remove_backend_info(self.state_dir, os.getpid())
            if self._lock_fd is not None:
                statedir.release_lock(self._lock_fd)
                self._lock_fd = None

    # ------------------------------------------------------------------ admin endpoints
    async def _status(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.json_response(self.status())

    def status(self) -> dict[str, Any]:
        """Workers, actors, templates and tags as plain data (for `local status`)."""
        plane = self.plane
        if plane is None:
            raise BackendError("the backend is not running")
        pool = plane.pool
        workers = [
            {
                "worker": pool.pod_name(w),
                "name": w.meta.name,
                "state": w.state,
                "capacity": w.capacity,
                "allocated": pool.allocated(w),
                "actors": sorted(pool.holders(w).values()),
                "epoch": w.epoch,
            }
            for w in pool.all()
        ]
        state = plane.state
        return {
            "runtime": self.runtime_name,
            "runtime_reason": self.runtime_reason,
            "api": self.api_address,
            "router": self.router_url,
            "admin": self.admin_url,
            "state_dir": str(self.state_dir),
            "workers": workers,
            "actors": [
                statedir.actor_row(
                    a, worker=pool.pod_name(w) if (w := pool.by_name(a.worker)) else ""
                )
                for a in sorted(state.actors.values(), key=lambda r: r.key)
            ],
            "templates": [
                statedir.template_row(t)
                for t in sorted(state.templates.values(), key=lambda r: r.meta.key)
            ],  # noqa: E501
            "tags": [
                statedir.tag_row(t) for t in sorted(state.tags.values(), key=lambda r: r.meta.key)
            ],  # noqa: E501
            "atespaces": sorted(state.atespaces),
        }


@contextlib.asynccontextmanager
async def local_provider_kwargs(
    base: dict[str, Any],
    *,
    runtime: str = "process",
    workers: int = 2,
    tls: bool = False,
    auth: str = "mtls",
) -> AsyncIterator[tuple[dict[str, Any], Any]]:
    """Start a local backend in a temporary state folder and point `base` (provider kwargs,
    e.g. a cluster's config) at it: its connection, its template, a private ledger."""
    with tempfile.TemporaryDirectory(prefix="gym-substrate-local-") as state:
        backend = LocalBackend(
            Path(state), runtime=runtime, workers=workers, actors_per_worker=1, tls=tls, auth=auth
        )
        async with backend:
            block = backend.provider_config()
            kwargs = dict(base)
            kwargs["connection"] = {**dict(base.get("connection") or {}), **block["connection"]}
            create = dict(kwargs.get("create") or {})
            # The local backend serves one template; the config's (a cluster's) does not exist.
            create["template"] = block["create"]["template"]
            kwargs["create"] = create
            lifecycle = dict(kwargs.get("lifecycle") or {})
            lifecycle.setdefault("ledger", os.path.join(state, "ledger.jsonl"))
            kwargs["lifecycle"] = lifecycle
            yield kwargs, backend
