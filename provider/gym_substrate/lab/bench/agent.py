"""The sandbox agent on loopback (`gym-substrate bench agent`).

Every figure is measured in one run against a freshly started agent, next to a baseline taken in
the same run (the spawn floor, `subprocess.run(["true"])`), so the numbers stay comparable on a
busy or a different machine. Clients use plain `http.client` keep-alive connections from
threads: light enough that the agent, not the client, is what is measured. This lives outside
the agent's package, so the agent (and its static build) never carries benchmark code.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_substrate.core import procfs
from gym_substrate.lab.bench import BenchError

__all__ = ["TARGETS", "rows", "run_bench"]

MiB = 1024 * 1024
_EXEC_BODY = json.dumps({"command": ["true"]}).encode()
_JSON = {"Content-Type": "application/json"}

# (key, label, unit, target, higher_is_better, peer figures for context)
TARGETS: list[tuple[str, str, str, float | None, bool, str]] = [
    ("spawn_floor_p50_ms", "spawn floor p50 (subprocess.run true)", "ms", None, False, "0.71"),
    ("exec_p50_ms", "exec p50 (500 sequential, keep-alive)", "ms", 1.1, False, "Go 1.07, py 1.58"),
    ("exec_p90_ms", "exec p90", "ms", None, False, ""),
    ("exec_p99_ms", "exec p99", "ms", None, False, ""),
    ("exec_overhead_p50_ms", "exec p50 minus spawn floor", "ms", None, False, ""),
    ("exec_rps_8way", "exec req/s, 8 clients", "req/s", 1400, True, "Go 1477, py 825"),
    ("upload_mb_s", "upload 64 MiB", "MB/s", 600, True, "py 292"),
    ("download_mb_s", "download 64 MiB", "MB/s", 1000, True, "py 498"),
    ("startup_ms", "start to first 200 /readyz (median)", "ms", 200, False, ""),
    ("rss_idle_mib", "RSS, started and idle", "MiB", 40, False, ""),
    ("rss_mib", "RSS after the run (retained job records)", "MiB", None, False, ""),
    ("rss_peak_mib", "peak RSS (VmHWM, during uploads)", "MiB", None, False, ""),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _agent_argv(binary: str | None) -> list[str]:
    if binary:
        return [binary]
    installed = Path(sys.executable).with_name("sandbox-agent")
    if installed.exists():
        return [str(installed)]
    found = shutil.which("sandbox-agent")
    return [found] if found else [sys.executable, "-m", "sandbox_agent"]


@dataclass
class _Agent:
    proc: subprocess.Popen[bytes]
    port: int
    startup_ms: float


def _start(argv: list[str], log: Any, log_level: str) -> _Agent:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_AGENT_")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(port), "--log-level", log_level],
        stdout=log,
        stderr=log,
        env=env,
    )
    deadline = t0 + 30
    while time.perf_counter() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return _Agent(proc, port, (time.perf_counter() - t0) * 1000)
        except OSError:
            if proc.poll() is not None:
                msg = f"the agent exited with status {proc.returncode} during start-up"
                raise BenchError(msg) from None
            time.sleep(0.001)
    proc.kill()
    raise BenchError("the agent did not answer /readyz within 30 s")


def _stop(agent: _Agent) -> None:
    agent.proc.terminate()
    try:
        agent.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        agent.proc.wait()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spawn_floor(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _exec_once(conn: http.client.HTTPConnection) -> None:
    conn.request("POST", "/v1/exec?wait=8", body=_EXEC_BODY, headers=_JSON)
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise BenchError(f"exec failed: {resp.status} {body[:200]!r}")


def _exec_latency(port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(20):  # warm-up: connection, thread pool, caches
        _exec_once(conn)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        _exec_once(conn)
        out.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return out


def _throughput(port: int, clients: int, seconds: float) -> float:
    counts = [0] * clients
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            while not stop.is_set():
                _exec_once(conn)
                counts[i] += 1
        except BaseException as exc:  # reported after the run
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise BenchError(f"throughput run failed: {errors[0]}")
    return sum(counts) / elapsed


def _transfer(port: int, workdir: Path, size_mib: int, rounds: int) -> tuple[float, float]:
    data = os.urandom(size_mib * MiB)
    path = workdir / "bench.bin"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    up, down = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        conn.request("PUT", f"/v1/files?path={path}", body=data)
        resp = conn.getresponse()
        resp.read()
        up.append(len(data) / (time.perf_counter() - t0) / 1e6)
        if resp.status != 200:
            raise BenchError(f"upload failed: {resp.status}")
        t0 = time.perf_counter()
        conn.request("GET", f"/v1/files?path={path}")
        resp = conn.getresponse()
        got = 0
        while chunk := resp.read(4 * MiB):
            got += len(chunk)
        down.append(len(data) / (time.perf_counter() - t0) / 1e6)
        if got != len(data):
            raise BenchError(f"download returned {got} of {len(data)} bytes")
    conn.close()
    return statistics.median(up), statistics.median(down)


def _rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB, summed over the process and its descendants (the static build
    runs as launcher/staticx/PyInstaller layers, of which only the innermost is the agent)."""
    total_rss = total_hwm = 0.0
    for one in _process_tree(pid):
        try:
            rss, hwm = _rss_one(one)
        except (OSError, KeyError):
            continue
        total_rss += rss
        total_hwm += hwm
    return total_rss, total_hwm


def _process_tree(root: int) -> list[int]:
    """`root` and the processes below it that are not jobs (agent layers share its argv)."""
    argv = procfs.cmdline(root)[1:]
    return [root] + [
        pid for pid in sorted(procfs.descendants([root])) if procfs.cmdline(pid)[1:] == argv
    ]


def _rss_one(pid: int) -> tuple[float, float]:
    fields = procfs.status(pid)
    rss = int(fields["VmRSS"].split()[0]) / 1024
    hwm = int(fields["VmHWM"].split()[0]) / 1024
    return rss, hwm


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandbox-agent-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_bench(
    *,
    requests: int = 500,
    clients: int = 8,
    seconds: float = 10.0,
    file_mib: int = 64,
    starts: int = 5,
    binary: str | None = None,
    log_level: str = "info",
    progress: Any = None,
) -> dict[str, Any]:
    """Run every measurement and return the figures (see `TARGETS` for the keys)."""

    def step(text: str) -> None:
        if progress is not None:
            progress(text)

    argv = _agent_argv(binary)
    results: dict[str, Any] = {"agent_command": " ".join(argv), "log_level": log_level}
    with _workdir() as work, open(work / "agent.log", "wb") as log:
        step("start-up")
        startups = []
        for _ in range(starts):
            agent = _start(argv, log, log_level)
            startups.append(agent.startup_ms)
            _stop(agent)
        results["startup_ms"] = statistics.median(startups)
        results["startup_all_ms"] = [round(s, 1) for s in startups]

        step("spawn floor")
        floor = _spawn_floor(requests)
        results["spawn_floor_p50_ms"] = statistics.median(floor)

        agent = _start(argv, log, log_level)
        try:
            time.sleep(0.2)
            results["rss_idle_mib"] = _rss_mib(agent.proc.pid)[0]
            step(f"exec latency ({requests} sequential)")
            lat = _exec_latency(agent.port, requests)
            results["exec_p50_ms"] = statistics.median(lat)
            results["exec_p90_ms"] = _pct(lat, 0.90)
            results["exec_p99_ms"] = _pct(lat, 0.99)
            results["exec_overhead_p50_ms"] = results["exec_p50_ms"] - results["spawn_floor_p50_ms"]
            step(f"throughput ({clients} clients, {seconds:g} s)")
            results["exec_rps_8way"] = _throughput(agent.port, clients, seconds)
            step(f"transfer ({file_mib} MiB)")
            up, down = _transfer(agent.port, work, file_mib, rounds=3)
            results["upload_mb_s"], results["download_mb_s"] = up, down
            results["rss_mib"], results["rss_peak_mib"] = _rss_mib(agent.proc.pid)
        finally:
            _stop(agent)
    results["cpus"] = os.cpu_count()
    results["load_avg_1m"] = os.getloadavg()[0]
    return results


def _verdict(value: float, target: float | None, higher: bool) -> str:
    if target is None:
        return ""
    ok = value >= target if higher else value <= target
    return "ok" if ok else "MISSED"


def rows(results: dict[str, Any]) -> list[dict[str, str]]:
    """One table row per figure: value, target and whether it was met."""
    out = []
    for key, label, unit, target, higher, peers in TARGETS:
        value = float(results[key])
        shown = f"{value:,.0f} {unit}" if value >= 100 else f"{value:.2f} {unit}"
        tgt = "" if target is None else f"{'>=' if higher else '<='} {target:g} {unit}"
        out.append(
            {
                "figure": label,
                "value": shown,
                "target": tgt,
                "verdict": _verdict(value, target, higher),
                "peers": peers,
            }
        )
    return out
