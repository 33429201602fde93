"""A scripted OpenAI-compatible policy: `/v1/models`, `/v1/responses`, `/v1/chat/completions`.

Standard library only, so it runs under any Python (the host's, or the chroot's). A script is a
JSON file `{"scripts": [{"match": TEXT, "turns": [TURN, ...]}, ...]}`; a request uses the first
script whose `match` occurs in its first user message, and answers with `turns[n]`, `n` being the
number of assistant turns already in the request's history (past the end: the last turn again).
A TURN is `{"text": "..."}` (an assistant message) and/or `{"bash": ["cmd", ...]}` (one tool call
`bash({"command": cmd})` per entry, chat completions only). A request that matches no script gets
HTTP 400 with the reason, so a wrong prompt fails loudly instead of looping.

A turn with `"wait_for": REGEX` is given only once the last non-empty line of the latest user
message matches (e.g. a shell prompt in Terminus' terminal view); until then the script's
`"wait"` turn is answered instead, at most `"max_waits"` times. Assistant turns containing the
script's `"wait_marker"` do not count as turns, so waiting does not advance the script.

    python policy.py SCRIPT.json [--port N] [--host H]

prints `{"port": N}` on its first stdout line once it listens. `GET /_log` returns every request
seen: endpoint, script, turn index, time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "scripted-policy"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text") or part.get("content") or "")
            for part in content
            if isinstance(part, dict)
        )
    return "" if content is None else str(content)


def _history(
    endpoint: str, body: dict[str, Any], wait_marker: str | None = None
) -> tuple[str, str, int, int]:
    """(first user message, last user message, assistant turns, wait turns) of a request."""
    if endpoint == "chat":
        items = body.get("messages") or []
    else:
        items = body.get("input") or []
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
    first_user = last_user = ""
    assistant_turns = waits = 0
    for item in items:
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        if role == "user":
            last_user = _text(item.get("content"))
            first_user = first_user or last_user
        elif role == "assistant":
            if wait_marker and wait_marker in _text(item.get("content")):
                waits += 1
            else:
                assistant_turns += 1
    return first_user, last_user, assistant_turns, waits


class Policy:
    def __init__(self, scripts: list[dict[str, Any]]) -> None:
        self.scripts = scripts
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def turn(self, endpoint: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        for script in self.scripts:
            first_user, last_user, n, waits = _history(endpoint, body, script.get("wait_marker"))
            if script["match"] not in first_user:
                continue
            turns = script["turns"]
            turn = turns[min(n, len(turns) - 1)]
            waiting = False
            if turn.get("wait_for") and waits < int(script.get("max_waits", 60)):
                lines = [line for line in last_user.splitlines() if line.strip()]
                waiting = not (lines and re.search(turn["wait_for"], lines[-1]))
            entry = {
                "endpoint": endpoint,
                "script": script["match"],
                "turn": n,
                "waits": waits,
                "wait": waiting,
                "t": time.time(),
            }
            with self.lock:
                self.log.append(entry)
            return (script["wait"] if waiting else turn), ""
        with self.lock:
            self.log.append({"endpoint": endpoint, "script": None, "t": time.time()})
        return None, f"no script matches the first user message: {body!r}"[:2000]


def _usage_responses() -> dict[str, Any]:
    return {
        "input_tokens": 10,
        "output_tokens": 10,
        "total_tokens": 20,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def responses_body(turn: dict[str, Any], seq: int) -> dict[str, Any]:
    return {
        "id": f"resp_{seq}",
        "object": "response",
        "created_at": int(time.time()),
        "model": MODEL,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": f"msg_{seq}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": turn.get("text", ""), "annotations": []}
                ],
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": _usage_responses(),
    }


def chat_body(turn: dict[str, Any], seq: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.get("text", "")}
    calls = [
        {
            "id": f"call_{seq}_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": cmd})},
        }
        for i, cmd in enumerate(turn.get("bash") or [])
    ]
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{seq}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


def make_handler(policy: Policy) -> type[BaseHTTPRequestHandler]:
    counter = iter(range(1, 1 << 30))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, obj: Any, code: int = 200) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0].rstrip("/")
            if path.endswith("/models"):
                self._send(
                    {
                        "object": "list",
                        "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "t"}],
                    }
                )
            elif path == "/_log":
                with policy.lock:
                    self._send(list(policy.log))
            elif path in ("/health", "/_health", ""):
                self._send({"ok": True})
            else:
                self._send({"error": f"no route {self.path}"}, 404)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError as exc:
                self._send({"error": {"message": f"bad JSON: {exc}"}}, 400)
                return
            path = self.path.split("?")[0].rstrip("/")
            if path.endswith("/chat/completions"):
                endpoint, render = "chat", chat_body
            elif path.endswith("/responses"):
                endpoint, render = "responses", responses_body
            else:
                self._send({"error": {"message": f"no route {self.path}"}}, 404)
                return
            turn, problem = policy.turn(endpoint, body)
            if turn is None:
                self._send({"error": {"message": problem, "type": "invalid_request_error"}}, 400)
                return
            self._send(render(turn, next(counter)))

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with open(args.script) as fh:
        scripts = json.load(fh)["scripts"]
    server = ThreadingHTTPServer((args.host, args.port), make_handler(Policy(scripts)))
    server.daemon_threads = True
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
