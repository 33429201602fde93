"""Running things inside the NeMo Gym chroot of `.ci/gym-env` from host-side tests.

The scripts under `tests/gym/inside/` run with the chroot's Python 3.13 and its NeMo Gym 0.7.0
(plus our wheel). Each one prints exactly one line `RESULT <json>` on stdout as its last act;
`run_inside` returns that object together with the exit code and the captured output, so a
failing assertion on the host can show what happened inside.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GYM_ENV = REPO / ".ci" / "gym-env"
INSIDE = Path(__file__).resolve().parent / "inside"
HERE = Path(__file__).resolve().parent
# Where tests/gym appears inside the chroot (bind mount).
T = "/t"
# Python packages Gym's sandboxed agents need beyond `nemo-gym` itself (their requirements.txt).
AGENT_PACKAGES = ("harbor==0.22.0", "mini-swe-agent==2.1.0")
# Our own dependencies that nemo-gym does not bring: `.ci/gym-env install-wheel` installs the
# wheel --no-deps (Gym's versions win). Unpinned: pip picks the release of the chroot's grpcio.
ON_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Printed at the end of the run (conftest.pytest_terminal_summary).
TIMINGS: dict[str, float] = {}
NOTES: list[str] = []


@dataclass
class Backend:
    """A local Agent Substrate backend started on the host for the gym tests."""

    api: str
    router: str
    runtime: str
    runtime_reason: str
    state_dir: Path
    pid: int

    def env(self) -> dict[str, str]:
        """The variables `configs/substrate.yaml` reads, pointing at this backend."""
        return {
            "SUBSTRATE_API": self.api,
            "SUBSTRATE_ROUTER": self.router,
            "SUBSTRATE_PLAINTEXT": "true",
            "SUBSTRATE_TEMPLATE": "local/sandbox",
            "SUBSTRATE_ATESPACE": "gym",
        }


@dataclass
class InsideResult:
    returncode: int
    result: dict[str, Any] | None
    stdout: str
    stderr: str
    seconds: float

    def explain(self, tail: int = 6000) -> str:
        return (
            f"exit code {self.returncode} after {self.seconds:.1f} s\n"
            f"--- stdout (tail) ---\n{self.stdout[-tail:]}\n"
            f"--- stderr (tail) ---\n{self.stderr[-tail:]}"
        )


def gym_env(
    *args: str, timeout: float, check: bool = False, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [str(GYM_ENV), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        env=full_env,
    )


def run_argv(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    binds: Sequence[tuple[Path | str, str]] = (),
    cwd: str | None = None,
) -> list[str]:
    """The `.ci/gym-env run ... -- argv` command line (tests/gym is always bound at /t)."""
    cmd = [str(GYM_ENV), "run", "-b", f"{HERE}:{T}"]
    for src, dst in binds:
        cmd += ["-b", f"{src}:{dst}"]
    for name, value in (env or {}).items():
        cmd += ["-e", f"{name}={value}"]
    if cwd:
        cmd += ["-w", cwd]
    return [*cmd, "--", *argv]


def run_inside(
    script: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    binds: Sequence[tuple[Path | str, str]] = (),
    timeout: float = 300,
) -> InsideResult:
    """Run `tests/gym/inside/<script>` with the chroot's Python; parse its `RESULT` line."""
    argv = run_argv(["python", f"{T}/inside/{script}", *args], env=env, binds=binds)
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        return InsideResult(-9, None, out, err, time.monotonic() - started)
    seconds = time.monotonic() - started
    result = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            break
    return InsideResult(proc.returncode, result, proc.stdout, proc.stderr, seconds)


def shell_join(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def gym_substrate_cli() -> list[str]:
    script = Path(sys.executable).with_name("gym-substrate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gym_substrate.cli"]


def backend_actors(backend: Backend) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [*gym_substrate_cli(), "local", "status", "--json", "--state-dir", str(backend.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return list(json.loads(proc.stdout)["actors"])


def _actor_key(actor: dict[str, Any]) -> str:
    """`atespace/name` of a `local status --json` actor row."""
    return f"{actor['atespace']}/{actor['actor']}"


@contextlib.contextmanager
def leak_guard(backend: Backend, grace_s: float = 30) -> Iterator[None]:
    """Fails if the block leaves an actor behind on the backend (after `grace_s` for stops that
    Gym runs on background threads)."""
    before = {_actor_key(a) for a in backend_actors(backend)}
    yield
    deadline = time.monotonic() + grace_s
    while True:
        left = [a for a in backend_actors(backend) if _actor_key(a) not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"actors left on the backend: {left}"


def policy_log(policy_url: str) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(policy_url.removesuffix("/v1") + "/_log", timeout=10) as resp:
        return list(json.load(resp))
