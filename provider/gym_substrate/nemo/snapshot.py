"""Snapshots of a sandbox as values: what `snapshot()` returns and what a new sandbox starts from.

A snapshot is a Substrate tag: a named copy of a SUSPENDED actor's durable snapshot (its files,
and its processes and memory where the runtime keeps them: gVisor does, the local process
runtime keeps files only and says so in `fidelity`). The tag calls are in `_tags`; this module is
plain values (no grpc), so the Gymnasium env and callers can use them without a connection.

Also here: the optional-capability protocols a Gym adapter checks with `isinstance`, in the style
of Gym 0.7.0's `Supports...` protocols, and the capability answer NeMo Gym issue #3275 asks
providers to give (docs/provider.md compares the two).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from gym_substrate.core.names import is_dns_label, parse_ref
from gym_substrate.nemo.types import SandboxHandle

__all__ = [
    "CAPABILITIES",
    "SandboxSnapshot",
    "SnapshotCapabilities",
    "SnapshotScope",
    "SupportsSandboxFork",
    "SupportsSandboxSnapshot",
    "parse_snapshot",
    "snapshot_name",
]

SnapshotScope = Literal["atespace", "published"]


@dataclass(frozen=True)
class SandboxSnapshot:
    """A stable reference to a snapshot: `ref` (`atespace/tag`) is all a new sandbox needs.

    It is plain data (it pickles and compares by value), so it can be handed to other processes,
    e.g. Gymnasium vector-env workers; `str(snapshot)` is `ref`. `fidelity` says what it holds:
    `MEMORY` (files, processes and memory), `ROOTFS` (files only) or `UNKNOWN`. `workdir` and
    `env` are the source sandbox's defaults, which its children keep; None when not known here
    (a child then reads them from the sandbox itself, where they were recorded at creation).
    """

    ref: str
    source: str = ""  # the sandbox id it was taken from
    template: str = ""  # the ActorTemplate (`atespace/name`) it was taken under; "" if unknown
    created_at: float = 0.0  # Unix time
    fidelity: str = "UNKNOWN"
    scope: SnapshotScope = "atespace"
    ready: bool = True  # False while the server still copies it (or a create died half-way)
    workdir: str | None = field(default=None, compare=False)
    env: Mapping[str, str] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if parse_ref(self.ref) is None:
            raise ValueError(f"SandboxSnapshot.ref must be 'atespace/tag', got {self.ref!r}")

    def __str__(self) -> str:
        return self.ref

    @property
    def atespace(self) -> str:
        return self.ref.partition("/")[0]

    @property
    def name(self) -> str:
        return self.ref.partition("/")[2]

    @property
    def keeps_memory(self) -> bool:
        """True when a sandbox made from it gets the source's running processes and memory."""
        return self.fidelity == "MEMORY"


@dataclass(frozen=True)
class SnapshotCapabilities:
    """What this provider's snapshots do (#3275: "providers explicitly report snapshot, clone,
    reconnect-only, or unsupported capability", and what a snapshot captures and excludes)."""

    snapshot: bool
    clone: bool
    reconnect: bool
    captures: tuple[str, ...]
    excludes: tuple[str, ...]
    notes: str


CAPABILITIES = SnapshotCapabilities(
    snapshot=True,
    clone=True,
    reconnect=True,
    captures=(
        "files (the whole root filesystem)",
        "running processes and their memory, where the runtime keeps them (gVisor; each "
        "snapshot's fidelity says: MEMORY, or ROOTFS for files only)",
        "background services and PTY sessions (they are processes of the sandbox)",
        "the sandbox's workdir and env",
    ),
    excludes=(
        "commands in flight: snapshot() refuses while any call is running (SnapshotBusyError)",
        "open network connections to the outside (they break, as after any suspend)",
        "PTY session objects of the caller: sessions are detached as by pause()",
    ),
    notes=(
        "snapshot() suspends the source (a paused one is uploaded without waking) and the "
        "next call on it resumes it; a sandbox made from a snapshot borrows it until its "
        "first suspend, and delete_snapshot() refuses while any does"
    ),
)


@runtime_checkable
class SupportsSandboxSnapshot(Protocol):
    """Optional provider capability: durable snapshots of a sandbox, and sandboxes made from
    them (`SandboxSpec(provider_options={"from_snapshot": ref})`)."""

    def snapshot_capabilities(self) -> SnapshotCapabilities: ...

    async def snapshot(
        self, handle: SandboxHandle, *, name: str | None = None, scope: SnapshotScope = "atespace"
    ) -> SandboxSnapshot: ...

    async def delete_snapshot(
        self, snapshot: SandboxSnapshot | str, *, force: bool = False
    ) -> None: ...

    async def list_snapshots(self, *, atespace: str | None = None) -> list[SandboxSnapshot]: ...


@runtime_checkable
class SupportsSandboxFork(Protocol):
    """Optional provider capability: `n` new sandboxes from one sandbox's state right now."""

    async def fork(self, handle: SandboxHandle, n: int) -> list[SandboxHandle]: ...


def snapshot_name(name: object, sandbox_id: str) -> str:
    """`name` checked (a DNS label), or a fresh one that says which sandbox it came from."""
    if name is None:
        stem = sandbox_id[:50].rstrip("-") or "snap"
        return f"{stem}-{uuid.uuid4().hex[:8]}"
    if not is_dns_label(name):
        raise ValueError(
            f"snapshot name must be a DNS label (1-63 of a-z, 0-9 and '-', alphanumeric at both "
            f"ends), got {name!r}"
        )
    return str(name)


def parse_snapshot(value: object, where: str) -> tuple[str, str]:
    """`(atespace, tag)` of a `SandboxSnapshot` or an `atespace/tag` string, else `ValueError`."""
    text = value.ref if isinstance(value, SandboxSnapshot) else value
    ref = parse_ref(text)
    if ref is None:
        raise ValueError(
            f"{where} must be a SandboxSnapshot or 'atespace/tag' (two DNS labels), got {value!r}"
        )
    return ref
