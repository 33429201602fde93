"""Raw and malformed HTTP against the router, read at the socket.

An HTTP client library would refuse to send most of these, so each case is bytes on a fresh
connection. Cases mix requests the router must route (`ate-target-actor` naming an actor that
exists, so its agent answers) with routing values it cannot use, broken request lines, headers
and framing, upgrades, CONNECT tunnels, and byte-level mutations of valid requests. The first
status line of the answer is classified; a 500, or a connection that gives no answer within the
read limit, is a finding. A connection the server closes without an answer
is counted as `closed` (what a server may do with bytes that are not HTTP).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from gym_substrate.lab.tools.fuzz._tally import Tally
from gym_substrate.local.router.headers import TARGET_ACTOR_HEADER, parse_target_actor

__all__ = ["READ_LIMIT_S", "fuzz_router"]

# Longer than any limit a request to a healthy agent can legitimately wait for: the router's
# 10 s head deadline and 10 s ext_proc wait (parked budget + 5 s), the agent's 60 s body limit.
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


_HOSTS = (b"app.example", b"127.0.0.1", b"localhost", b"x.actors.resources.substrate.ate.dev")


def _cases(rng: random.Random, targets: Sequence[str]) -> bytes:
    """One generated input."""
    route = TARGET_ACTOR_HEADER.encode() + b": " + rng.choice(targets).encode()
    host = b"Host: " + rng.choice(_HOSTS)
    close = b"Connection: close"
    kind = rng.randrange(13)
    if kind <= 2:  # routed traffic
        body = rng.choice((b"", b"{}", b'{"command": "true"}', rng.randbytes(64)))
        return _request(rng.choice(_METHODS), rng.choice(_PATHS), [host, route, close], body)
    if kind == 3:  # routing values the router cannot use
        bad = rng.choice(
            (
                b"fz/nope",
                route.split(b": ", 1)[1].upper(),
                b"fz",
                b"fz/r0/x",
                b"/r0",
                b"",
                b"\xff\xfe/\xfa",
                b"fz/" + b"a" * 5000,
                b"fz/r0, fz/r1",
            )
        )
        headers = [host, TARGET_ACTOR_HEADER.encode() + b": " + bad, close]
        if rng.random() < 0.2:
            headers = [host, route, route, close]  # a second copy
        elif rng.random() < 0.2:
            headers = [host, close]  # none at all
        return _request(b"GET", b"/readyz", headers)
    if kind == 4:  # request lines
        return rng.choice(
            (
                b"GET /readyz HTTP/9.9\r\n" + host + b"\r\n" + route + b"\r\n\r\n",
                b"GET /readyz\r\n\r\n",
                b"GET\r\n\r\n",
                b"\r\n\r\n",
                b"GET " + b"/a" * 40_000 + b" HTTP/1.1\r\n" + host + b"\r\n\r\n",
                b"GET http://app.example/readyz HTTP/1.1\r\nHost: x\r\n"
                + route
                + b"\r\n"
                + close
                + b"\r\n\r\n",
                b"GET /readyz HTTP/1.0\r\n" + route + b"\r\n\r\n",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                b"G\x00T / HTTP/1.1\r\n" + host + b"\r\n\r\n",
            )
        )
    if kind == 5:  # headers
        return _request(
            b"GET",
            b"/readyz",
            rng.choice(
                (
                    [host, route, b"X-Big: " + b"a" * 100_000],
                    [host, route, *(b"X-%d: v" % i for i in range(500))],
                    [host, b"Host: other", route],
                    [host, route, b"no-colon-here"],
                    [host, route, b"X-Fold: a", b" folded"],
                    [host, route, b"X-Nul: a\x00b"],
                    [host, route, b"\xff\xfe: v"],
                    [host, route, b"X-Ate-Target-Port: 22", b"X-Forwarded-For: 6.6.6.6"],
                    [b"Host : x", route],
                    [],
                ),
            ),
        )
    if kind == 6:  # body framing
        post = b"POST /v1/jobs HTTP/1.1\r\n" + host + b"\r\n" + route + b"\r\n"
        return post + rng.choice(
            (
                b"Content-Length: abc\r\n\r\n",
                b"Content-Length: -1\r\n\r\n",
                b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
                b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2;ext=\xff\r\n{}\r\n"
                b"0\r\n\r\n",
                b"Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
                b"Content-Length: 99999999999999999999999\r\n\r\n",
            )
        )
    if kind == 7:  # upgrades and pipelining
        upgrade = [host, route, b"Connection: Upgrade"]
        return rng.choice(
            (
                _request(
                    b"GET",
                    b"/",
                    [
                        *upgrade,
                        b"Upgrade: websocket",
                        b"Sec-WebSocket-Version: 13",
                        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                    ],
                ),
                _request(b"GET", b"/", [*upgrade, b"Upgrade: h2c"]),
                _request(b"GET", b"/", [*upgrade, b"Upgrade: tcp"]),
                _request(b"GET", b"/readyz", [host, route]) * 3,
            )
        )
    if kind == 8:  # CONNECT tunnels, with HTTP (or not) inside
        authority = rng.choice((b"fz:80", b"fz:1", b"fz:65535", b"fz", b"fz:99999", b"[::1]:80"))
        outer = b"CONNECT " + authority + b" HTTP/1.1\r\nHost: " + authority + b"\r\n"
        if rng.random() < 0.8:
            outer += route + b"\r\n"
        inner = rng.choice(
            (
                b"GET /readyz HTTP/1.1\r\nHost: in\r\n" + close + b"\r\n\r\n",
                b"CONNECT fz:80 HTTP/1.1\r\nHost: fz:80\r\n\r\n",
                b"\x16\x03\x01\x00\xa5\x01\x00",
                b"",
            )
        )
        return outer + b"\r\n" + inner
    if kind == 9:  # bare LF line ends
        return b"GET /readyz HTTP/1.1\n" + host + b"\n" + route + b"\n" + close + b"\n\n"
    # byte mutations of a valid request's head (its blank line kept, so it stays complete)
    head = bytearray(b"GET /readyz HTTP/1.1\r\n" + host + b"\r\n" + route + b"\r\n" + close)
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
    targets: Sequence[str],
    *,
    requests: int,
    seed: int,
    concurrency: int = 16,
    progress: Callable[[int], None] | None = None,
) -> Tally:
    """Send `requests` generated connections to the router at `address`.

    `targets` are `atespace/name` references of actors that exist (the `ate-target-actor`
    values), so routed cases reach an agent.
    """
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if not targets:
        raise ValueError("give at least one actor reference (atespace/name) to route to")
    for ref in targets:
        if parse_target_actor(ref) is None:
            raise ValueError(f"{ref!r} is not an actor reference: want <atespace>/<name>")
    rng = random.Random(seed)
    cases = [_cases(rng, targets) for _ in range(requests)]
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
