"""The backend's own HTTP endpoints, on a listener of their own, off the router's data path.

Substrate's router port answers actor traffic only: a Host that names no actor is 404 there,
`/readyz` and `/metrics` included (its metrics and status pages live on other ports). So the
local backend serves its readiness, its Prometheus metrics and its admin calls
(`GET /_local/status`, `GET`/`POST /_local/images`) here, on `127.0.0.1:<admin port>`, whatever the
Host; the `/_local/*` calls need the operator's token from `<state>/admin.token` (`AdminServer`).
It shares the backend's event loop with the router, so it cannot be allowed to stall it:
a body is read at most `limit` bytes (`read_limited`), the request head has the router's 10 s
deadline, and the handlers parse YAML in a worker thread.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from gym_substrate.local.metrics import CONTENT_TYPE, Metrics
from gym_substrate.local.router import HEAD_TIMEOUT_S, HeadDeadlineServer

__all__ = ["AdminHandler", "AdminServer", "json_error", "read_limited"]

AdminHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


async def read_limited(request: web.BaseRequest, limit: int) -> bytes | None:
    """The whole body, or None once it is known to exceed ``limit`` bytes (nothing more read)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def json_error(status: int, code: str, message: str) -> web.Response:
    response = web.Response(
        status=status,
        text=json.dumps({"error": {"code": code, "message": message}}),
        content_type="application/json",
    )
    if status == 413:
        # the rest of the body was not read: on this connection it would be taken for the
        # next request's head
        response.force_close()
    return response


class AdminServer:
    """`/readyz`, `/metrics` and the backend's ``routes`` on one aiohttp listener.

    With a ``token``, the routes (`/_local/*`: status, image registration) answer only a request
    that carries it as `Authorization: Bearer <token>`, checked before any body is read: the
    listener is on loopback, where a sandbox that shares the host's network could reach it, and
    registering `/` as an image is a way onto the host. `/readyz` and `/metrics` stay open.
    """

    def __init__(
        self,
        metrics: Metrics,
        routes: dict[tuple[str, str], AdminHandler],
        *,
        token: str | None = None,
        token_file: str = "",
    ) -> None:
        self.metrics = metrics
        self.routes = dict(routes)
        self._token = token
        self._token_file = token_file
        self._runner: web.ServerRunner | None = None
        self.port = 0

    def _authorized(self, request: web.BaseRequest) -> bool:
        scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
        assert self._token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(
            sent.strip().encode(), self._token.encode()
        )

    async def start(self, host: str, port: int) -> int:
        server = HeadDeadlineServer(
            self._handle, head_timeout_s=HEAD_TIMEOUT_S, max_field_size=65536, access_log=None
        )
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/metrics" and request.method == "GET":
            return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})
        if path == "/readyz" and request.method == "GET":
            return web.json_response({"status": "ok"})
        handler = self.routes.get((request.method, path))
        if handler is not None:
            if self._token is not None and not self._authorized(request):
                response = json_error(
                    401,
                    "unauthorized",
                    f"{request.method} {path} answers only the backend's operator: send "
                    f"`Authorization: Bearer <the token in {self._token_file or 'admin.token'}>` "
                    "(the gym-substrate CLI does)",
                )
                response.force_close()  # its body, if any, was not read
                return response
            return await handler(request)
        served = ["GET /readyz", "GET /metrics", *(f"{m} {p}" for m, p in sorted(self.routes))]
        return json_error(
            404,
            "not_found",
            f"no admin endpoint {request.method} {path}; this port serves {', '.join(served)} "
            "(actor traffic goes to the router port)",
        )
