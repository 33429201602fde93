"""A workload that gets ready N seconds after it starts serving an actor, on either runtime.

`python late_agent.py --delay N --host H --port P`. GET /readyz answers 503 until N seconds
after the workload first saw its current actor id (/run/ate/actor-id, else the environment's
SANDBOX_AGENT_ACTOR_ID), then 200 JSON {"actor_id": ...}, as the sandbox agent's readyz does.

Why not `sleep N; exec agent`: under gVisor an actor restores from its template's golden
snapshot, taken once the workload was ready, so a slow boot is slow only once, at template
registration, and every resume is fast (as on a cluster, workflow_resume.go). Counting from the
actor id makes each start AND each restore slow. The template's golden actor (`ate-golden/<the
template's uid>`, so its id is a UUID) is ready at once, so the template's golden build stays
quick.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socketserver
import time
import uuid

_ID_FILE = "/run/ate/actor-id"
_ID_ENV = "SANDBOX_AGENT_ACTOR_ID"


def _actor_id() -> str:
    try:
        with open(_ID_FILE) as fh:
            value = fh.read().strip()
    except OSError:
        value = ""
    return value or os.environ.get(_ID_ENV, "")


def _golden(actor_id: str) -> bool:
    """A golden actor is named by its template's uid."""
    try:
        return str(uuid.UUID(actor_id)) == actor_id
    except ValueError:
        return False


class Server(http.server.ThreadingHTTPServer):
    delay_s = 0.0
    first_seen: dict[str, float] = {}  # noqa: RUF012 - one server per process

    def server_bind(self) -> None:
        # HTTPServer's own server_bind resolves the host name (a DNS query in a sandbox)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class Handler(http.server.BaseHTTPRequestHandler):
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"
    server: Server

    def do_GET(self) -> None:  # noqa: N802
        actor_id = _actor_id()
        first = self.server.first_seen.setdefault(actor_id, time.monotonic())
        ready = _golden(actor_id) or time.monotonic() - first >= self.server.delay_s
        status, body = (200, {"actor_id": actor_id}) if ready else (503, {"ready": False})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=80)
    args = parser.parse_args()
    if not 0 <= args.delay <= 600:
        parser.error("--delay must be 0..600 seconds")
    Server.delay_s = args.delay
    Server((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
