"""The HTTP handlers of /v1/pty: parsed query parameters and bodies in, a session's JSON out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ._config import AgentConfig
from ._errors import ApiError, body_timeout_error
from ._http import Request, Response, json_response
from ._pty import PtyManager, PtySession
from ._requests import parse_pty_request, parse_resize, parse_signal
from ._wire import reply
from .contract import MAX_PTY_INPUT_BYTES, PtyInputReply

__all__ = ["PtyHandlers"]

log = logging.getLogger("sandbox_agent.pty")


class PtyHandlers:
    """The /v1/pty handlers over one `PtyManager`."""

    def __init__(
        self,
        manager: PtyManager,
        config: AgentConfig,
        read_json: Callable[[Request], Awaitable[Any]],
    ) -> None:
        self._pty = manager
        self._config = config
        self._read_json = read_json

    def _session(self, request: Request) -> PtySession:
        return self._pty.get(request.match_info["session_id"])

    @staticmethod
    def _answer(session: PtySession) -> Response:
        return json_response(session.to_json())

    async def create(self, request: Request, query: dict[str, Any]) -> Response:
        session_id, spec = parse_pty_request(await self._read_json(request))
        log.debug("pty %s: %r", session_id, spec.command)
        return self._answer(await self._pty.create(session_id, spec))

    async def get(self, request: Request, query: dict[str, Any]) -> Response:
        session = self._session(request)
        await self._pty.wait(session, query["wait"])
        return self._answer(session)

    async def delete(self, request: Request, query: dict[str, Any]) -> Response:
        session = self._session(request)
        await self._pty.close(session)
        return self._answer(session)

    async def output(self, request: Request, query: dict[str, Any]) -> Response:
        session = self._session(request)
        read = self._pty.read(
            session, query["stream"], query["offset"], query["wait"], query["max_bytes"]
        )
        return json_response(await read)

    async def input(self, request: Request, query: dict[str, Any]) -> Response:
        offset = query["offset"]
        session = self._session(request)
        length = request.content_length
        too_large = ApiError(
            413,
            "too_large",
            f"an input chunk is at most {MAX_PTY_INPUT_BYTES} bytes; send more in several "
            "requests, each with the offset= of its first byte",
        )
        if length is not None and length > MAX_PTY_INPUT_BYTES:
            raise too_large
        chunks: list[bytes] = []
        received = 0
        try:
            async with asyncio.timeout(self._config.body_timeout_s):
                while chunk := await request.read_chunk():
                    received += len(chunk)
                    if received > MAX_PTY_INPUT_BYTES:
                        raise too_large
                    chunks.append(chunk)
        except TimeoutError:
            raise body_timeout_error(self._config.body_timeout_s) from None
        session.write_input(offset, b"".join(chunks), MAX_PTY_INPUT_BYTES)
        return json_response(
            reply(
                PtyInputReply,
                {
                    "id": session.id,
                    "input_offset": session.input_offset,
                    "input_pending": len(session.pending),
                },
            )
        )

    async def resize(self, request: Request, query: dict[str, Any]) -> Response:
        rows, cols = parse_resize(await self._read_json(request))
        session = self._session(request)
        self._pty.resize(session, rows, cols)
        return self._answer(session)

    async def signal(self, request: Request, query: dict[str, Any]) -> Response:
        name = parse_signal(await self._read_json(request))
        session = self._session(request)
        self._pty.signal(session, name)
        return self._answer(session)
