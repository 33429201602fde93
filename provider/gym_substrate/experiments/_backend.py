"""Where an experiment runs: a local backend started for the run, or a cluster from `--config`.

This is the only module of the package that knows how a local backend is started and looked
into (`local_or_config`, `Target.host_counts`, `Target.host_memory_bytes`), so a change to the
local package's API is one edit here. Everything else sees provider keyword arguments (the
`substrate:` block of a Gym config) and the few host figures the probes report.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate.experiments._errors import ExperimentError

__all__ = ["RUNTIMES", "Target", "local_or_config", "merged_kwargs"]

RUNTIMES = ("auto", "gvisor", "process")
# Set in the environment of every process-runtime sandbox (gym_substrate.local.runtimes.process).
_INSTANCE_ENV = b"GYM_SUBSTRATE_LOCAL_INSTANCE="


def merged_kwargs(base: Mapping[str, Any], **sections: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of provider kwargs `base` with each `section`'s keys set over it."""
    out = copy.deepcopy(dict(base))
    for name, changes in sections.items():
        current = dict(out.get(name) or {})
        current.update(changes)
        out[name] = current
    return out


@dataclass
class Target:
    """Provider kwargs plus what the run needs to say about where it ran."""

    provider_kwargs: dict[str, Any]
    where: str  # one line for the output: "local backend, gVisor, 2 workers"
    runtime: str | None  # "gvisor" | "process" on the local backend; None on a cluster
    runtime_reason: str
    workers: int | None  # worker slots (the local backend's; on a cluster as the user said)
    _backend: Any = field(default=None, repr=False)

    @property
    def local(self) -> bool:
        return self._backend is not None

    @property
    def atespace(self) -> str:
        connection = self.provider_kwargs.get("connection") or {}
        return str(connection.get("atespace") or "gym")

    def describe(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "runtime": self.runtime,
            "runtime_reason": self.runtime_reason,
            "workers": self.workers,
            "atespace": self.atespace,
        }

    # ------------------------------------------------------------------ local-only looks

    def _record(self, atespace: str, actor_id: str) -> Any:
        plane = getattr(self._backend, "plane", None)
        return None if plane is None else plane.lookup(atespace, actor_id)

    async def host_memory_bytes(self, atespace: str, actor_id: str) -> int | None:
        """PSS of the actor's sandbox processes on this host (None on a cluster or if none)."""
        record = self._record(atespace, actor_id)
        runtime = getattr(self._backend, "runtime", None)
        if record is None or runtime is None:
            return None
        for handle in (record.handle, getattr(record, "retained_handle", "")):
            if handle:
                used = await runtime.memory_bytes(handle)
                if used is not None:
                    return int(used)
        return 0

    @contextlib.contextmanager
    def operation_log(self) -> Iterator[list[tuple[str, float]] | None]:
        """Every pause, suspend and resume the local control plane finishes inside the block,
        as (operation, seconds); None on a cluster, whose control plane we cannot look into.

        For runs whose provider lives in another process (the Gym driver), where the timed
        seams of `_instrument` cannot reach: the local backend's own duration histogram is
        wrapped for the block, so each observation is also kept here.
        """
        metrics = getattr(self._backend, "metrics", None)
        if metrics is None:
            yield None
            return
        inner = metrics.operation_duration
        log: list[tuple[str, float]] = []

        class Child:
            def __init__(self, operation: str, child: Any) -> None:
                self.operation, self.child = operation, child

            def observe(self, seconds: float) -> None:
                log.append((self.operation, float(seconds)))
                self.child.observe(seconds)

        class Histogram:
            def labels(self, operation: str, *rest: str) -> Child:
                return Child(operation, inner.labels(operation, *rest))

        metrics.operation_duration = Histogram()
        try:
            yield log
        finally:
            metrics.operation_duration = inner

    def snapshot_bytes(self, atespace: str, actor_id: str) -> int | None:
        """Bytes of the actor's latest snapshot on disk (local backend), else None."""
        record = self._record(atespace, actor_id)
        if record is None or not record.snapshot_path:
            return None
        return _tree_bytes(Path(record.snapshot_path))

    def host_counts(self) -> dict[str, int] | None:
        """What this backend has on the host now: processes, netns, links, mounts, snapshots.

        Counted from the host (/proc, /run/netns, /sys/class/net, mountinfo, the snapshot
        folders), not from the backend's own records, so a leak the backend does not know
        about shows. None on a cluster.
        """
        if self._backend is None:
            return None
        state_dir = Path(self._backend.state_dir).resolve()
        instance = _instance(state_dir)
        return {
            "processes": _count_processes(str(state_dir).encode(), instance.encode()),
            "netns": _count_prefixed(Path("/run/netns"), instance),
            "links": _count_prefixed(Path("/sys/class/net"), instance),
            "mounts": _count_mounts(str(state_dir), instance),
            "snapshot_files": _count_snapshot_files(state_dir / "snapshots"),
        }


def _instance(state_dir: Path) -> str:
    try:
        return str(json.loads((state_dir / "backend.json").read_text()).get("instance") or "")
    except (OSError, ValueError):
        return ""


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for sub in path.rglob("*"):
        with contextlib.suppress(OSError):
            if sub.is_file():
                total += sub.stat().st_size
    return total


def _count_processes(state_dir: bytes, instance: bytes) -> int:
    marker = _INSTANCE_ENV + instance if instance else None
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                cmdline = fh.read()
            if state_dir in cmdline:
                count += 1
                continue
            if marker is not None:
                with open(f"/proc/{entry.name}/environ", "rb") as fh:
                    if marker in fh.read().split(b"\0"):
                        count += 1
        except OSError:
            continue
    return count


def _count_prefixed(folder: Path, prefix: str) -> int:
    if not prefix or not folder.is_dir():
        return 0
    return sum(1 for name in os.listdir(folder) if name.startswith(prefix))


def _count_mounts(state_dir: str, instance: str) -> int:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return 0
    count = 0
    for line in lines:
        fields = line.split()
        point = fields[4] if len(fields) > 4 else ""
        if state_dir in point or (instance and instance in point):
            count += 1
    return count


def _count_snapshot_files(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    return sum(1 for path in folder.rglob("*") if path.is_file() and "ate-golden-" not in str(path))


def _load_config(config_path: str) -> dict[str, Any]:
    from gym_substrate._errors import ConfigError
    from gym_substrate._yaml import load_substrate_block
    from gym_substrate.nemo import SubstrateProvider

    if not Path(config_path).is_file():
        raise ExperimentError(
            f"--config {config_path}: no such file; give a provider YAML with a "
            "`sandbox: substrate:` block (see configs/substrate.yaml)"
        )
    try:
        kwargs = load_substrate_block(config_path)
        SubstrateProvider(**kwargs)  # validates every section; opens no connection
    except ConfigError as exc:
        raise ExperimentError(f"--config {config_path}: {exc}") from exc
    return kwargs


@contextlib.asynccontextmanager
async def local_or_config(
    config_path: str | None, runtime: str = "auto", workers: int = 2
) -> AsyncIterator[Target]:
    """A `Target` for the run: the cluster `config_path` describes, else a local backend.

    The local backend gets `workers` slots and `runtime` (`auto` picks gVisor when runsc works
    here, else the process runtime; the reason is `Target.runtime_reason`); it is stopped, with
    every sandbox it ran, when the block exits.
    """
    if workers < 1:
        raise ExperimentError(f"--workers must be >= 1, got {workers}")
    if runtime not in RUNTIMES:
        raise ExperimentError(f"--runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    if config_path is not None:
        kwargs = _load_config(config_path)
        yield Target(kwargs, f"cluster from {config_path}", None, "--config was given", workers)
        return
    from gym_substrate.local.backend import local_provider_kwargs
    from gym_substrate.local.errors import BackendError
    from gym_substrate.local.runtimes.base import RuntimeFailure

    async with contextlib.AsyncExitStack() as stack:
        try:
            kwargs, backend = await stack.enter_async_context(
                local_provider_kwargs({}, runtime=runtime, workers=workers)
            )
        except (BackendError, RuntimeFailure, ValueError) as exc:
            raise ExperimentError(f"cannot start the local backend: {exc}") from exc
        name = backend.runtime_name
        label = {"gvisor": "gVisor", "process": "process runtime"}.get(name, name)
        yield Target(
            kwargs,
            f"local backend, {label}, {workers} worker{'s' if workers != 1 else ''}",
            name,
            backend.runtime_reason,
            workers,
            backend,
        )
