"""HTTP client for the sandbox agent (contract v1), reached through the Substrate router.

Every request names its actor in the `ate-target-actor: <atespace>/<name>` header, which the
router routes on (Host passes through to the agent unchanged).

A client is a few strings over a shared `HttpTransport`, so making one per call costs nothing.
The transport is the one seam to the network (as httpx's transports): `AiohttpTransport` in
production, an in-memory fake in tests, no patching. Every response is classified here into
"the agent answered" (JSON error object -> `AgentResponseError`) or "the router answered"
(anything else non-2xx -> `RouterError`, 503 -> `ActorUnavailableError`); transport failures
become `AgentTransportError`. Retrying is the caller's job: only the caller knows whether a
request is idempotent (exec submissions carry a client id; file chunks carry an offset).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import aiohttp

from gym_substrate.core.names import TARGET_ACTOR_HEADER, target_actor
from gym_substrate.nemo._connhints import http_hint
from gym_substrate.nemo.errors import (
    ActorMismatchError,
    ActorUnavailableError,
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

    async def readyz(self, timeout_s: float = 5.0) -> Readiness:
        _, _, body = await self._request("GET", "/readyz", timeout_s=timeout_s)
        return cast(Readiness, json.loads(body))

    async def submit(self, job: Mapping[str, Any], wait_s: float) -> Job:
        _, _, body = await self._request(
            "POST",
            "/v1/exec",
            params={"wait": f"{wait_s:.3f}"},
            json_body=job,
            timeout_s=wait_s + self.request_timeout_s,
        )
        return cast(Job, json.loads(body))

    async def poll(self, job_id: str, wait_s: float) -> Job:
        _, _, body = await self._request(
            "GET",
            f"/v1/exec/{job_id}",
            params={"wait": f"{wait_s:.3f}"},
            timeout_s=wait_s + self.request_timeout_s,
        )
        return cast(Job, json.loads(body))

    async def kill(self, job_id: str) -> Job:
        _, _, body = await self._request("DELETE", f"/v1/exec/{job_id}")
        return cast(Job, json.loads(body))

    async def put_chunk(
        self, path: str, offset: int, data: bytes, *, final: bool, mode: int
    ) -> UploadReply:
        params = {
            "path": path,
            "offset": str(offset),
            "final": "true" if final else "false",
            "mode": f"{mode:o}",
        }
        _, _, body = await self._request(
            "PUT",
            "/v1/files",
            params=params,
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return cast(UploadReply, json.loads(body))

    async def stat(self, path: str) -> FileStat:
        _, _, body = await self._request("GET", "/v1/stat", params={"path": path})
        return cast(FileStat, json.loads(body))

    async def get_range(self, path: str, start: int, end: int) -> tuple[bytes, dict[str, str]]:
        """Bytes [start, end] inclusive of `path`."""
        _, headers, body = await self._request(
            "GET", "/v1/files", params={"path": path}, headers={"Range": f"bytes={start}-{end}"}
        )
        return body, headers

    # ------------------------------------------------------------------ PTY sessions

    async def pty_create(self, body: PtyRequest) -> PtySession:
        _, _, payload = await self._request("POST", "/v1/pty", json_body=body)
        return cast(PtySession, json.loads(payload))

    async def pty_get(self, session_id: str, wait_s: float = 0.0) -> PtySession:
        _, _, payload = await self._request(
            "GET",
            f"/v1/pty/{session_id}",
            params={"wait": f"{wait_s:.3f}"},
            timeout_s=wait_s + self.request_timeout_s,
        )
        return cast(PtySession, json.loads(payload))

    async def pty_output(
        self, session_id: str, stream: str, offset: int, wait_s: float
    ) -> PtyOutput:
        _, _, payload = await self._request(
            "GET",
            f"/v1/pty/{session_id}/output",
            params={"stream": stream, "offset": str(offset), "wait": f"{wait_s:.3f}"},
            timeout_s=wait_s + self.request_timeout_s,
        )
        return cast(PtyOutput, json.loads(payload))

    async def pty_input(self, session_id: str, offset: int, data: bytes) -> PtyInputReply:
        _, _, payload = await self._request(
            "POST",
            f"/v1/pty/{session_id}/input",
            params={"offset": str(offset)},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return cast(PtyInputReply, json.loads(payload))

    async def pty_resize(self, session_id: str, rows: int, cols: int) -> PtySession:
        _, _, payload = await self._request(
            "POST", f"/v1/pty/{session_id}/resize", json_body={"rows": rows, "cols": cols}
        )
        return cast(PtySession, json.loads(payload))

    async def pty_signal(self, session_id: str, name: str) -> PtySession:
        _, _, payload = await self._request(
            "POST", f"/v1/pty/{session_id}/signal", json_body={"signal": name}
        )
        return cast(PtySession, json.loads(payload))

    async def pty_close(self, session_id: str) -> PtySession:
        _, _, payload = await self._request("DELETE", f"/v1/pty/{session_id}")
        return cast(PtySession, json.loads(payload))
