"""Where `--driver gym` runs Gym, and the processes it starts there.

Gym 0.7.0 needs Python 3.13: `.ci/gym-env`'s chroot (`--gym-env chroot`) or a user's own
environment (`--gym-python`). Either is probed before anything starts, so a missing package is
one line naming it, not a failure minutes into a run. Every process a run starts carries
`MARKER` in its environment, so `stop_processes` finds them all (Ray's daemons included) on
success, failure and Ctrl-C. Split from `_gym` so that module holds the arm alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate.core import procfs
from gym_substrate.lab.experiments._errors import ExperimentError

__all__ = [
    "AGENT_PACKAGES",
    "CHECKOUT",
    "GYM_ENVS",
    "MARKER",
    "MIN_PYTHON",
    "GymEnv",
    "count_lines",
    "free_port",
    "gym_driver_error",
    "gym_env_path",
    "read_rows",
    "resolve_gym_env",
    "stop_processes",
]

GYM_ENVS = ("chroot",)
MIN_PYTHON = (3, 13)
# What Gym's Terminus agent needs beyond nemo-gym (its requirements.txt).
AGENT_PACKAGES = ("harbor",)
MARKER = "GYM_SUBSTRATE_GYM_ARM_RUN"
CHECKOUT = Path(__file__).resolve().parents[3]


def gym_env_path() -> Path | None:
    """The built NeMo Gym environment (`.ci/gym-env`'s chroot), or None if there is none."""
    root = Path(os.environ.get("GYM_SUBSTRATE_CACHE") or "/var/cache/gym-substrate")
    current = root / "gym-chroot" / "current"
    return current if (current / ".gym-env-complete").is_file() else None


def gym_driver_error() -> ExperimentError:
    """Why the chroot environment cannot be used here, naming the fix."""
    return ExperimentError(
        "--driver gym runs NeMo Gym 0.7.0 in its Python 3.13 environment, which is not built "
        "on this machine: build it from a gym-substrate checkout with `.ci/gym-env build` "
        "(as root; it prints the environment's path), give your own with --gym-python "
        "/path/to/python3.13 (a venv with nemo-gym 0.7.0, gym-substrate and harbor), or use "
        "--driver synthetic"
    )


# ---------------------------------------------------------------------------------- environment

_PROBE = """
import importlib.metadata as m, json, os, sys
out = {"python": list(sys.version_info[:3]), "prefix": sys.prefix, "packages": {}}
for name in ("nemo-gym", "gym-substrate", "harbor"):
    try:
        out["packages"][name] = m.version(name)
    except m.PackageNotFoundError:
        out["packages"][name] = None
try:
    import nemo_gym
    out["site"] = os.path.dirname(os.path.dirname(nemo_gym.__file__))
except Exception as exc:
    out["site"] = None
    out["nemo_gym_error"] = repr(exc)
out["substrate"] = any(
    e.name == "substrate" for e in m.entry_points(group="nemo_gym.sandbox_providers")
)
try:
    import gym_substrate.nemo
except ImportError as exc:
    out["substrate_error"] = f"{type(exc).__name__}: {exc}"
print("PROBE " + json.dumps(out))
"""


@dataclass(frozen=True)
class GymEnv:
    """Where Gym runs: `.ci/gym-env`'s chroot, or a Python the user gave."""

    mode: str  # "chroot" | "python"
    describe: str
    prefix: str  # the environment's sys.prefix, as Gym's processes see it
    site: str  # its site-packages (where Gym's server folders are), as they see it
    runner: Path | None = None  # .ci/gym-env (chroot mode)
    bin_dir: Path | None = None  # the python's bin folder (python mode)
    packages: dict[str, str | None] = field(default_factory=dict)

    @property
    def chroot(self) -> bool:
        return self.mode == "chroot"

    def argv(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        binds: Sequence[tuple[Path, str]],
        cwd: str,
    ) -> list[str]:
        """The host command line that runs `argv` (`python`, `gym`, ...) in the environment."""
        if self.runner is not None:
            cmd = [str(self.runner), "run"]
            for src, dst in binds:
                cmd += ["-b", f"{src}:{dst}"]
            for name, value in env.items():
                cmd += ["-e", f"{name}={value}"]
            return [*cmd, "-w", cwd, "--", *argv]
        assert self.bin_dir is not None
        head = argv[0]
        tool = self.bin_dir / head
        return [str(tool) if tool.exists() else head, *argv[1:]]

    def process_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The host-side environment of a process `argv` made."""
        out = {**os.environ, **env}
        if self.bin_dir is not None:
            out["PATH"] = f"{self.bin_dir}{os.pathsep}{out.get('PATH', '')}"
            out["VIRTUAL_ENV"] = self.prefix
        return out


def _parse_probe(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("PROBE "):
            data: dict[str, Any] = json.loads(line[len("PROBE ") :])
            return data
    return None


def _check_probe(probe: dict[str, Any], where: str, fix_wheel: str) -> None:
    version = tuple(probe.get("python") or ())
    if version < MIN_PYTHON:
        raise ExperimentError(
            f"{where}: Python {'.'.join(map(str, version))} is too old; NeMo Gym 0.7.0 needs "
            f"Python >= {'.'.join(map(str, MIN_PYTHON))}"
        )
    packages = probe.get("packages") or {}
    if not packages.get("nemo-gym") or not probe.get("site"):
        raise ExperimentError(
            f"{where}: NeMo Gym is not installed there "
            f"({probe.get('nemo_gym_error', 'no nemo-gym')}); install nemo-gym==0.7.0 into it"
        )
    if not packages.get("gym-substrate") or not probe.get("substrate"):
        raise ExperimentError(
            f"{where}: gym-substrate (the `substrate` sandbox provider) is not installed there; "
            f"{fix_wheel}"
        )
    if probe.get("substrate_error"):
        # e.g. a wheel installed --no-deps (as .ci/gym-env does) without a newer dependency
        raise ExperimentError(
            f"{where}: gym-substrate is installed there but does not import "
            f"({probe['substrate_error']}); pip install the missing package into it"
        )
    missing = [p for p in AGENT_PACKAGES if not packages.get(p)]
    if missing:
        raise ExperimentError(
            f"{where}: {', '.join(missing)} is missing, which Gym's terminus_2_sandboxed_agent "
            f"needs (its requirements.txt); pip install {' '.join(missing)} into it"
        )


def resolve_gym_env(gym_env: str = "chroot", gym_python: str | None = None) -> GymEnv:
    """The environment `--gym-env` / `--gym-python` name, checked: Python >= 3.13 with
    nemo-gym, gym-substrate and Harbor, else an `ExperimentError` saying what to install."""
    if gym_python is not None:
        path = Path(gym_python)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ExperimentError(
                f"--gym-python {gym_python}: no such executable; give the python3.13 of a "
                "venv with nemo-gym 0.7.0, gym-substrate and harbor"
            )
        try:
            proc = subprocess.run(
                [str(path), "-c", _PROBE], capture_output=True, text=True, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExperimentError(f"--gym-python {gym_python}: cannot run it: {exc}") from exc
        probe = _parse_probe(proc.stdout)
        if probe is None:
            raise ExperimentError(
                f"--gym-python {gym_python}: not a Python >= 3.13 that can run NeMo Gym "
                f"(it said: {(proc.stderr or proc.stdout).strip()[-300:] or 'nothing'})"
            )
        where = f"--gym-python {gym_python}"
        _check_probe(probe, where, "pip install gym-substrate into it")
        bin_dir = path.parent
        if not (bin_dir / "gym").exists():
            raise ExperimentError(f"{where}: Gym's `gym` command is not next to it in {bin_dir}")
        return GymEnv(
            "python",
            f"{where} (Python {'.'.join(map(str, probe['python']))}, "
            f"nemo-gym {probe['packages']['nemo-gym']})",
            str(probe["prefix"]),
            str(probe["site"]),
            bin_dir=bin_dir,
            packages=probe["packages"],
        )
    if gym_env not in GYM_ENVS:
        raise ExperimentError(f"--gym-env {gym_env!r}: use chroot, or give --gym-python")
    chroot = gym_env_path()
    if chroot is None:
        raise gym_driver_error()
    runner = CHECKOUT / ".ci" / "gym-env"
    if not runner.is_file():
        raise ExperimentError(
            f"--gym-env chroot runs commands in {chroot} through `.ci/gym-env run` of a "
            "gym-substrate checkout, and this installation has none: run from a checkout, or "
            "give --gym-python /path/to/python3.13"
        )
    if os.geteuid() != 0:
        raise ExperimentError("--gym-env chroot needs root (chroot and mount namespaces)")
    try:
        proc = subprocess.run(
            [str(runner), "run", "--", "python", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExperimentError(f"cannot run the Gym chroot {chroot}: {exc}") from exc
    probe = _parse_probe(proc.stdout)
    if probe is None:
        raise ExperimentError(
            f"the Gym chroot {chroot} did not run Python: {proc.stderr.strip()[-500:]}"
        )
    _check_probe(
        probe,
        f"the Gym chroot {chroot}",
        f"install this checkout's wheel with `.ci/gym-env install-wheel {CHECKOUT}`",
    )
    return GymEnv(
        "chroot",
        f"chroot {chroot.resolve()} (Python {'.'.join(map(str, probe['python']))}, "
        f"nemo-gym {probe['packages']['nemo-gym']})",
        str(probe["prefix"]),
        str(probe["site"]),
        runner=runner,
        packages=probe["packages"],
    )


# ---------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries `MARKER=marker`: everything the run started."""
    return sorted(procfs.marked(MARKER, marker))


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], marker: str) -> list[int]:
    """SIGTERM the run's process groups, then every marked process; SIGKILL what stays.

    Returns the PIDs still alive after SIGKILL (nothing, normally). Blocking on purpose: it
    runs in `finally` blocks, also while the event loop is being cancelled by Ctrl-C.
    """
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        pids = [p for p in _marked_pids(marker) if procfs.alive(p)]
        for proc in procs:
            if proc.poll() is None:
                pids.append(proc.pid)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while any(procfs.alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    return [p for p in _marked_pids(marker) if procfs.alive(p)]


def count_lines(paths: Sequence[Path]) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += sum(1 for line in path.read_bytes().splitlines() if line.strip())
    return total


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    rows.append(row)
    return rows
