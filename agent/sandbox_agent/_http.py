"""HTTP/1.1 messages for the agent's own server: parsing a request head, bodies, responses.

The agent serves a dozen JSON endpoints and one file download to one router, so it speaks just
the HTTP/1.1 it needs, on the standard library: a web framework was most of the agent's memory
in every sandbox. `_serving.py` runs the connections; this module has no I/O of its own.

Limits are the ones the agent always had: a request line or header line of at most 8190 bytes,
at most 128 headers. Header values are decoded as UTF-8 (undecodable bytes kept as surrogates),
so a handler sees what a raw client sent and refuses it with its own message.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO, Protocol

__all__ = [
    "MAX_HEADERS",
    "MAX_LINE",
    "Headers",
    "HTTPError",
    "Request",
    "Response",
    "json_response",
    "parse_head",
    "render_head",
    "unquote",
]

MAX_LINE = 8190
MAX_HEADERS = 128

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_PHRASES = {
    100: "Continue",
    200: "OK",
    202: "Accepted",
    206: "Partial Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    416: "Range Not Satisfiable",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("", "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class HTTPError(Exception):
    """A request the server refuses before (or instead of) a handler: status, message, headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def unquote(text: str, plus: bool = False) -> str:
    """Percent-decode `text` as UTF-8 (a bad sequence becomes U+FFFD); `plus` means form data."""
    if plus and "+" in text:
        text = text.replace("+", " ")
    if "%" not in text:
        return text
    raw = _PERCENT.sub(lambda m: bytes((int(m[1], 16),)), text.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "replace")


def parse_query(query: str) -> dict[str, str]:
    """The query string's parameters; a repeated name keeps its first value."""
    params: dict[str, str] = {}
    for part in query.split("&"):
        if part:
            name, _, value = part.partition("=")
            params.setdefault(unquote(name, plus=True), unquote(value, plus=True))
    return params


class Headers(dict[str, str]):
    """Request headers by lower-case name; `get` takes a name in any case."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


class Head:
    """A parsed request head: what `Request` is built from."""

    __slots__ = ("method", "target", "version", "headers")

    def __init__(self, method: str, target: str, version: int, headers: Headers) -> None:
        self.method = method
        self.target = target
        self.version = version  # the minor version: 0 or 1
        self.headers = headers


def _header(line: bytes, headers: Headers) -> None:
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(name):
        shown = name[:40].decode("utf-8", "replace")
        raise HTTPError(400, f"invalid header name {shown!r}")
    value = value.strip(b" \t")
    if _BAD_VALUE.search(value):
        raise HTTPError(400, f"invalid character in the value of header {name.decode()!r}")
    key = name.decode("ascii").lower()
    if key in headers:
        if key in ("content-length", "transfer-encoding"):
            raise HTTPError(400, f"duplicate {key} header")
        return  # as before: a repeated header's first value is the one handlers see
    headers[key] = value.decode("utf-8", "surrogateescape")


def parse_head(data: bytes) -> Head:
    """The request line and headers of `data` (the head without its final blank line)."""
    lines = data.split(b"\r\n")
    if len(lines) > MAX_HEADERS + 1:
        raise HTTPError(400, f"too many headers: at most {MAX_HEADERS}")
    parts = lines[0].split(b" ")
    if len(lines[0]) > MAX_LINE:
        raise HTTPError(400, f"request line too long: at most {MAX_LINE} bytes")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise HTTPError(400, f"invalid request line {lines[0][:60].decode('latin-1')!r}")
    method, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HTTPError(400, f"unsupported HTTP version {version[:20].decode('latin-1')!r}")
    if _BAD_VALUE.search(target) or b"\t" in target:
        raise HTTPError(400, "invalid character in the request target")
    headers = Headers()
    for line in lines[1:]:
        if len(line) > MAX_LINE:
            raise HTTPError(400, f"header line too long: at most {MAX_LINE} bytes")
        if line[:1] in (b" ", b"\t"):
            raise HTTPError(400, "folded header lines are not accepted")
        _header(line, headers)
    if version == b"HTTP/1.1" and "host" not in headers:
        raise HTTPError(400, "missing Host header (HTTP/1.1 requires one)")
    text = target.decode("utf-8", "surrogateescape")
    return Head(method.decode("ascii"), text, version[-1] - 48, headers)


class Source(Protocol):
    """Where a request body comes from: the connection's receive buffer."""

    buffer: bytearray

    async def more(self) -> None:
        """Wait for more bytes; ConnectionResetError when no more will come."""

    def send(self, data: bytes) -> None: ...


def _malformed_body(message: str) -> HTTPError:
    return HTTPError(400, f"malformed HTTP request: {message}")


class _Body:
    """A request body of a known length (Content-Length), or until the chunked encoding ends.

    After a framing error (`broken`) the connection cannot find the next request: it is closed.
    """

    __slots__ = ("_src", "remaining", "_chunked", "_trailer", "_continue", "broken")

    def __init__(self, src: Source, length: int | None, expect_continue: bool) -> None:
        self._src = src
        self._chunked = length is None
        self.remaining = 0 if length is None else length  # of the body or of the current chunk
        self._trailer = False
        self._continue = expect_continue and (self._chunked or length != 0)
        self.broken = False

    @property
    def done(self) -> bool:
        return not self._chunked and self.remaining == 0

    async def read(self) -> bytes:
        """The next piece of the body, b"" at its end."""
        if self._continue:
            self._continue = False
            self._src.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.broken:
            raise _malformed_body("the body's chunked encoding was broken")
        if self._chunked and self.remaining == 0:
            try:
                await self._next_chunk()
            except HTTPError:
                self.broken = True
                raise
        if self.remaining == 0:
            return b""
        buf = self._src.buffer
        while not buf:
            await self._src.more()
        if len(buf) <= self.remaining:
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(buf[: self.remaining])
            del buf[: self.remaining]
        self.remaining -= len(data)
        return data

    async def _line(self) -> bytes:
        buf = self._src.buffer
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > MAX_LINE:
                raise _malformed_body("chunk size line too long")
            await self._src.more()
        line = bytes(buf[:end])
        del buf[: end + 2]
        return line

    async def _next_chunk(self) -> None:
        """Read up to the next chunk's data (and past the end of the previous one)."""
        if self._trailer and await self._line():
            raise _malformed_body("chunk data longer than its size")
        size_text = (await self._line()).partition(b";")[0].strip(b" \t")
        if not size_text or len(size_text) > 16 or not _HEX.fullmatch(size_text):
            raise _malformed_body(f"invalid chunk size {size_text[:20].decode('latin-1')!r}")
        size = int(size_text, 16)
        self._trailer = True
        if size == 0:
            while await self._line():  # trailer fields, ignored
                pass
            self._chunked = False
            return
        self.remaining = size


class Request:
    """One request, as handlers see it."""

    __slots__ = (
        "method",
        "path",
        "query",
        "headers",
        "version",
        "remote",
        "match_info",
        "content_length",
        "head_sent",
        "_body",
        "_writer",
    )

    def __init__(
        self, head: Head, src: Source, writer: StreamWriter, remote: str | None = None
    ) -> None:
        self.method = head.method
        self.headers = head.headers
        self.version = head.version
        self.remote = remote
        self.match_info: dict[str, str] = {}
        self.head_sent = False
        self._writer = writer
        target = head.target
        if not target.startswith("/") and "://" in target:  # absolute-form
            target = "/" + target.partition("://")[2].partition("/")[2]
        self.path, _, query = target.partition("?")
        self.query = parse_query(query) if query else {}
        self.content_length, chunked = _framing(head)
        expect = self.headers.get("expect", "").lower() == "100-continue" and head.version == 1
        self._body = _Body(src, None if chunked else self.content_length or 0, expect)

    @property
    def body_done(self) -> bool:
        return self._body.done

    @property
    def body_broken(self) -> bool:
        return self._body.broken

    async def read_chunk(self) -> bytes:
        """The next piece of the body as it arrives; b"" at its end."""
        return await self._body.read()

    async def read(self, limit: int) -> bytes:
        """The whole body; `HTTPError(413)` past `limit` bytes."""
        if self.content_length is not None and self.content_length > limit:
            raise HTTPError(413, "request body too large")
        chunks = []
        size = 0
        while chunk := await self._body.read():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, "request body too large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def send_head(self, status: int, headers: dict[str, str], length: int) -> Response:
        """Send the status and headers now; the handler then sends `length` bytes itself."""
        resp = Response(status=status, headers=headers, content_type=None)
        await self._writer.send_head(self, resp, length)
        self.head_sent = True
        return resp

    async def sendfile(self, file: BinaryIO, offset: int, count: int) -> None:
        await self._writer.sendfile(file, offset, count)


def _framing(head: Head) -> tuple[int | None, bool]:
    """(Content-Length, chunked) of a request, or HTTPError for a body that cannot be framed."""
    length_text = head.headers.get("content-length")
    coding = head.headers.get("transfer-encoding")
    if coding is not None:
        if length_text is not None:
            raise HTTPError(400, "Content-Length and Transfer-Encoding together")
        if coding.lower() != "chunked" or head.version == 0:
            raise HTTPError(400, f"unsupported Transfer-Encoding {coding[:40]!r}")
        return None, True
    if length_text is None:
        return None, False
    if not length_text.isascii() or not length_text.isdigit() or len(length_text) > 19:
        raise HTTPError(400, f"invalid Content-Length {length_text[:40]!r}")
    return int(length_text), False


class StreamWriter(Protocol):
    """What a streaming handler writes through: its connection."""

    async def send_head(self, request: Request, resp: Response, length: int) -> None: ...

    async def sendfile(self, file: BinaryIO, offset: int, count: int) -> None: ...


class Response:
    """A complete response: status, headers and body (sent after the handler returns)."""

    __slots__ = ("status", "headers", "body", "close")

    def __init__(
        self,
        body: bytes = b"",
        status: int = 200,
        content_type: str | None = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = {} if content_type is None else {"Content-Type": content_type}
        if headers:
            self.headers.update(headers)
        self.close = False  # close the connection after this response


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data).encode(), status, "application/json; charset=utf-8")


_date_cache: list[Any] = [0, ""]


def _date() -> str:
    now = int(time.time())
    if _date_cache[0] != now:
        t = time.gmtime(now)
        _date_cache[:] = [
            now,
            f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT",
        ]
    return str(_date_cache[1])


def render_head(status: int, headers: dict[str, str], length: int, connection: str | None) -> bytes:
    """The status line and headers of a response with a `length`-byte body."""
    lines = [f"HTTP/1.1 {status} {_PHRASES.get(status, 'Status')}\r\n"]
    lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
    lines.append(f"Content-Length: {length}\r\nDate: {_date()}\r\nServer: sandbox-agent\r\n")
    if connection is not None:
        lines.append(f"Connection: {connection}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8")


Handler = Callable[[Request], Awaitable[Response]]
