"""Structural mirror of NeMo Gym's sandbox types, for installs without nemo-gym.

nemo-gym requires Python >= 3.13.14, so most users of this package on older interpreters (and our
own CI) cannot import `nemo_gym.sandbox`. The provider must still work there, and it must behave
identically when Gym *is* importable; so this module mirrors the 0.7.0 shapes field for field:
`SandboxHandle` stays mutable (resume swaps `handle.raw`), `SandboxSpec` normalises `resources`
and `ports` in `__post_init__`, and `SandboxStatus.PAUSED` exists. `gym_substrate.nemo.types`
decides which set is used; nothing else should import from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "ExecResult",
    "SandboxCreateError",
    "SandboxCreateVerificationError",
    "SandboxEndpoint",
    "SandboxExecResult",
    "SandboxHandle",
    "SandboxPtyError",
    "SandboxPtySpec",
    "SandboxResources",
    "SandboxSpec",
    "SandboxStatus",
]


class SandboxStatus(str, Enum):  # noqa: UP042 - mirrors Gym exactly
    """Provider-neutral sandbox lifecycle status (mirror of nemo-gym 0.7.0)."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    ERROR = "error"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxEndpoint:
    """An absolute URL plus the headers a caller must send to reach a sandbox service."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        text = self.endpoint.strip() if isinstance(self.endpoint, str) else ""
        parts = urlsplit(text)
        if not text or not parts.scheme or not parts.netloc:
            raise ValueError("Sandbox endpoint must be a non-empty absolute URL")
        if not isinstance(self.headers, Mapping):
            raise TypeError("Sandbox endpoint headers must be a mapping")
        object.__setattr__(self, "endpoint", text)
        object.__setattr__(self, "headers", {str(k): str(v) for k, v in self.headers.items()})


def _opt(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


@dataclass(frozen=True)
class SandboxResources:
    """Requested sandbox resources (mirror of nemo-gym 0.7.0)."""

    cpu: float | None = None
    memory_mib: int | None = None
    disk_gib: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    @classmethod
    def from_mapping(cls, resources: Mapping[str, Any] | None) -> SandboxResources:
        if resources is None:
            return cls()
        allowed = set(cls.__dataclass_fields__)
        unknown = set(resources) - allowed
        if unknown:
            raise ValueError(
                f"Unknown sandbox resource keys: {', '.join(sorted(unknown))}. "
                f"Expected keys: {', '.join(sorted(allowed))}"
            )
        return cls(
            cpu=_opt(resources.get("cpu"), float),
            memory_mib=_opt(resources.get("memory_mib"), int),
            disk_gib=_opt(resources.get("disk_gib"), int),
            gpu=_opt(resources.get("gpu"), int),
            gpu_type=_opt(resources.get("gpu_type"), str),
        )


def _normalise_ports(ports: Any) -> tuple[int, ...]:
    if not isinstance(ports, (list, tuple)):
        raise TypeError("Sandbox ports must be a list or tuple of TCP port numbers")
    seen: list[int] = []
    for raw in ports:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise ValueError(f"Invalid sandbox TCP port: {raw!r}")
        try:
            port = int(raw)
        except ValueError as exc:
            raise ValueError(f"Invalid sandbox TCP port: {raw!r}") from exc
        if not 1 <= port <= 65535:
            raise ValueError(f"Sandbox TCP port must be between 1 and 65535, got {port}")
        if port in seen:
            raise ValueError(f"Duplicate sandbox TCP port: {port}")
        seen.append(port)
    return tuple(seen)


@dataclass(frozen=True)
class SandboxSpec:
    """Sandbox creation request (mirror of nemo-gym 0.7.0)."""

    image: str | None = None
    ttl_s: int | float | None = None
    ready_timeout_s: int | float | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    resources: SandboxResources | Mapping[str, Any] = field(default_factory=SandboxResources)
    entrypoint: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    ports: tuple[int, ...] | list[int] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.resources, SandboxResources):
            object.__setattr__(self, "resources", SandboxResources.from_mapping(self.resources))
        object.__setattr__(self, "ports", _normalise_ports(self.ports))


@dataclass
class SandboxHandle:
    """Handle to a created sandbox; `raw` is provider-owned and may be replaced in place."""

    sandbox_id: str
    provider_name: str
    raw: Any


@dataclass(frozen=True)
class SandboxExecResult:
    """Result of one command: the exit code, or sentinel 125 plus `error_type`."""

    stdout: str | None
    stderr: str | None
    return_code: int
    error_type: str | None = None


ExecResult = SandboxExecResult


class SandboxCreateError(RuntimeError):
    """Raised when a provider cannot create a sandbox."""


class SandboxCreateVerificationError(SandboxCreateError):
    """Raised when a newly-created sandbox fails provider readiness checks."""


@dataclass(frozen=True)
class SandboxPtySpec:
    """Interactive PTY session request (mirror of nemo-gym 0.7.0): no `command` is a shell."""

    command: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    rows: int = 24
    cols: int = 80
    user: str | int | None = None
    pty: bool = True


class SandboxPtyError(RuntimeError):
    """Raised when a PTY session fails outside normal process exit."""
