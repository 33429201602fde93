"""The value a `SandboxHandle` carries, and its JSON descriptor for `connect()`.

`SubstrateActor` is what a caller may look at (`handle.raw`); the descriptor is what a caller may
store and hand to another process. Both are plain data: everything the provider does to the actor
is in `_managed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gym_substrate.core.names import target_actor
from gym_substrate.core.states import CRASHED, PARKED_STATES, RUNNING, STARTING_STATES
from gym_substrate.nemo.types import HAS_PAUSED_STATUS, SandboxStatus

__all__ = [
    "DELETED",
    "DESCRIPTOR_KEYS",
    "Descriptor",
    "SubstrateActor",
    "gym_status",
]

DELETED = "DELETED"  # `SubstrateActor.status` once `close()` deleted the actor
DESCRIPTOR_KEYS = frozenset({"sandbox_id", "atespace", "template", "workdir", "env", "ports"})


@dataclass(frozen=True)
class SubstrateActor:
    """`SandboxHandle.raw` for this provider: where the actor is and how to run commands in it.

    Replaced (never mutated) on resume, so a caller holding the old value sees a consistent one.
    """

    actor_id: str
    atespace: str
    template: str
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    status: str = "UNKNOWN"
    pod_ip: str = ""
    boot_id: str | None = None
    snapshot: str | None = None  # the snapshot (`atespace/tag`) it was created from, if any

    @property
    def target(self) -> str:
        """The router's `ate-target-actor` value for this actor (`atespace/name`)."""
        return target_actor(self.atespace, self.actor_id)


def gym_status(name: str) -> SandboxStatus:
    """Gym's status for an actor state name (`RUNNING`, `SUSPENDED`, ...).

    DELETING is STOPPED: `close()` (or someone else) ended the sandbox's life, no command will
    run in it again, and it is about to be gone, which is STOPPED too; nothing failed, so not
    ERROR. CRASHED is ERROR: the workload is gone until a revert. Parked states are PAUSED, or
    RUNNING on Gym versions without PAUSED (the next call resumes them, as it does a RUNNING one).
    """
    if name == RUNNING:
        return SandboxStatus.RUNNING
    if name in STARTING_STATES:
        return SandboxStatus.STARTING
    if name in PARKED_STATES:
        return SandboxStatus.PAUSED if HAS_PAUSED_STATUS else SandboxStatus.RUNNING
    if name == CRASHED:
        return SandboxStatus.ERROR
    if name == "DELETING":
        return SandboxStatus.STOPPED
    return SandboxStatus.UNKNOWN


@dataclass(frozen=True)
class Descriptor:
    """A checked `serialize_handle()` descriptor: which actor, and the sandbox's defaults."""

    sandbox_id: str
    atespace: str
    workdir: str | None
    env: dict[str, str]

    @classmethod
    def parse(cls, descriptor: Any, default_atespace: str) -> Descriptor:
        """`ValueError` naming the key for anything `serialize_handle()` would not write."""
        if not isinstance(descriptor, Mapping) or not isinstance(descriptor.get("sandbox_id"), str):
            raise ValueError("descriptor must be a mapping with a string 'sandbox_id'")
        unknown = sorted(set(descriptor) - DESCRIPTOR_KEYS)
        if unknown:
            raise ValueError(
                f"unknown descriptor key(s): {', '.join(unknown)}; "
                f"expected: {', '.join(sorted(DESCRIPTOR_KEYS))}"
            )
        workdir, env = descriptor.get("workdir"), descriptor.get("env") or {}
        if workdir is not None and not (isinstance(workdir, str) and workdir.startswith("/")):
            raise ValueError(
                f"descriptor 'workdir' must be an absolute path or null, got {workdir!r}"
            )
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"descriptor 'env' must map names to string values, got {env!r}")
        atespace = descriptor.get("atespace") or default_atespace
        if not isinstance(atespace, str):
            raise ValueError(f"descriptor 'atespace' must be a string, got {atespace!r}")
        return cls(descriptor["sandbox_id"], atespace, workdir, dict(env))

    @staticmethod
    def of(actor: SubstrateActor) -> dict[str, Any]:
        return {
            "sandbox_id": actor.actor_id,
            "atespace": actor.atespace,
            "template": actor.template,
            "workdir": actor.workdir,
            "env": dict(actor.env),
        }
