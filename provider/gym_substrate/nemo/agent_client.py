"""HTTP client for the sandbox agent (contract v1), reached through the Substrate router.

Every request names its actor in the `ate-target-actor: <atespace>/<name>` header, which the
router routes on (Host passes through to the agent unchanged).

A client is a few strings over a shared `HttpTransport`, so making one per call costs nothing.
The transport is the one seam to the network (as httpx's transports): `AiohttpTransport` in
production, an in-memory fake in tests, no patching. Every response is classified here into
"the agent answered" (JSON error object -> `AgentResponseError`) or "the router answered"
(anything else non-2xx -> `RouterError`, 503 -> `ActorUnavailableError`); transport failures
become `AgentTransportError`.

Requests are built from the agent's endpoint table (`sandbox_agent.endpoints`: method, path,
query names and the text of their values), and every success answer is checked against the
table before a caller sees it: a status or a body the contract does not declare is an
`AgentProtocolError` naming the endpoint and the field. Retrying is the caller's job: only the
caller knows whether a request is idempotent (exec submissions carry a client id; file chunks
carry an offset).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import quote, urlsplit

import aiohttp

from gym_substrate.core.names import TARGET_ACTOR_HEADER, target_actor
from gym_substrate.nemo._connhints import http_hint
from gym_substrate.nemo.errors import (
    ActorMismatchError,
    ActorUnavailableError,
    AgentProtocolError,
    AgentResponseError,
    AgentTransportError,
    ConnectionConfigError,
    RouterError,
    translate_http_errors,
)
from sandbox_agent.contract import (
    ACTOR_ID_HEADER,
    FileStat,
    Job,
    PtyInputReply,
    PtyOutput,
    PtyRequest,
    PtySession,
    Readiness,
    UploadReply,
)
from sandbox_agent.endpoints import (
    EXEC_GET,
    EXEC_KILL,
    EXEC_START,
    FILE_GET,
    FILE_PUT,
    PTY_CLOSE,
    PTY_CREATE,
    PTY_GET,
    PTY_INPUT,
    PTY_OUTPUT,
    PTY_RESIZE,
    PTY_SIGNAL,
    READYZ,
    STAT,
    Bytes,
    Endpoint,
    ReplyError,
)

__all__ = ["AgentClient", "AiohttpTransport", "HttpResponse", "HttpTransport"]


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


class HttpTransport(Protocol):
    """Send one HTTP request and return the whole response; raise `AgentTransportError`."""

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
        what: str,
    ) -> HttpResponse: ...


@dataclass(frozen=True)
class AiohttpTransport:
    """`HttpTransport` over one shared aiohttp pool (the only code here that sees aiohttp)."""

    session: aiohttp.ClientSession

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
        what: str,
    ) -> HttpResponse:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            with translate_http_errors(what):
                async with self.session.request(
                    method, url, params=params, data=body, headers=dict(headers), timeout=timeout
                ) as resp:
                    payload = await resp.read()
                    return HttpResponse(
                        resp.status, {k.lower(): v for k, v in resp.headers.items()}, payload
                    )
        except AgentTransportError as exc:
            # Something that is not a router (ateapi's gRPC port, say) fails the same way every
            # time: say which key to change instead of retrying until the deadline.
            parts = urlsplit(url)
            hint = http_hint(f"{parts.scheme}://{parts.netloc}", str(exc.__cause__ or exc))
            if hint is None:
                raise
            raise ConnectionConfigError(f"{what}: {hint.text}", key=hint.key) from exc


@dataclass(frozen=True)
class AgentClient:
    transport: HttpTransport
    router: str
    actor_id: str
    atespace: str
    request_timeout_s: float = 20.0

    @property
    def target(self) -> str:
        return target_actor(self.atespace, self.actor_id)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # The router routes on `ate-target-actor`; the agent checks `X-Sandbox-Actor-Id`, so a
        # request the router delivers to the wrong sandbox does nothing there.
        headers = {TARGET_ACTOR_HEADER: self.target, ACTOR_ID_HEADER: self.actor_id}
        if extra:
            headers.update(extra)
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        what = f"{method} {path} on {self.actor_id}"
        body = data
        hdrs = self._headers(headers)
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs["Content-Type"] = "application/json"
        resp = await self.transport.request(
            method,
            self.router + path,
            params=params,
            headers=hdrs,
            body=body,
            timeout_s=timeout_s or self.request_timeout_s,
            what=what,
        )
        if resp.status < 300:
            return resp.status, dict(resp.headers), resp.body
        raise self._classify(what, resp.status, dict(resp.headers), resp.body)

    @staticmethod
    def _classify(what: str, status: int, headers: dict[str, str], payload: bytes) -> Exception:
        if headers.get("content-type", "").startswith("application/json"):
            try:
                err = json.loads(payload).get("error")
            except (ValueError, AttributeError):
                err = None
            if isinstance(err, dict) and "code" in err:
                code = str(err.get("code"))
                message = f"{what}: agent {status} {code}: {err.get('message', '')}"
                cls = ActorMismatchError if code == "actor_mismatch" else AgentResponseError
                return cls(message, status=status, code=code)
        text = payload[:500].decode("utf-8", "replace").strip()
        message = f"{what}: router {status}: {text}" if text else f"{what}: router {status}"
        cls2 = ActorUnavailableError if status == 503 else RouterError
        return cls2(message, status=status, body=text)

    async def _call(
        self,
        endpoint: Endpoint,
        *,
        segments: Mapping[str, str] | None = None,
        query: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[Any, dict[str, str]]:
        """One request to `endpoint` of the table, its reply checked against the declaration.

        The path, the query's names and the text of its values come from the table; a success
        answer the table does not declare, or a body that breaks its declaration, is an
        `AgentProtocolError` naming the endpoint and the field.
        """
        path = endpoint.url(**{k: quote(v, safe="") for k, v in (segments or {}).items()})
        hdrs = dict(headers or {})
        if endpoint.body is not None and endpoint.body.shape is Bytes:
            hdrs["Content-Type"] = "application/octet-stream"
        elif data is not None or (json_body is not None and endpoint.body is None):
            raise TypeError(f"{endpoint.what} takes {endpoint.body}, not this body")
        status, answer_headers, payload = await self._request(
            endpoint.method,
            path,
            params=endpoint.query(query or {}) or None,
            json_body=json_body,
            data=data,
            headers=hdrs,
            timeout_s=timeout_s,
        )
        try:
            return endpoint.check_reply(status, payload), answer_headers
        except ReplyError as exc:
            what = f"{endpoint.method} {path} on {self.actor_id}"
            raise AgentProtocolError(f"{what}: {exc}", status=status, code="bad_reply") from exc

    def _polled(self, wait_s: float) -> float:
        """The timeout of a request that the agent may hold for `wait_s`."""
        return wait_s + self.request_timeout_s

    async def readyz(self, timeout_s: float = 5.0) -> Readiness:
        reply, _ = await self._call(READYZ, timeout_s=timeout_s)
        return cast(Readiness, reply)

    async def submit(self, job: Mapping[str, Any], wait_s: float) -> Job:
        reply, _ = await self._call(
            EXEC_START, query={"wait": wait_s}, json_body=job, timeout_s=self._polled(wait_s)
        )
        return cast(Job, reply)

    async def poll(self, job_id: str, wait_s: float) -> Job:
        reply, _ = await self._call(
            EXEC_GET,
            segments={"job_id": job_id},
            query={"wait": wait_s},
            timeout_s=self._polled(wait_s),
        )
        return cast(Job, reply)

    async def kill(self, job_id: str) -> Job:
        reply, _ = await self._call(EXEC_KILL, segments={"job_id": job_id})
        return cast(Job, reply)

    async def put_chunk(
        self, path: str, offset: int, data: bytes, *, final: bool, mode: int
    ) -> UploadReply:
        query = {"path": path, "offset": offset, "final": final, "mode": mode}
        reply, _ = await self._call(FILE_PUT, query=query, data=data)
        return cast(UploadReply, reply)

    async def stat(self, path: str) -> FileStat:
        reply, _ = await self._call(STAT, query={"path": path})
        return cast(FileStat, reply)

    async def get_range(self, path: str, start: int, end: int) -> tuple[bytes, dict[str, str]]:
        """Bytes [start, end] inclusive of `path`."""
        reply, headers = await self._call(
            FILE_GET, query={"path": path}, headers={"Range": f"bytes={start}-{end}"}
        )
        return cast(bytes, reply), headers

    # ------------------------------------------------------------------ PTY sessions

    async def pty_create(self, body: PtyRequest) -> PtySession:
        reply, _ = await self._call(PTY_CREATE, json_body=body)
        return cast(PtySession, reply)

    async def pty_get(self, session_id: str, wait_s: float = 0.0) -> PtySession:
        reply, _ = await self._call(
            PTY_GET,
            segments={"session_id": session_id},
            query={"wait": wait_s},
            timeout_s=self._polled(wait_s),
        )
        return cast(PtySession, reply)

    async def pty_output(
        self, session_id: str, stream: str, offset: int, wait_s: float
    ) -> PtyOutput:
        reply, _ = await self._call(
            PTY_OUTPUT,
            segments={"session_id": session_id},
            query={"stream": stream, "offset": offset, "wait": wait_s},
            timeout_s=self._polled(wait_s),
        )
        return cast(PtyOutput, reply)

    async def pty_input(self, session_id: str, offset: int, data: bytes) -> PtyInputReply:
        reply, _ = await self._call(
            PTY_INPUT, segments={"session_id": session_id}, query={"offset": offset}, data=data
        )
        return cast(PtyInputReply, reply)

    async def pty_resize(self, session_id: str, rows: int, cols: int) -> PtySession:
        reply, _ = await self._call(
            PTY_RESIZE, segments={"session_id": session_id}, json_body={"rows": rows, "cols": cols}
        )
        return cast(PtySession, reply)

    async def pty_signal(self, session_id: str, name: str) -> PtySession:
        reply, _ = await self._call(
            PTY_SIGNAL, segments={"session_id": session_id}, json_body={"signal": name}
        )
        return cast(PtySession, reply)

    async def pty_close(self, session_id: str) -> PtySession:
        reply, _ = await self._call(PTY_CLOSE, segments={"session_id": session_id})
        return cast(PtySession, reply)
