"""A minimal agent for runtime tests: state in process memory and in the root overlay.

GET /readyz -> 200. GET /state -> JSON with a request counter (memory), the boot nonce drawn
at process start (memory), the actor id read now from /run/ate/actor-id, the pid, and the
marker file's content. GET /write?text=... writes the marker file; GET /connect?host=&port=
tries a TCP connection (egress checks).
It skips reverse DNS (no getfqdn) and sets TCP_NODELAY, as gvisor-local.md requires.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import socket
import socketserver
import sys
from urllib.parse import parse_qs, urlparse

MARKER = "/var/lib/gs-test/marker"
BOOT_NONCE = secrets.token_hex(8)
COUNTER = 0


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


class Server(http.server.HTTPServer):
    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "sandbox", self.server_address[1]


class Handler(http.server.BaseHTTPRequestHandler):
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        global COUNTER
        url = urlparse(self.path)
        if url.path == "/readyz":
            body = {"status": "ok"}
        elif url.path == "/state":
            COUNTER += 1
            body = {
                "counter": COUNTER,
                "boot_nonce": BOOT_NONCE,
                "actor_id": _read("/run/ate/actor-id"),
                "pid": os.getpid(),
                "marker": _read(MARKER),
                "resolv": _read("/etc/resolv.conf"),
            }
        elif url.path == "/connect":
            query = parse_qs(url.query)
            try:
                socket.create_connection(
                    (query["host"][0], int(query["port"][0])), timeout=2
                ).close()
                body = {"connected": True, "error": None}
            except OSError as exc:
                body = {"connected": False, "error": str(exc)}
        elif url.path == "/write":
            text = parse_qs(url.query).get("text", [""])[0]
            os.makedirs(os.path.dirname(MARKER), exist_ok=True)
            with open(MARKER, "w") as fh:
                fh.write(text)
            body = {"written": text}
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--marker":
        os.makedirs(os.path.dirname(MARKER), exist_ok=True)
        with open(MARKER, "w") as fh:
            fh.write(f"boot-{BOOT_NONCE}")
    Server(("0.0.0.0", 80), Handler).serve_forever()
