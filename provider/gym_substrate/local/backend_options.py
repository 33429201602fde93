"""`LocalBackend`'s options, checked before anything starts: `check_options` returns them whole.

Every option a caller (the CLI, a test, a trainer) can pass, and the environment variables that
stand in for an embedded backend's missing ones, are validated here in one place, each refusal
naming the option, the value and what works; `backend.py` then only wires the parts together.
The options themselves (names, defaults, checks, flags) are the rows of `option_table.OPTIONS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gym_substrate.ateapi.eras import CURRENT
from gym_substrate.local.option_table import (
    API_ERA_ENV,
    DEFAULT_ROOTFS_CHOICES,
    OPTIONS,
    WARM_POOL_ENV,
)

__all__ = [
    "API_ERA_ENV",
    "DEFAULT_ROOTFS_CHOICES",
    "MAX_ACTORS",
    "WARM_POOL_ENV",
    "BackendOptions",
    "check_options",
    "default_actors_per_worker",
    "keywords",
]

# an actor's sandbox (gVisor, the default Debian image, the agent): PSS measured 100-131 MiB
_ACTOR_MEMORY = 256 * 1024 * 1024
MAX_ACTORS = 64


@dataclass(frozen=True)
class BackendOptions:
    """A backend's options after the checks, defaults filled in (see `LocalBackend`)."""

    runtime: str
    workers: int
    actors_per_worker: int
    api_port: int
    router_port: int
    admin_port: int
    router_timeout_s: float
    parked_request_max: int
    parked_request_budget_s: float
    suspend_on_stop: bool
    tls: bool
    auth: str
    default_rootfs: str
    rootfs_dir: Path | None
    pause_tier: str
    frozen_memory: int | None
    warm_pool: int
    allow_host_rootfs: bool
    actor_disk: int | None
    api_era: str = CURRENT


def default_actors_per_worker(workers: int) -> int:
    """How many actors each of ``workers`` holds by default: two running actors per CPU
    across the pool, within half the memory available now at 256 MiB an actor."""
    cpus = os.cpu_count() or 1
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = 4 * 1024**3
    total = min(2 * cpus, max(1, int(available * 0.5 // _ACTOR_MEMORY)), MAX_ACTORS)
    return max(1, total // workers)


def _check_capacity(workers: int, actors_per_worker: int | None) -> int:
    """Workers and actors per worker within the pool's limits; the latter filled in."""
    if workers < 1 or workers > 250:
        raise ValueError(f"workers must be between 1 and 250, got {workers}")
    if actors_per_worker is None:
        actors_per_worker = default_actors_per_worker(workers)
    if not 1 <= actors_per_worker <= MAX_ACTORS or workers * actors_per_worker > 250:
        raise ValueError(
            f"actors_per_worker must be 1..{MAX_ACTORS} with at most 250 actors in all "
            f"(workers x actors_per_worker), got {workers} x {actors_per_worker}"
        )
    return actors_per_worker


def _check_auth(auth: str, tls: bool) -> None:
    if auth == "jwt" and not tls:
        raise ValueError(
            "auth mode 'jwt' needs TLS (--tls): ateapi serves only TLS, and a bearer token "
            "must not cross a plaintext connection"
        )


def check_options(**given: Any) -> BackendOptions:
    """`LocalBackend`'s keywords checked and completed, each by its row of `OPTIONS` (the
    row's default where one is not given), then the rules across options; ValueError names the
    first bad one, TypeError a keyword that is no option."""
    unknown = sorted(set(given) - {row.name for row in OPTIONS})
    if unknown:
        raise TypeError(
            f"LocalBackend got unexpected keyword(s) {', '.join(unknown)}; its options are "
            f"{', '.join(row.name for row in OPTIONS)}"
        )
    values: dict[str, Any] = {}
    for row in OPTIONS:
        value = given.get(row.name, row.default)
        values[row.name] = row.check(value) if row.check is not None else value
    values["actors_per_worker"] = _check_capacity(values["workers"], values["actors_per_worker"])
    _check_auth(values["auth"], values["tls"])
    # a default template on the host's `/` opts in to host-rootfs templates already
    values["allow_host_rootfs"] = values["allow_host_rootfs"] or values["default_rootfs"] == "host"
    return BackendOptions(**values)


def keywords(options: BackendOptions) -> dict[str, Any]:
    """``options`` as `LocalBackend`'s keywords again (checking them once more changes none)."""
    return {field.name: getattr(options, field.name) for field in fields(options)}
