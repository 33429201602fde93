"""An actor that answers every request with what it received, for the router's header tests.

`python echo_agent.py --host H --port P`. Any GET/POST/PUT -> 200 JSON {"method", "path",
"headers": [[name, value], ...], "body_bytes"}, with its own `Server: echo-agent` header (which
the router must replace, as Envoy does). GET /readyz is the same answer, so readiness works.
"""

from __future__ import annotations

import argparse
import http.server
import json


class Handler(http.server.BaseHTTPRequestHandler):
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        received = len(self.rfile.read(length)) if length else 0
        body = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "headers": [[name, value] for name, value in self.headers.items()],
                "body_bytes": received,
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer  # noqa: N815

    def version_string(self) -> str:
        return "echo-agent"

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=80)
    args = parser.parse_args()
    http.server.ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
