"""The agent's own HTTP/1.1 server: message framing and connection handling, over raw sockets."""

from __future__ import annotations

import json
import socket
from typing import Any


def _exchange(port: int, data: bytes, *, timeout: float = 10) -> bytes:
    """Send `data`, then read until the agent closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _answers(received: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every response in `received`, in order: (status, headers, body)."""
    answers = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
        length = int(headers.get("content-length", "0"))
        answers.append((int(status_line.split()[1]), headers, rest[:length]))
        received = rest[length:]
    return answers


def test_pipelined_requests_are_answered_in_order(agent: Any) -> None:
    data = (
        b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    received = _exchange(agent.port, data)
    # A HEAD answer has a Content-Length but no body: split it off by hand.
    last = received.rindex(b"HTTP/1.1 200 ")
    (ready, missing), head = _answers(received[:last]), received[last:]
    assert ready[0] == 200
    assert json.loads(ready[2])["status"] == "ok"
    assert missing[0] == 404
    assert json.loads(missing[2])["error"]["code"] == "not_found"
    assert head.endswith(b"\r\n\r\n")
    assert b"connection: close" in head.lower()


def test_chunked_body_and_expect_continue(agent: Any) -> None:
    body = b'{"command": "echo chunked"}'
    data = (
        b"POST /v1/exec?wait=5 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        b"5;ext=1\r\n" + body[:5] + b"\r\n%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n0\r\n\r\n"
    )
    received = _exchange(agent.port, data)
    assert received.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    ((status, _, answer),) = _answers(received[len(b"HTTP/1.1 100 Continue\r\n\r\n") :])
    assert status == 200
    assert json.loads(answer)["stdout"] == "chunked\n"


def test_broken_chunked_body_is_400_and_closes(agent: Any) -> None:
    data = b"POST /v1/exec HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    ((status, headers, answer),) = _answers(_exchange(agent.port, data))
    assert status == 400
    assert headers["connection"] == "close"
    assert json.loads(answer)["error"]["code"] == "bad_request"


def test_http_1_0_keep_alive_only_when_asked(agent: Any) -> None:
    ((status, headers, _),) = _answers(_exchange(agent.port, b"GET /readyz HTTP/1.0\r\n\r\n"))
    assert (status, headers["connection"]) == (200, "close")
    data = b"GET /readyz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /readyz HTTP/1.0\r\n\r\n"
    first, second = _answers(_exchange(agent.port, data))
    assert (first[0], first[1]["connection"]) == (200, "keep-alive")
    assert second[0] == 200


def test_unread_body_is_drained_and_the_connection_kept(agent: Any) -> None:
    """A 404 does not read the body; the next request on the connection still parses."""
    data = (
        b"PUT /v1/nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    missing, ready = _answers(_exchange(agent.port, data))
    assert missing[0] == 404
    assert ready[0] == 200


def test_framing_errors_are_json_400(agent: Any) -> None:
    for raw in (
        b"GET /readyz HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"POST /v1/exec HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        b"POST /v1/exec HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"GET /readyz HTTP/1.1\nHost: x\n\n",  # bare LF
        b"GET /readyz HTTP/2.0\r\nHost: x\r\n\r\n",
    ):
        ((status, headers, answer),) = _answers(_exchange(agent.port, raw))
        assert (status, headers["connection"]) == (400, "close"), raw
        assert json.loads(answer)["error"]["code"] == "bad_request"
