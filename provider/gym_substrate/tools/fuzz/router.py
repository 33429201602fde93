"""Raw and malformed HTTP against the router, read at the socket.

An HTTP client library would refuse to send most of these, so each case is bytes on a fresh
connection. Cases mix requests the router must route (to an actor that exists, so its agent
answers) with broken request lines, headers and framing, and byte-level mutations of valid
requests. The first status line of the answer is classified; a 500, or a connection that gives
no answer within the read limit, is a finding. A connection the server closes without an answer
is counted as `closed` (what a server may do with bytes that are not HTTP).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from gym_substrate.tools.fuzz._tally import Tally

__all__ = ["READ_LIMIT_S", "fuzz_router"]

# Longer than any limit a request can legitimately wait for: the router's 10 s head and route
# limits, the agent's 60 s body limit behind it.
READ_LIMIT_S = 75.0

_METHODS = (b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH", b"get", b"BREW")
_PATHS = (
    b"/readyz",
    b"/v1/jobs",
    b"/v1/jobs/x",
    b"/v1/files?path=/tmp/fz",
    b"/v1/stat?path=/",
    b"/",
    b"*",
    b"/%00",
    b"/" + b"a" * 9000,
    b"/\xff\xfe",
    b"//..//..",
)


def _request(method: bytes, target: bytes, headers: Sequence[bytes], body: bytes = b"") -> bytes:
    lines = [method + b" " + target + b" HTTP/1.1", *headers]
    if body:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _cases(rng: random.Random, hosts: Sequence[str]) -> bytes:
    """One generated input."""
    host = rng.choice(hosts).encode()
    close = b"Connection: close"
    kind = rng.randrange(12)
    if kind <= 2:  # routed traffic
        body = rng.choice((b"", b"{}", b'{"command": "true"}', rng.randbytes(64)))
        return _request(rng.choice(_METHODS), rng.choice(_PATHS), [b"Host: " + host, close], body)
    if kind == 3:  # Hosts the router cannot route
        bad = rng.choice(
            (
                b"nope.fz.actors.resources.substrate.ate.dev",
                host.upper(),
                b"\xff\xfe.fz.actors.resources.substrate.ate.dev",
                b"",
                b"127.0.0.1",
                b"localhost",
                b"a" * 5000,
                host + b":99999",
                b"[::1",
            )
        )
        return _request(b"GET", b"/readyz", [b"Host: " + bad, close])
    if kind == 4:  # request lines
        return rng.choice(
            (
                b"GET /readyz HTTP/9.9\r\nHost: " + host + b"\r\n\r\n",
                b"GET /readyz\r\n\r\n",
                b"GET\r\n\r\n",
                b"\r\n\r\n",
                b"GET " + b"/a" * 40_000 + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n",
                b"GET http://" + host + b"/readyz HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n\r\n",
                b"CONNECT " + host + b":80 HTTP/1.1\r\nHost: " + host + b"\r\n\r\n",
                b"GET /readyz HTTP/1.0\r\n\r\n",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                b"G\x00T / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n",
            )
        )
    if kind == 5:  # headers
        return _request(
            b"GET",
            b"/readyz",
            rng.choice(
                (
                    [b"Host: " + host, b"X-Big: " + b"a" * 100_000],
                    [b"Host: " + host, *(b"X-%d: v" % i for i in range(500))],
                    [b"Host: " + host, b"Host: other"],
                    [b"Host: " + host, b"no-colon-here"],
                    [b"Host: " + host, b"X-Fold: a", b" folded"],
                    [b"Host: " + host, b"X-Nul: a\x00b"],
                    [b"Host: " + host, b"\xff\xfe: v"],
                    [b"Host : " + host],
                    [],
                ),
            ),
        )
    if kind == 6:  # body framing
        return rng.choice(
            (
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Length: abc\r\n\r\n" % host,
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Length: -1\r\n\r\n" % host,
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Length: 2\r\n"
                b"Content-Length: 3\r\n\r\nabc" % host,
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Length: 3\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % host,
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\nzz\r\nab\r\n0\r\n\r\n" % host,
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n2;ext=\xff\r\n{}\r\n0\r\n\r\n" % host,
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: gzip, chunked\r\n"
                b"Connection: close\r\n\r\n0\r\n\r\n" % host,
                b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Length: "
                b"99999999999999999999999\r\n\r\n" % host,
            )
        )
    if kind == 7:  # upgrades and pipelining
        return rng.choice(
            (
                _request(
                    b"GET",
                    b"/",
                    [
                        b"Host: " + host,
                        b"Connection: Upgrade",
                        b"Upgrade: websocket",
                        b"Sec-WebSocket-Version: 13",
                        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                    ],
                ),
                _request(b"GET", b"/", [b"Host: " + host, b"Upgrade: h2c", b"Connection: Upgrade"]),
                _request(b"GET", b"/readyz", [b"Host: " + host]) * 3,
            )
        )
    if kind == 8:  # bare LF line ends
        return b"GET /readyz HTTP/1.1\nHost: " + host + b"\nConnection: close\n\n"
    # byte mutations of a valid request's head (its blank line kept, so it stays complete)
    head = bytearray(b"GET /readyz HTTP/1.1\r\nHost: " + host + b"\r\nAccept: */*\r\n" + close)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        at = rng.randrange(len(head))
        if op == 0:
            head[at] = rng.randrange(256)
        elif op == 1:
            del head[at]
        else:
            head[at:at] = bytes([rng.randrange(256)])
    return bytes(head) + b"\r\n\r\n"


def _exchange(address: tuple[str, int], data: bytes) -> tuple[str, str]:
    """(answer class, first line or reason) for one connection."""
    try:
        with socket.create_connection(address, timeout=READ_LIMIT_S) as sock:
            try:
                sock.sendall(data)
            except OSError:
                pass  # the server may answer and close before reading everything
            received = b""
            while b"\r\n" not in received and len(received) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    except TimeoutError:
        return "timeout", f"no answer within {READ_LIMIT_S:g} s"
    except ConnectionResetError:
        return "closed", "reset"
    if not received:
        return "closed", "closed without an answer"
    line = received.split(b"\r\n", 1)[0]
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return "malformed", repr(line[:100])
    status = int(parts[1])
    return f"{status // 100}xx", line.decode("latin-1")


def fuzz_router(
    address: tuple[str, int],
    hosts: Sequence[str],
    *,
    requests: int,
    seed: int,
    concurrency: int = 16,
    progress: Callable[[int], None] | None = None,
) -> Tally:
    """Send `requests` generated connections to the router at `address`.

    `hosts` are Host values of actors that exist, so routed cases reach an agent.
    """
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if not hosts:
        raise ValueError("give at least one actor Host to route to")
    rng = random.Random(seed)
    cases = [_cases(rng, hosts) for _ in range(requests)]
    tally = Tally(server="router", seed=seed)

    def one(data: bytes) -> tuple[bytes, str, str]:
        answer, detail = _exchange(address, data)
        return data, answer, detail

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for data, answer, detail in pool.map(one, cases):
            finding = None
            if answer in ("timeout", "malformed") or detail.split(" ", 2)[1:2] == ["500"]:
                finding = detail
            tally.add(answer, case=repr(data[:300]), finding=finding)
            if progress is not None:
                progress(1)
    return tally
