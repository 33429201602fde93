"""Fixtures for the provider tests: a real local backend plus two fault injectors in front of it.

`GrpcFaultProxy` is a gRPC server that forwards every `ateapi.Control` call to the backend unless
a fault is queued for that method; `HttpFaultProxy` does the same for the router. Both count calls
so tests can assert what the provider did (e.g. "ResumeActor was called after the 503"). The
provider under test only ever sees the proxies' addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import pytest
from aiohttp import web

from gym_substrate import SubstrateProvider
from gym_substrate.ateapi import ateapi_pb2 as pb

TEMPLATE = "local/sandbox"

# The Gym conformance tests need nemo-gym on sys.path before gym_substrate.nemo.types is imported;
# test_gym_conformance.py runs them in a subprocess that sets this.
collect_ignore = [] if os.environ.get("GYM_SUBSTRATE_GYM_CONFORMANCE") else ["gym_conformance"]
# The forwarder serves every Control RPC the proto declares, and relays reflection.
_METHODS = tuple(m.name for m in pb.DESCRIPTOR.services_by_name["Control"].methods)
_REFLECTION = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")


@dataclass
class GrpcFault:
    code: grpc.StatusCode
    details: str = ""
    after_forward: bool = False  # forward the call, then report the fault (lost response)


class GrpcFaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults: dict[str, list[GrpcFault]] = defaultdict(list)
        self.calls: dict[str, int] = defaultdict(int)
        self.metadata: dict[str, dict[str, str]] = {}
        self.random_fault: Callable[[str], GrpcFault | None] | None = None
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self.address = ""

    def inject(
        self,
        method: str,
        code: grpc.StatusCode,
        details: str = "",
        *,
        times: int = 1,
        after_forward: bool = False,
    ) -> None:
        self.faults[method].extend([GrpcFault(code, details, after_forward)] * times)

    async def start(self) -> None:
        """Forward each call's bytes unchanged (the backend's API era is the client's to
        speak), and the server's reflection, by which the provider reads that era."""
        self._channel = grpc.aio.insecure_channel(self.upstream)
        handlers = {
            method: grpc.unary_unary_rpc_method_handler(
                self._forwarder(method, self._channel.unary_unary(f"/ateapi.Control/{method}"))
            )
            for method in _METHODS
        }
        self._server = grpc.aio.server()
        generic = [grpc.method_handlers_generic_handler("ateapi.Control", handlers)]
        for service in _REFLECTION:
            relay = self._relay(self._channel.stream_stream(f"/{service}/ServerReflectionInfo"))
            handler = grpc.stream_stream_rpc_method_handler(relay)
            generic.append(
                grpc.method_handlers_generic_handler(service, {"ServerReflectionInfo": handler})
            )
        self._server.add_generic_rpc_handlers(tuple(generic))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"

    @staticmethod
    def _relay(call: Any) -> Any:
        async def relay(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async for reply in call(requests):
                    yield reply
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")

        return relay

    def _forwarder(self, method: str, call: Any) -> Any:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self.calls[method] += 1
            self.metadata[method] = {k: str(v) for k, v in context.invocation_metadata() or ()}
            fault = self.faults[method].pop(0) if self.faults[method] else None
            if fault is None and self.random_fault is not None:
                fault = self.random_fault(method)
            if fault is not None and not fault.after_forward:
                await context.abort(fault.code, fault.details)
            try:
                response = await call(request)
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            if fault is not None:
                await context.abort(fault.code, fault.details)
            return response

        return handler

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
        if self._channel is not None:
            await self._channel.close()


@dataclass
class HttpFault:
    """`kind`: "reset_before" (drop the connection, nothing forwarded), "reset_after"
    (forward, then drop the connection instead of answering), or "status" (answer `status`
    as the router would, nothing forwarded)."""

    kind: str
    status: int = 503
    method: str = ""
    path_prefix: str = ""


@dataclass
class HttpFaultProxy:
    upstream: str
    faults: list[HttpFault] = field(default_factory=list)
    seen: list[tuple[str, str]] = field(default_factory=list)
    random_fault: Callable[[str, str], HttpFault | None] | None = None
    url: str = ""
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    def inject(
        self,
        kind: str,
        *,
        method: str = "",
        path_prefix: str = "",
        status: int = 503,
        times: int = 1,
    ) -> None:
        self.faults.extend([HttpFault(kind, status, method, path_prefix)] * times)

    def requests(self, method: str, path_prefix: str) -> int:
        """How many requests of `method` under `path_prefix` passed through."""
        return sum(m == method and p.startswith(path_prefix) for m, p in self.seen)

    def _take(self, method: str, path: str) -> HttpFault | None:
        for i, f in enumerate(self.faults):
            if (not f.method or f.method == method) and path.startswith(f.path_prefix):
                return self.faults.pop(i)
        if self.random_fault is not None:
            return self.random_fault(method, path)
        return None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=128 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path))
        fault = self._take(request.method, request.path)
        if fault is not None and fault.kind == "status":
            return web.Response(
                status=fault.status, text=f"injected {fault.status}", content_type="text/plain"
            )
        if fault is not None and fault.kind == "reset_before":
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError
        assert self._session is not None
        body = await request.read()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "connection")
        }
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            if fault is not None and fault.kind == "reset_after":
                assert request.transport is not None
                request.transport.abort()
                raise ConnectionResetError
            out_headers = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() in ("content-type", "content-range", "accept-ranges")
            }
            return web.Response(status=resp.status, body=payload, headers=out_headers)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


@dataclass
class Stack:
    backend: Any
    grpc_proxy: GrpcFaultProxy
    http_proxy: HttpFaultProxy
    tmp: Path

    def kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Provider kwargs pointing at the proxies, with fast timings for tests."""
        conn = {
            "api": self.grpc_proxy.address,
            "router": self.http_proxy.url,
            "tls": {"plaintext": True},
            "request_timeout_s": 10,
        }
        cfg: dict[str, Any] = {
            "connection": conn,
            "create": {
                "template": TEMPLATE,
                "ready_timeout_s": 20,
                "retry": {"initial": 0.01, "maximum": 0.1, "deadline": 10},
            },
            "exec": {"poll_wait_s": 2, "timeout_margin_s": 2},
            "lifecycle": {"ledger": str(self.tmp / "ledger.jsonl"), "close_timeout_s": 20},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = value
        return cfg

    def provider(self, **overrides: Any) -> SubstrateProvider:
        return SubstrateProvider(**self.kwargs(**overrides))

    @contextlib.asynccontextmanager
    async def control(self) -> AsyncIterator[Any]:
        """A control client straight to the backend (no proxy, no faults)."""
        from gym_substrate.nemo.config import ConnectionConfig
        from gym_substrate.nemo.control_client import ControlClient, create_channel

        conn = ConnectionConfig(
            api=self.backend.api_address, router=self.backend.router_url, tls={"plaintext": True}
        )  # type: ignore[arg-type]
        channel = create_channel(conn)
        try:
            yield ControlClient(channel, conn)
        finally:
            await channel.close()

    async def actors(self, atespace: str = "gym") -> list[str]:
        async with self.control() as control:
            return [a.metadata.name for a in await control.list_actors(atespace)]

    async def golden_built(self, template: str = TEMPLATE, limit_s: float = 60) -> None:
        """Wait until the template's golden snapshot is tagged, so a test's own deadlines (and
        its counts of calls) start from a backend whose template is ready."""
        async with self.control() as control:
            deadline = asyncio.get_running_loop().time() + limit_s
            while True:
                found = await control.get_actor_template(template)
                golden = found.status.golden_snapshot_status
                if golden.golden_tag.name:
                    return
                if golden.error_message:
                    raise RuntimeError(f"{template}: golden build failed: {golden.error_message}")
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"{template}: no golden snapshot after {limit_s} s")
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def make_stack(
    tmp: Path, *, workers: int = 4, runtime: str = "process", api_era: str | None = None
) -> AsyncIterator[Stack]:
    """A local backend with room for `workers` running actors (one actor per worker), serving
    ``api_era`` on the wire (default: $GYM_SUBSTRATE_API_ERA, else current)."""
    from gym_substrate.local import LocalBackend

    async with LocalBackend(
        tmp / "state",
        runtime=runtime,
        workers=workers,
        actors_per_worker=1,
        default_rootfs="host",
        api_era=api_era,
    ) as backend:
        gproxy = GrpcFaultProxy(backend.api_address)
        hproxy = HttpFaultProxy(backend.router_url)
        await gproxy.start()
        await hproxy.start()
        try:
            stack = Stack(backend, gproxy, hproxy, tmp)
            await stack.golden_built()
            yield stack
        finally:
            await hproxy.stop()
            await gproxy.stop()


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with make_stack(tmp_path) as s:
        yield s


@pytest.fixture
def marker_dir(tmp_path: Path) -> Path:
    d = tmp_path / "markers"
    d.mkdir()
    os.chmod(d, 0o777)
    return d


def count_runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


async def sandbox_runs(provider: SubstrateProvider, handle: Any, path: str, scratch: Path) -> int:
    """How many lines a file inside the sandbox has, read back through the provider's own
    download (the sandbox's /tmp is its own, so host paths would see nothing)."""
    local = scratch / f"{uuid.uuid4().hex}.runs"
    await provider.download_file(handle, path, local)
    return count_runs(local)


def sandbox_marker() -> str:
    """A fresh path inside a sandbox for a command to append a line to every time it runs."""
    return f"/tmp/runs-{uuid.uuid4().hex}"


@pytest.fixture
def run_counter() -> Callable[[Path], int]:
    return count_runs


async def gather_limited(n: int, coros: list[Any]) -> list[Any]:
    sem = asyncio.Semaphore(n)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))
