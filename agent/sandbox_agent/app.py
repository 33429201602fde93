"""The HTTP surface of the agent (contract v1), built by `create_app(config)` with no globals.

One middleware does all cross-cutting work in a single pass, because it runs on every request
and the agent's per-exec overhead budget is a fraction of a millisecond: the access log line,
restore detection, bearer-token auth, the actor-id guard, and turning every failure into the
contract's JSON error body (never a stack trace).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import __version__
from ._config import ACTOR_ID_ENV, AgentConfig
from ._errors import ApiError, body_timeout_error, code_for_status, error_response
from ._files import FileHandlers
from ._identity import Identity, read_actor_id
from ._jobs import AnyJob, JobManager
from ._openapi import openapi_document
from ._pty import PtyManager
from ._pty_http import PtyHandlers
from ._requests import parse_exec_request
from ._routes import add_routes
from ._wire import reply
from .contract import ACTOR_ID_HEADER, Readiness

__all__ = ["create_app", "JOBS_KEY", "CONFIG_KEY", "PTY_KEY"]

log = logging.getLogger("sandbox_agent")
access_log = logging.getLogger("sandbox_agent.access")

CONFIG_KEY = web.AppKey("config", AgentConfig)
JOBS_KEY = web.AppKey("jobs", JobManager)
PTY_KEY = web.AppKey("pty", PtyManager)
IDENTITY_KEY = web.AppKey("identity", Identity)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _http_exception_response(exc: web.HTTPException) -> web.StreamResponse:
    status = exc.status
    code = code_for_status(status)
    headers: dict[str, str] = {}
    if status == 404:
        message = "no such endpoint; see GET /v1/openapi.json for the API"
    elif status == 405:
        allowed = exc.headers.get("Allow", "")
        headers["Allow"] = allowed
        message = f"method not allowed here; allowed: {allowed}"
    elif status == 413:
        message = (
            "request body too large: JSON bodies are limited to 16 MiB; "
            "move large inputs with PUT /v1/files and read them from the command"
        )
    else:
        message = exc.reason or "request failed"
    return error_response(status, code, message, headers)


def _job_response(job: AnyJob, status: int) -> web.Response:
    return web.Response(body=job.body(), status=status, content_type="application/json")


class _Agent:
    """The handlers and the middleware of one app, over its job table and PTY sessions."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.jobs = JobManager(config)
        self.ptys = PtyManager(config, self.jobs.children)
        self.identity = Identity(config.restore_jump_s)
        self.files = FileHandlers(config.max_upload_bytes, config.body_timeout_s)
        self._token = config.token.encode() if config.token else None
        self._doc_body = json.dumps(openapi_document(), indent=2).encode()

    async def current_actor_id(self) -> str | None:
        """Read the actor id now (off the loop) and let restore detection see it."""
        actor_id = await asyncio.get_running_loop().run_in_executor(
            None, read_actor_id, self.config.actor_id_file, ACTOR_ID_ENV
        )
        self.identity.observe_actor_id(actor_id)
        return actor_id

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        resp: web.StreamResponse | None = None
        try:
            await self._admit(request)
            resp = await handler(request)
        except ApiError as exc:
            resp = error_response(exc.status, exc.code, exc.message, exc.headers)
        except web.HTTPException as exc:
            resp = _http_exception_response(exc)
        except asyncio.CancelledError:
            raise
        except (ConnectionResetError, BrokenPipeError):
            access_log.info("%s %s client disconnected", request.method, request.path)
            raise
        except Exception:
            log.exception("internal error on %s %s", request.method, request.path)
            resp = error_response(
                500, "internal", "internal agent error; the agent log has the details"
            )
        access_log.info(
            "%s %s %d %.2fms",
            request.method,
            request.path,
            resp.status,
            (time.perf_counter() - start) * 1000.0,
        )
        return resp

    async def _admit(self, request: web.Request) -> None:
        """Restore detection, the bearer token and the actor-id guard, before any handler."""
        self.identity.check_clock()
        token = self._token
        if token is not None and not (request.path == "/readyz" and request.method == "GET"):
            given = request.headers.get("Authorization", "")
            if not (
                given.startswith("Bearer ")
                and hmac.compare_digest(given[7:].strip().encode(), token)
            ):
                raise ApiError(
                    401,
                    "unauthorized",
                    "missing or wrong bearer token; send Authorization: Bearer <token>",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        claimed = request.headers.get(ACTOR_ID_HEADER)
        # An unknown path or method runs nothing: it gets its 404/405, whatever the actor.
        if claimed is not None and request.match_info.http_exception is None:
            actual = await self.current_actor_id()
            if actual is not None and claimed != actual:
                raise ApiError(
                    409,
                    "actor_mismatch",
                    f"this sandbox is actor {actual!r}, not {claimed!r}; the request was "
                    "not executed (stale address?)",
                )

    async def readyz(self, request: web.Request, query: dict[str, Any]) -> web.Response:
        actor_id = await self.current_actor_id()
        values = {
            "status": "ok",
            "agent_version": __version__,
            "actor_id": actor_id,
            "boot_id": self.identity.boot_id,
            "uptime_s": round(self.identity.uptime_s, 3),
        }
        return web.json_response(reply(Readiness, values))

    async def openapi(self, request: web.Request, query: dict[str, Any]) -> web.Response:
        return web.Response(body=self._doc_body, content_type="application/json")

    async def read_json(self, request: web.Request) -> Any:
        timeout = self.config.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                body = await request.read()
        except TimeoutError:
            raise body_timeout_error(timeout) from None
        if not body:
            raise ApiError(400, "bad_request", "the body must be a JSON object, got nothing")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "bad_request", f"the body is not valid JSON: {exc}") from None
        except RecursionError:
            msg = "the body is not a usable JSON object: arrays or objects nested too deeply"
            raise ApiError(400, "bad_request", msg) from None

    async def exec_start(self, request: web.Request, query: dict[str, Any]) -> web.Response:
        job_id, spec = parse_exec_request(await self.read_json(request))
        log.debug("exec %s: %r", job_id, spec.argv)
        job = await self.jobs.submit(job_id, spec)
        await self.jobs.wait(job, query["wait"])
        return _job_response(job, 200 if job.finished else 202)

    def _job_or_404(self, request: web.Request) -> AnyJob:
        job_id = request.match_info["job_id"]
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(
                404,
                "not_found",
                f"no job {job_id!r}: never started here, or finished long ago and dropped",
            )
        return job

    async def exec_get(self, request: web.Request, query: dict[str, Any]) -> web.Response:
        job = self._job_or_404(request)
        await self.jobs.wait(job, query["wait"])
        return _job_response(job, 200)

    async def exec_delete(self, request: web.Request, query: dict[str, Any]) -> web.Response:
        job = await self.jobs.kill(self._job_or_404(request))
        return _job_response(job, 200)

    async def on_startup(self, app: web.Application) -> None:
        if self.config.reap_orphans:
            self.jobs.reap_orphans()
        await self.current_actor_id()

    async def on_shutdown(self, app: web.Application) -> None:
        await asyncio.gather(self.jobs.shutdown(), self.ptys.shutdown())


def create_app(config: AgentConfig | None = None) -> web.Application:
    """Build the agent's aiohttp application for `config` (defaults: the contract's values)."""
    config = config or AgentConfig()
    agent = _Agent(config)
    app = web.Application(middlewares=[agent.middleware], client_max_size=config.max_json_bytes)
    app[CONFIG_KEY] = config
    app[JOBS_KEY] = agent.jobs
    app[IDENTITY_KEY] = agent.identity
    app[PTY_KEY] = agent.ptys
    files = agent.files
    pty = PtyHandlers(agent.ptys, config, agent.read_json)
    add_routes(
        app.router,
        {
            "readyz": agent.readyz,
            "openapi": agent.openapi,
            "execStart": agent.exec_start,
            "execGet": agent.exec_get,
            "execKill": agent.exec_delete,
            "filePut": files.put,
            "fileGet": files.get,
            "fileHead": files.get,
            "stat": files.stat,
            "ptyCreate": pty.create,
            "ptyGet": pty.get,
            "ptyClose": pty.delete,
            "ptyOutput": pty.output,
            "ptyInput": pty.input,
            "ptyResize": pty.resize,
            "ptySignal": pty.signal,
        },
    )
    app.on_startup.append(agent.on_startup)
    app.on_shutdown.append(agent.on_shutdown)
    return app
