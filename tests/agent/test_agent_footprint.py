"""The agent's memory in every sandbox depends on what it loads: no web framework, no TLS.

The agent runs on the standard library (its own HTTP server on asyncio). aiohttp alone was most
of a sandbox's memory, and asyncio would map OpenSSL's TLS library if ssl were importable.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# Top-level modules the agent must not load: aiohttp and its C-extension dependencies, and TLS.
_FORBIDDEN = ("aiohttp", "multidict", "yarl", "propcache", "frozenlist", "ssl", "_ssl")

# Runs the agent's real entry point in-process; a thread drives one readyz and one exec over a
# raw socket (nothing the agent would not import itself), then reports sys.modules and stops it.
_PROBE = """
import os, signal, socket, sys, threading, time
from sandbox_agent.__main__ import main

PORT = int(sys.argv[1])

def exchange(data):
    with socket.create_connection(("127.0.0.1", PORT), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received

def probe():
    for _ in range(500):
        try:
            ready = exchange(
                b"GET /readyz HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n"
            )
            break
        except OSError:
            time.sleep(0.02)
    body = b'{"command": "echo hi"}'
    job = exchange(
        b"POST /v1/exec?wait=5 HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n"
        b"Content-Length: %d\\r\\n\\r\\n%s" % (len(body), body)
    )
    print("READY", ready.split(b"\\r\\n")[0].decode(), flush=True)
    print("JOB", b'"stdout": "hi\\\\n"' in job or b'"stdout":"hi\\\\n"' in job, flush=True)
    print("MODULES", " ".join(sorted(sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=probe, daemon=True).start()
main(["--host", "127.0.0.1", "--port", str(PORT), "--actor-id-file", sys.argv[2]])
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _forbidden(names: list[str]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in _FORBIDDEN)


def test_the_serving_agent_imports_no_aiohttp_and_no_ssl(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(_free_port()), str(tmp_path / "actor-id")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = dict(line.partition(" ")[::2] for line in proc.stdout.splitlines())
    assert lines.get("READY") == "HTTP/1.1 200 OK", (proc.stdout, proc.stderr[-2000:])
    assert lines.get("JOB") == "True", proc.stderr[-2000:]
    modules = lines["MODULES"].split()
    assert "sandbox_agent._serving" in modules
    assert not _forbidden(modules), f"the agent imported {_forbidden(modules)}"
    assert "sandbox_agent._pty" not in modules, "PTY modules load on the first PTY request"


def test_the_running_agent_maps_no_aiohttp_or_tls_library(agent: Any) -> None:
    """The agent process as the tests run it: none of the extension modules is mapped."""
    assert agent.request("GET", "/readyz").status == 200
    assert agent.exec(command="echo hi").json()["stdout"] == "hi\n"
    maps = Path(f"/proc/{agent.proc.pid}/maps").read_text()
    mapped = {os.path.basename(line.split()[-1]) for line in maps.splitlines() if "/" in line}
    bad = sorted(
        name
        for name in mapped
        if name.startswith(("_ssl", "libssl")) or any(m in name for m in _FORBIDDEN[:5])
    )
    assert not bad, f"the agent maps {bad}"
