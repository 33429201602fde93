"""HTTP client for the sandbox agent (contract v1), reached through the Substrate router.

A client is a few strings over a shared aiohttp pool, so making one per call costs nothing. It is
the only code that sees aiohttp: every response is classified here into "the agent answered"
(JSON error object -> `AgentResponseError`) or "the router answered" (anything else non-2xx ->
`RouterError`, 503 -> `ActorUnavailableError`), and transport failures become
`AgentTransportError`. Retrying is the caller's job: only the caller knows whether a request is
idempotent (exec submissions carry a client id; file chunks carry an offset).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from gym_substrate._errors import (
    ActorMismatchError,
    ActorUnavailableError,
    AgentResponseError,
    RouterError,
    translate_http_errors,
)
from gym_substrate._names import actor_host

__all__ = ["AgentClient"]


@dataclass(frozen=True)
class AgentClient:
    session: aiohttp.ClientSession
    router: str
    actor_id: str
    atespace: str
    request_timeout_s: float = 20.0

    @property
    def host(self) -> str:
        return actor_host(self.actor_id, self.atespace)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Host": self.host, "X-Sandbox-Actor-Id": self.actor_id}
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
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s)
        body = data
        hdrs = self._headers(headers)
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs["Content-Type"] = "application/json"
        with translate_http_errors(what):
            async with self.session.request(
                method, self.router + path, params=params, data=body, headers=hdrs, timeout=timeout
            ) as resp:
                payload = await resp.read()
                status = resp.status
                resp_headers = {k.lower(): v for k, v in resp.headers.items()}
        if status < 300:
            return status, resp_headers, payload
        raise self._classify(what, status, resp_headers, payload)

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

    async def readyz(self, timeout_s: float = 5.0) -> dict[str, Any]:
        _, _, body = await self._request("GET", "/readyz", timeout_s=timeout_s)
        result: dict[str, Any] = json.loads(body)
        return result

    async def submit(self, job: dict[str, Any], wait_s: float) -> dict[str, Any]:
        _, _, body = await self._request(
            "POST",
            "/v1/exec",
            params={"wait": f"{wait_s:.3f}"},
            json_body=job,
            timeout_s=wait_s + self.request_timeout_s,
        )
        result: dict[str, Any] = json.loads(body)
        return result

    async def poll(self, job_id: str, wait_s: float) -> dict[str, Any]:
        _, _, body = await self._request(
            "GET",
            f"/v1/exec/{job_id}",
            params={"wait": f"{wait_s:.3f}"},
            timeout_s=wait_s + self.request_timeout_s,
        )
        result: dict[str, Any] = json.loads(body)
        return result

    async def kill(self, job_id: str) -> dict[str, Any]:
        _, _, body = await self._request("DELETE", f"/v1/exec/{job_id}")
        result: dict[str, Any] = json.loads(body)
        return result

    async def put_chunk(
        self, path: str, offset: int, data: bytes, *, final: bool, mode: int
    ) -> dict[str, Any]:
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
        result: dict[str, Any] = json.loads(body)
        return result

    async def stat(self, path: str) -> dict[str, Any]:
        _, _, body = await self._request("GET", "/v1/stat", params={"path": path})
        result: dict[str, Any] = json.loads(body)
        return result

    async def get_range(self, path: str, start: int, end: int) -> tuple[bytes, dict[str, str]]:
        """Bytes [start, end] inclusive of `path`."""
        _, headers, body = await self._request(
            "GET", "/v1/files", params={"path": path}, headers={"Range": f"bytes={start}-{end}"}
        )
        return body, headers
