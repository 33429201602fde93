"""The HTTP surface of the agent (contract v1), built by `create_app(config)` with no globals.

`App.handle` does all cross-cutting work in a single pass, because it runs on every request
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
from typing import TYPE_CHECKING, Any

from . import __version__
from ._config import ACTOR_ID_ENV, AgentConfig
from ._errors import ApiError, body_timeout_error, code_for_status, error_response
from ._files import FileHandlers
from ._http import HTTPError, Request, Response, json_response
from ._identity import Identity, read_actor_id
from ._jobs import AnyJob, JobManager
from ._requests import parse_exec_request
from ._routes import EndpointHandler, Router
from ._wire import reply
from .contract import ACTOR_ID_HEADER, Readiness

if TYPE_CHECKING:
    from ._pty import PtyManager
    from ._pty_http import PtyHandlers

__all__ = ["App", "create_app"]

log = logging.getLogger("sandbox_agent")
access_log = logging.getLogger("sandbox_agent.access")


def _http_error_response(exc: HTTPError) -> Response:
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
        message = exc.message or "request failed"
    return error_response(status, code, message, headers)


def _job_response(job: AnyJob, status: int) -> Response:
    return Response(job.body(), status)


class App:
    """The handlers of one agent, over its job table and PTY sessions, and `handle`, which every
    request goes through."""

    router: Router

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.jobs = JobManager(config)
        self._ptys: PtyManager | None = None
        self._pty_handlers: PtyHandlers | None = None
        self.identity = Identity(config.restore_jump_s)
        self.files = FileHandlers(config.max_upload_bytes, config.body_timeout_s)
        self._token = config.token.encode() if config.token else None
        self._doc_body: bytes | None = None

    async def current_actor_id(self) -> str | None:
        """Read the actor id now (off the loop) and let restore detection see it."""
        actor_id = await asyncio.get_running_loop().run_in_executor(
            None, read_actor_id, self.config.actor_id_file, ACTOR_ID_ENV
        )
        self.identity.observe_actor_id(actor_id)
        return actor_id

    async def handle(self, request: Request) -> Response:
        start = time.perf_counter()
        resp: Response | None = None
        try:
            try:
                handler = self.router.resolve(request)
            except HTTPError as exc:
                await self._admit(request, routed=False)
                raise exc from None
            await self._admit(request, routed=True)
            resp = await handler(request)
        except ApiError as exc:
            resp = error_response(exc.status, exc.code, exc.message, exc.headers)
        except HTTPError as exc:
            resp = _http_error_response(exc)
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

    async def _admit(self, request: Request, routed: bool) -> None:
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
        if claimed is not None and routed:
            actual = await self.current_actor_id()
            if actual is not None and claimed != actual:
                raise ApiError(
                    409,
                    "actor_mismatch",
                    f"this sandbox is actor {actual!r}, not {claimed!r}; the request was "
                    "not executed (stale address?)",
                )

    async def readyz(self, request: Request, query: dict[str, Any]) -> Response:
        actor_id = await self.current_actor_id()
        values = {
            "status": "ok",
            "agent_version": __version__,
            "actor_id": actor_id,
            "boot_id": self.identity.boot_id,
            "uptime_s": round(self.identity.uptime_s, 3),
        }
        return json_response(reply(Readiness, values))

    async def openapi(self, request: Request, query: dict[str, Any]) -> Response:
        if self._doc_body is None:
            from ._openapi import openapi_document  # only for this rare request: saves memory

            self._doc_body = json.dumps(openapi_document(), indent=2).encode()
        return Response(self._doc_body)

    async def read_json(self, request: Request) -> Any:
        timeout = self.config.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                body = await request.read(self.config.max_json_bytes)
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

    async def exec_start(self, request: Request, query: dict[str, Any]) -> Response:
        job_id, spec = parse_exec_request(await self.read_json(request))
        log.debug("exec %s: %r", job_id, spec.argv)
        job = await self.jobs.submit(job_id, spec)
        await self.jobs.wait(job, query["wait"])
        return _job_response(job, 200 if job.finished else 202)

    def _job_or_404(self, request: Request) -> AnyJob:
        job_id = request.match_info["job_id"]
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(
                404,
                "not_found",
                f"no job {job_id!r}: never started here, or finished long ago and dropped",
            )
        return job

    async def exec_get(self, request: Request, query: dict[str, Any]) -> Response:
        job = self._job_or_404(request)
        await self.jobs.wait(job, query["wait"])
        return _job_response(job, 200)

    async def exec_delete(self, request: Request, query: dict[str, Any]) -> Response:
        job = await self.jobs.kill(self._job_or_404(request))
        return _job_response(job, 200)

    async def startup(self) -> None:
        if self.config.reap_orphans:
            self.jobs.reap_orphans()
        await self.current_actor_id()

    async def shutdown(self) -> None:
        if self._ptys is None:
            await self.jobs.shutdown()
        else:
            await asyncio.gather(self.jobs.shutdown(), self._ptys.shutdown())

    @property
    def ptys(self) -> PtyManager:
        """The PTY sessions, made (and their modules imported) on the first PTY request: most
        sandboxes never open one, and the modules cost memory in every sandbox."""
        if self._ptys is None:
            from ._pty import PtyManager

            self._ptys = PtyManager(self.config, self.jobs.children)
        return self._ptys

    def pty_handler(self, name: str) -> EndpointHandler:
        """The /v1/pty handler `name` of `PtyHandlers`, bound on its first request."""

        async def handle(request: Request, query: dict[str, Any]) -> Response:
            if self._pty_handlers is None:
                from ._pty_http import PtyHandlers

                self._pty_handlers = PtyHandlers(self.ptys, self.config, self.read_json)
            handler: EndpointHandler = getattr(self._pty_handlers, name)
            return await handler(request, query)

        return handle


def create_app(config: AgentConfig | None = None) -> App:
    """Build the agent's application for `config` (defaults: the contract's values)."""
    app = App(config or AgentConfig())
    files = app.files
    pty = app.pty_handler
    app.router = Router(
        {
            "readyz": app.readyz,
            "openapi": app.openapi,
            "execStart": app.exec_start,
            "execGet": app.exec_get,
            "execKill": app.exec_delete,
            "filePut": files.put,
            "fileGet": files.get,
            "fileHead": files.get,
            "stat": files.stat,
            "ptyCreate": pty("create"),
            "ptyGet": pty("get"),
            "ptyClose": pty("delete"),
            "ptyOutput": pty("output"),
            "ptyInput": pty("input"),
            "ptyResize": pty("resize"),
            "ptySignal": pty("signal"),
        }
    )
    return app
