"""Fixtures for the `gym` tests: the real NeMo Gym 0.7.0 in a chroot, against a local backend.

- `gym_chroot` (session): `.ci/gym-env build` (the cached Debian chroot with Python 3.13 and
  nemo-gym 0.7.0), `.ci/gym-env install-wheel <this checkout>` (our wheel --no-deps, plus the
  requirements Gym has no version of), and the Python packages Gym's sandboxed agents list in
  their requirements.txt (`harbor`, `mini-swe-agent`), installed into the chroot's /opt/gym once
  (idempotent: skipped when they are already there).
- `backend` (session): `gym-substrate local up --daemon --json` on the host with the gVisor
  runtime when runsc works here, else the process runtime (the reason is recorded and printed;
  GYM_SUBSTRATE_GYM_RUNTIME=gvisor|process forces one, without fallback);
  `gym-substrate local down` afterwards, which fails if anything is left behind, and a check that
  no process of the backend survives.
- `policy` (session): the scripted OpenAI-compatible server (`policy.py`) on 127.0.0.1.

The chroot shares the host's network, so the servers on the host's 127.0.0.1 are reachable from
inside it. Building the chroot needs root (debootstrap, chroot, mount): without root the tests
skip with that reason, except on CI (`CI=true`), where every problem with the chroot fails them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import policy_scripts
import pytest
from gym_helpers import (
    AGENT_PACKAGES,
    GYM_ENV,
    HERE,
    NOTES,
    ON_CI,
    REPO,
    TIMINGS,
    Backend,
    gym_env,
    gym_substrate_cli,
    run_argv,
)


def _chroot_problem() -> str | None:
    if not GYM_ENV.is_file():
        return f"{GYM_ENV} is missing"
    if os.geteuid() != 0:
        return "the NeMo Gym chroot (.ci/gym-env) needs root: debootstrap, chroot and mount"
    for tool in ("unshare", "chroot", "flock"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux / coreutils)"
    return None


def _fail_or_skip(reason: str) -> None:
    if ON_CI:
        pytest.fail(f"CI must provide the NeMo Gym chroot: {reason}", pytrace=False)
    pytest.skip(reason)


def _cache_root() -> Path:
    return Path(os.environ.get("GYM_SUBSTRATE_CACHE", "/var/cache/gym-substrate")) / "gym-chroot"


def _ensure_agent_packages(chroot: Path) -> str:
    """pip install harbor / mini-swe-agent (these versions) into /opt/gym unless they are there."""
    packages = AGENT_PACKAGES
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "want = dict((a.split('==') + [''])[:2] for a in sys.argv[1:])\n"
        "have = {}\n"
        "for n in want:\n"
        "    try: have[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: have[n] = None\n"
        "print(json.dumps([n + ('==' + v if v else '') for n, v in want.items()\n"
        "                  if have[n] is None or (v and have[n] != v)]))\n"
    )

    def missing() -> list[str]:
        proc = subprocess.run(
            run_argv(["python", "-c", probe, *packages]),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"probing the chroot's packages failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    if not missing():
        return "already installed"
    lock_path = _cache_root() / ".gym-tests-agent-packages.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        todo = missing()
        if not todo:
            return "installed by a concurrent run"
        pip_cache = _cache_root() / ".pip-cache"
        pip_cache.mkdir(parents=True, exist_ok=True)
        argv = ["pip", "install", "--quiet", "--progress-bar", "off", *todo]
        proc = subprocess.run(
            run_argv(argv, binds=[(pip_cache, "/root/.cache/pip")]),
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(
                f"pip install {' '.join(todo)} inside the chroot failed (Gym's terminus and "
                f"mini-swe-agent servers, and our provider, need them):\n{proc.stderr[-4000:]}",
                pytrace=False,
            )
    return "installed " + " ".join(todo)


def _wheel_stamp(chroot: Path) -> str:
    stamp = chroot / "opt" / "gym" / ".gym-substrate-wheel.sha256"
    return stamp.read_text().strip() if stamp.is_file() else ""


@pytest.fixture(scope="session")
def gym_chroot() -> Iterator[Path]:
    problem = _chroot_problem()
    if problem is not None:
        _fail_or_skip(problem)
    started = time.monotonic()
    proc = gym_env("build", timeout=3600)
    if proc.returncode != 0:
        pytest.fail(f".ci/gym-env build failed:\n{proc.stderr[-5000:]}", pytrace=False)
    chroot = Path(proc.stdout.strip().splitlines()[-1])
    TIMINGS["chroot build (.ci/gym-env build)"] = time.monotonic() - started
    started = time.monotonic()
    proc = gym_env("install-wheel", str(REPO), timeout=900)
    if proc.returncode != 0:
        pytest.fail(
            f".ci/gym-env install-wheel {REPO} failed:\n{proc.stderr[-5000:]}", pytrace=False
        )
    TIMINGS["install-wheel"] = time.monotonic() - started
    stamp = _wheel_stamp(chroot)
    started = time.monotonic()
    NOTES.append(f"agent packages ({', '.join(AGENT_PACKAGES)}): {_ensure_agent_packages(chroot)}")
    TIMINGS["agent packages"] = time.monotonic() - started
    yield chroot
    # The chroot is shared by every checkout on this machine: if another one installed its wheel
    # while we ran, what we tested is not (only) this checkout's code.
    after = _wheel_stamp(chroot)
    if after != stamp:
        pytest.fail(
            f"the wheel in {chroot}/opt/gym changed during the run ({stamp!r} -> {after!r}); "
            "another checkout ran .ci/gym-env install-wheel concurrently: rerun",
            pytrace=False,
        )


def _up(state_dir: Path, runtime: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *gym_substrate_cli(),
            "local",
            "up",
            "--daemon",
            "--json",
            "--runtime",
            runtime,
            "--state-dir",
            str(state_dir),
            "--api-port",
            "0",
            "--router-port",
            "0",
            "--admin-port",
            "0",
            "--workers",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _down(state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*gym_substrate_cli(), "local", "down", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in cmdline:
                found.append(f"{entry.name}: {cmdline.strip()[:200]}")
    return found


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an exited daemon waits for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _runsc_problem() -> str | None:
    if shutil.which("runsc") is None:
        return "runsc (gVisor) is not installed"
    if os.geteuid() != 0:
        return "runsc sandboxes need root"
    return None


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory, gym_chroot: Path) -> Iterator[Backend]:
    base = tmp_path_factory.mktemp("gym-backend")
    wanted = os.environ.get("GYM_SUBSTRATE_GYM_RUNTIME", "auto")
    if wanted not in ("auto", "gvisor", "process"):
        pytest.fail(f"GYM_SUBSTRATE_GYM_RUNTIME must be auto, gvisor or process, got {wanted!r}")
    attempts: list[tuple[str, str]] = []
    reason = _runsc_problem()
    if wanted == "process":
        attempts.append(("process", "GYM_SUBSTRATE_GYM_RUNTIME=process"))
    elif wanted == "gvisor" or reason is None:
        attempts.append(("gvisor", "runsc works here: gVisor sandboxes"))
    if wanted == "auto":
        if reason is not None:
            NOTES.append(f"backend: process runtime, because {reason}")
        attempts.append(("process", reason or ""))
    info: dict[str, Any] | None = None
    state_dir = base
    started = time.monotonic()
    for runtime, why in attempts:
        state_dir = base / runtime
        proc = _up(state_dir, runtime)
        if proc.returncode == 0:
            info = json.loads(proc.stdout[proc.stdout.index("{") :])
            if runtime == "process" and len(attempts) > 1:
                NOTES.append("backend: fell back to the process runtime (gVisor failed above)")
            else:
                NOTES.append(f"backend: {runtime} runtime ({why or info.get('runtime_reason')})")
            break
        NOTES.append(
            f"backend: `local up --runtime {runtime}` failed: "
            f"{(proc.stderr or proc.stdout).strip()[-1500:]}"
        )
        _down(state_dir)
    if info is None:
        pytest.fail("no local backend could be started:\n" + "\n".join(NOTES), pytrace=False)
    TIMINGS[f"backend up ({info['runtime']})"] = time.monotonic() - started
    started_backend = Backend(
        api=info["api"],
        router=info["router"],
        runtime=info["runtime"],
        runtime_reason=info.get("runtime_reason", ""),
        state_dir=state_dir,
        pid=int(info["pid"]),
    )
    yield started_backend
    started = time.monotonic()
    proc = _down(state_dir)
    TIMINGS["backend down"] = time.monotonic() - started
    assert proc.returncode == 0, f"local down failed:\n{proc.stdout}\n{proc.stderr}"
    deadline = time.monotonic() + 10
    while (left := _processes_mentioning(str(state_dir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "processes of the backend survived `local down`:\n" + "\n".join(left)
    deadline = time.monotonic() + 10
    while _running(started_backend.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(started_backend.pid), f"the backend (pid {started_backend.pid}) survived"


@pytest.fixture
def gvisor_backend(backend: Backend) -> Backend:
    """The backend, which must run gVisor: the episodes write to /, /app, /tests, /logs and
    /testbed of their sandbox, and run `apt-get update`; with the process runtime that would be
    the host itself."""
    if backend.runtime != "gvisor":
        pytest.fail(
            "this test needs the gVisor runtime, but the backend runs "
            f"{backend.runtime}: " + " | ".join(NOTES),
            pytrace=False,
        )
    return backend


@pytest.fixture(scope="session")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (`http://127.0.0.1:N/v1`) of the scripted policy (policy_scripts.SCRIPTS)."""
    folder = tmp_path_factory.mktemp("policy")
    script = folder / "scripts.json"
    script.write_text(policy_scripts.as_json())
    log = folder / "policy.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "policy.py"), str(script)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"the scripted policy did not start:\n{log.read_text()}")
        port = json.loads(line)["port"]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS and not NOTES:
        return
    terminalreporter.section("gym harness")
    for note in NOTES:
        terminalreporter.write_line(note)
    for name, seconds in TIMINGS.items():
        terminalreporter.write_line(f"{name}: {seconds:.1f} s")
