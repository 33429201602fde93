"""Snapshots of a sandbox as values: what `snapshot()` returns and what a new sandbox starts from.

A snapshot is a Substrate tag: a named copy of a SUSPENDED actor's durable snapshot (its files,
and its processes and memory where the runtime keeps them: gVisor does, the local process
runtime keeps files only and says so in `fidelity`). The tag calls are in `_tags`; this module is
plain values (no grpc), so the Gymnasium env and callers can use them without a connection.

Also here: the optional-capability protocols Gym checks with `isinstance` (`SupportsSandboxSnapshot`
has the shape of Gym's own, after 0.7.0: `snapshot()` returns the id as a plain string), the
capability answer NeMo Gym issue #3275 asks providers to give (docs/provider.md compares them),
and how a caller's snapshot name becomes a tag name: Gym's session checkpointer names snapshots
after session ids, which need not be DNS labels.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

from gym_substrate.core.names import is_dns_label, parse_ref
from gym_substrate.nemo.types import SandboxHandle

__all__ = [
    "CAPABILITIES",
    "capabilities_for",
    "SandboxSnapshot",
    "SnapshotCapabilities",
    "SnapshotScope",
    "SupportsSandboxFork",
    "SupportsSandboxSnapshot",
    "parse_snapshot",
    "tag_name",
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
    `label` is the name the caller gave when it was not a DNS label itself (the tag's name was
    derived from it; "" otherwise or when not known here); `borrowers` the live sandboxes still
    running on its copy, filled in by `describe_snapshot()` only (None: not looked up).
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
    label: str = field(default="", compare=False)
    borrowers: tuple[str, ...] | None = field(default=None, compare=False)

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
    # A PAUSED sandbox (pause(), or parked by the idle policy) is not a checkpoint: the next call
    # resumes it and its state moves on. Only snapshot() commits a state a caller may restore.
    pause_is_checkpoint: bool = False
    paused_means: str = ""
    restore_option: str = "snapshot_id"  # the provider_options key create() restores from


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
    pause_is_checkpoint=False,
    paused_means=(
        "status() PAUSED means parked: by pause() or by the idle policy "
        "(lifecycle.idle_policy) whenever the sandbox was idle for idle_after_s; the next call "
        "resumes it and its state moves on, so a PAUSED sandbox is never a checkpoint. Take "
        "snapshot() for one and restore with provider_options['snapshot_id']"
    ),
)


# what a release era cannot say about a snapshot: its FULL scope reads as fidelity UNKNOWN
_RELEASE_MEMORY = (
    "running processes and their memory, where the runtime keeps them; a release-era server "
    "(v0.3, v0.4) does not say whether it did, so each snapshot's fidelity reads UNKNOWN and "
    "keeps_memory False: only a restore shows it"
)


def capabilities_for(era: str) -> SnapshotCapabilities:
    """`CAPABILITIES`, as far as a server of ``era`` lets the provider know (issue 30: where
    an era cannot do something, the capability answer says so); "" means not asked yet."""
    if era not in ("v0.3", "v0.4"):
        return CAPABILITIES
    captures = tuple(
        _RELEASE_MEMORY if c.startswith("running processes") else c for c in CAPABILITIES.captures
    )
    return replace(CAPABILITIES, captures=captures, notes=f"{CAPABILITIES.notes}; server era {era}")


@runtime_checkable
class SupportsSandboxSnapshot(Protocol):
    """Optional provider capability in the shape of Gym's own (after 0.7.0): `snapshot()` returns
    the id as a plain string, sandboxes are restored by `create()` with
    `provider_options["snapshot_id"]`, and deleting an id already gone is no error."""

    async def snapshot(self, handle: SandboxHandle, *, name: str | None = None) -> str: ...

    async def delete_snapshot(self, snapshot_id: str) -> None: ...


@runtime_checkable
class SupportsSandboxFork(Protocol):
    """Optional provider capability: `n` new sandboxes from one sandbox's state right now."""

    async def fork(self, handle: SandboxHandle, n: int) -> list[SandboxHandle]: ...


_NOT_IN_A_LABEL = re.compile(r"[^a-z0-9]+")


def tag_name(name: object, sandbox_id: str) -> str:
    """The tag a snapshot called `name` is stored as, or a fresh one naming its sandbox.

    A DNS label is used as it is. Anything else (Gym names snapshots after session ids, which
    may hold `_`, `:`, capitals, ...) becomes its readable part plus a digest of the whole name:
    the same name always gives the same tag, and two names that read alike do not collide.
    """
    if name is None:
        stem = sandbox_id[:50].rstrip("-") or "snap"
        return f"{stem}-{uuid.uuid4().hex[:8]}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"snapshot name must be a non-empty string, got {name!r}")
    if is_dns_label(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    readable = _NOT_IN_A_LABEL.sub("-", name.lower()).strip("-")[:52].rstrip("-")
    return f"{readable}-{digest}" if readable else f"s-{digest}"


def parse_snapshot(value: object, where: str) -> tuple[str, str]:
    """`(atespace, tag)` of a `SandboxSnapshot` or an `atespace/tag` string, else `ValueError`."""
    text = value.ref if isinstance(value, SandboxSnapshot) else value
    ref = parse_ref(text)
    if ref is None:
        raise ValueError(
            f"{where} must be a SandboxSnapshot or 'atespace/tag' (two DNS labels), got {value!r}"
        )
    return ref
