"""Where an experiment runs: a local backend started for the run, or a cluster from `--config`.

This is the only module of the package that knows how a local backend is started and looked
into (`local_or_config`, `Target.host_counts`, `Target.host_memory_bytes`, its `ActorRecord`s),
so a change to the local package's API is one edit here. Everything else sees provider keyword
arguments (the `substrate:` block of a Gym config) and the few host figures the probes report.

Capacity: a worker holds several actors, so what the experiments count in is the actor slot:
`workers x actors_per_worker` (`Target.slots`). A local backend gets exactly that pool; on a
cluster the user says what it has.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_substrate.core import procfs
from gym_substrate.lab.experiments._errors import ExperimentError

if TYPE_CHECKING:
    from gym_substrate.local.control.records import ActorRecord

__all__ = [
    "RUNTIMES",
    "Target",
    "local_or_config",
    "local_pause_tier",
    "local_warm_pool",
    "merged_kwargs",
    "wait_for_golden",
]

# `--pause-tier` of the experiment command that runs (cli._experiments.target_options sets it):
# the pause tier of the local backend `local_or_config` starts when not given one.
local_pause_tier: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "local_pause_tier", default=None
)
# ... and its `--warm-pool` (None: $GYM_SUBSTRATE_WARM_POOL, else LocalBackend's 0)
local_warm_pool: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "local_warm_pool", default=None
)

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
    where: str  # one line for the output: "local backend, gVisor, 2 workers x 1 actor"
    runtime: str | None  # "gvisor" | "process" on the local backend; None on a cluster
    runtime_reason: str
    workers: int | None  # workers (the local backend's; on a cluster as the user said)
    actors_per_worker: int = 1  # actors each worker holds at once
    _backend: Any = field(default=None, repr=False)

    @property
    def slots(self) -> int | None:
        """Actor slots: how many actors can hold a worker at once (what multiples count in)."""
        return None if self.workers is None else self.workers * self.actors_per_worker

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
            # what PauseActor did on the local gVisor backend (None elsewhere)
            "pause_tier": getattr(self._backend, "pause_tier", None)
            if self.runtime == "gvisor"
            else None,
            # sandboxes per template kept restored and frozen (the local gVisor backend's)
            "warm_pool": getattr(self._backend, "warm_pool", None)
            if self.runtime == "gvisor"
            else None,
            "workers": self.workers,
            "actors_per_worker": self.actors_per_worker,
            "slots": self.slots,
            "atespace": self.atespace,
        }

    # ------------------------------------------------------------------ local-only looks

    def _record(self, atespace: str, actor_id: str) -> ActorRecord | None:
        plane = getattr(self._backend, "plane", None)
        return None if plane is None else plane.lookup(atespace, actor_id)

    async def host_memory_bytes(self, atespace: str, actor_id: str) -> int | None:
        """PSS of the actor's sandbox processes on this host (None on a cluster or if none)."""
        record = self._record(atespace, actor_id)
        runtime = getattr(self._backend, "runtime", None)
        if record is None or runtime is None:
            return None
        for handle in (record.handle, record.retained_handle):
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
        seams of `_instrument` cannot reach: the backend's metrics call each operation
        listener once per finished operation (failed ones are not reported).
        """
        metrics = getattr(self._backend, "metrics", None)
        if metrics is None:
            yield None
            return
        log: list[tuple[str, float]] = []

        def listen(operation: str, seconds: float) -> None:
            log.append((operation, float(seconds)))

        metrics.operation_listeners.append(listen)
        try:
            yield log
        finally:
            metrics.operation_listeners.remove(listen)

    def snapshot_bytes(self, atespace: str, actor_id: str) -> int | None:
        """Bytes of the actor's latest snapshot on disk (local backend), else None.

        The latest generation with a completed storage is what a resume restores; its LOCAL
        folder (a pause's) is preferred over the DURABLE one (a suspend's upload of it).
        """
        record: ActorRecord | None = self._record(atespace, actor_id)
        latest = None if record is None else record.latest()
        stored = None if latest is None else latest.completed()
        if stored is None or not stored.path:
            return None
        return _tree_bytes(Path(stored.path))

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
    for pid in procfs.pids():
        started_here = any(state_dir in arg for arg in procfs.cmdline(pid))
        if started_here or (marker is not None and marker in procfs.environ(pid)):
            count += 1
    return count


def _count_prefixed(folder: Path, prefix: str) -> int:
    if not prefix or not folder.is_dir():
        return 0
    return sum(1 for name in os.listdir(folder) if name.startswith(prefix))


def _count_mounts(state_dir: str, instance: str) -> int:
    return sum(
        1 for point, _ in procfs.mounts() if state_dir in point or (instance and instance in point)
    )


def _count_snapshot_files(folder: Path) -> int:
    """Snapshot files but the golden ones (`.../atespaces/ate-golden/...`), which stay."""
    from gym_substrate.local.control.records import GOLDEN_ATESPACE

    if not folder.is_dir():
        return 0
    return sum(
        1 for path in folder.rglob("*") if path.is_file() and GOLDEN_ATESPACE not in path.parts
    )


def _load_config(config_path: str) -> dict[str, Any]:
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.config_file import load_substrate_block
    from gym_substrate.nemo.errors import ConfigError

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


async def wait_for_golden(kwargs: Mapping[str, Any], limit_s: float = 600.0) -> None:
    """Wait until the configured template's golden snapshot is built (a new local backend
    builds it in the background), so no arm's first creates pay for the build."""
    import asyncio

    from gym_substrate.nemo.config import ConnectionConfig, CreateConfig, coerce_section
    from gym_substrate.nemo.control_client import ControlClient, create_channel
    from gym_substrate.nemo.errors import SubstrateError

    conn = coerce_section(ConnectionConfig, kwargs.get("connection"), "connection")
    template = coerce_section(CreateConfig, kwargs.get("create"), "create").template
    channel = create_channel(conn)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    try:
        control = ControlClient(channel, conn)
        while True:
            try:
                found = await control.get_actor_template(template)
            except SubstrateError as exc:
                raise ExperimentError(f"template {template}: {exc}") from exc
            golden = found.status.golden_snapshot_status
            if golden.golden_tag.name:
                return
            if golden.error_message:
                raise ExperimentError(
                    f"template {template}: its golden snapshot failed: {golden.error_message}"
                )
            if loop.time() > deadline:
                raise ExperimentError(
                    f"template {template}: no golden snapshot after {limit_s:.0f} s"
                )
            await asyncio.sleep(0.1)
    finally:
        await channel.close(None)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


@contextlib.asynccontextmanager
async def local_or_config(
    config_path: str | None,
    runtime: str = "auto",
    workers: int = 2,
    actors_per_worker: int = 1,
    pause_tier: str | None = None,
) -> AsyncIterator[Target]:
    """A `Target` for the run: the cluster `config_path` describes, else a local backend.

    The local backend gets `workers` workers of `actors_per_worker` actors each and `runtime`
    (`auto` picks gVisor when runsc works here, else the process runtime; the reason is
    `Target.runtime_reason`), and `pause_tier` (else the command's `--pause-tier`, else
    $GYM_SUBSTRATE_PAUSE_TIER, else freeze), in a temporary state folder; it is ready when its
    default template's golden snapshot is, and it is stopped, with every sandbox it ran, when
    the block exits.
    """
    if workers < 1:
        raise ExperimentError(f"--workers must be >= 1, got {workers}")
    if actors_per_worker < 1:
        raise ExperimentError(f"--actors-per-worker must be >= 1, got {actors_per_worker}")
    if runtime not in RUNTIMES:
        raise ExperimentError(f"--runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    if config_path is not None:
        kwargs = _load_config(config_path)
        yield Target(
            kwargs,
            f"cluster from {config_path}",
            None,
            "--config was given",
            workers,
            actors_per_worker,
        )
        return
    import tempfile

    from gym_substrate.local.backend import LocalBackend
    from gym_substrate.local.errors import BackendError
    from gym_substrate.local.runtimes.base import RuntimeFailure

    async with contextlib.AsyncExitStack() as stack:
        state = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gym-substrate-x-")))
        try:
            backend = LocalBackend(
                state / "state",
                runtime=runtime,
                workers=workers,
                actors_per_worker=actors_per_worker,
                pause_tier=pause_tier or local_pause_tier.get(),
                warm_pool=local_warm_pool.get(),
            )
            await stack.enter_async_context(backend)
        except (BackendError, RuntimeFailure, ValueError) as exc:
            raise ExperimentError(f"cannot start the local backend: {exc}") from exc
        kwargs = backend.provider_config()
        kwargs["lifecycle"] = {"ledger": str(state / "ledger.jsonl")}  # private to the run
        await wait_for_golden(kwargs)
        name = backend.runtime_name
        label = {"gvisor": "gVisor", "process": "process runtime"}.get(name, name)
        if name == "gvisor":
            label += f" ({backend.pause_tier} pause tier, warm pool {backend.warm_pool})"
        yield Target(
            kwargs,
            f"local backend, {label}, {_plural(workers, 'worker')} x "
            f"{_plural(actors_per_worker, 'actor')}",
            name,
            backend.runtime_reason,
            workers,
            actors_per_worker,
            backend,
        )
