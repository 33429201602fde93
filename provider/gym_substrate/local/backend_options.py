"""`LocalBackend`'s options, checked before anything starts: `check_options` returns them whole.

Every option a caller (the CLI, a test, a trainer) can pass, and the environment variables that
stand in for an embedded backend's missing ones, are validated here in one place, each refusal
naming the option, the value and what works; `backend.py` then only wires the parts together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gym_substrate.ateapi.eras import CURRENT, ERAS, EraError, parse_era
from gym_substrate.local.auth import AUTH_MODES
from gym_substrate.local.runtimes import RUNTIME_NAMES, resolve_pause_tier
from gym_substrate.local.runtimes.actor_disk import ACTOR_DISK_ENV, parse_size

__all__ = [
    "API_ERA_ENV",
    "DEFAULT_ROOTFS_CHOICES",
    "MAX_ACTORS",
    "WARM_POOL_ENV",
    "BackendOptions",
    "check_options",
    "default_actors_per_worker",
]

# what the default template runs on: its own Debian (built on first use) or the host's `/`
DEFAULT_ROOTFS_CHOICES = ("debian", "host")
# an actor's sandbox (gVisor, the default Debian image, the agent): PSS measured 100-131 MiB
_ACTOR_MEMORY = 256 * 1024 * 1024
MAX_ACTORS = 64
WARM_POOL_ENV = "GYM_SUBSTRATE_WARM_POOL"  # LocalBackend's warm pool when not given
API_ERA_ENV = "GYM_SUBSTRATE_API_ERA"  # LocalBackend's API era when not given


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


def _check_router(
    ports: dict[str, int], timeout_s: float, parked_max: int, parked_budget_s: float
) -> None:
    """The listeners' ports and the router's limits."""
    for label, port in ports.items():
        if not 0 <= port <= 65535:
            raise ValueError(f"{label} must be 0..65535, got {port}")
    if timeout_s <= 0:
        raise ValueError(f"router_timeout_s must be > 0, got {timeout_s}")
    if parked_max < 0:
        raise ValueError(f"parked_request_max must be >= 0, got {parked_max}")
    if parked_budget_s <= 0:
        raise ValueError(f"parked_request_budget_s must be > 0, got {parked_budget_s}")


def _check_actor_disk(actor_disk: int | None) -> int | None:
    """Bytes of files each actor may write: the argument, else $GYM_SUBSTRATE_ACTOR_DISK
    (what tools' backends get), else None for the runtime's default."""
    if actor_disk is None and os.environ.get(ACTOR_DISK_ENV):
        try:
            actor_disk = parse_size(os.environ[ACTOR_DISK_ENV])
        except ValueError as exc:
            raise ValueError(f"{ACTOR_DISK_ENV}: {exc}") from None
    if actor_disk is not None and actor_disk < 0:
        raise ValueError(f"actor_disk must be >= 0 bytes, got {actor_disk}")
    return actor_disk


def _warm_pool_from_env() -> int:
    """``GYM_SUBSTRATE_WARM_POOL`` (sandboxes per template) or 0."""
    text = os.environ.get(WARM_POOL_ENV, "").strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"{WARM_POOL_ENV}={text!r} is not a whole number of sandboxes per template (0-16)"
        ) from None


def _check_api_era(api_era: str | None) -> str:
    """The wire era to serve: the argument, else $GYM_SUBSTRATE_API_ERA, else current."""
    source = "api_era"
    if api_era is None:
        api_era, source = os.environ.get(API_ERA_ENV, "").strip() or CURRENT, API_ERA_ENV
    try:
        return parse_era(api_era)
    except EraError as exc:
        raise ValueError(f"{source}: {exc} (allowed: {', '.join(ERAS)})") from None


def _check_auth(auth: str, tls: bool) -> None:
    if auth not in AUTH_MODES:
        raise ValueError(f"unknown auth mode {auth!r}: use one of {', '.join(AUTH_MODES)}")
    if auth == "jwt" and not tls:
        raise ValueError(
            "auth mode 'jwt' needs TLS (--tls): ateapi serves only TLS, and a bearer token "
            "must not cross a plaintext connection"
        )


def check_options(
    *,
    runtime: str,
    workers: int,
    actors_per_worker: int | None,
    api_port: int,
    router_port: int,
    admin_port: int,
    router_timeout_s: float,
    parked_request_max: int,
    parked_request_budget_s: float,
    suspend_on_stop: bool,
    tls: bool,
    auth: str,
    default_rootfs: str,
    rootfs_dir: Path | None,
    pause_tier: str | None,
    frozen_memory: int | None,
    warm_pool: int | None,
    allow_host_rootfs: bool,
    actor_disk: int | None,
    api_era: str | None = None,
) -> BackendOptions:
    """`LocalBackend`'s arguments checked and completed; ValueError names the first bad one."""
    if default_rootfs not in DEFAULT_ROOTFS_CHOICES:
        raise ValueError(
            f"unknown default rootfs {default_rootfs!r}: use one of "
            f"{', '.join(DEFAULT_ROOTFS_CHOICES)}"
        )
    if runtime not in RUNTIME_NAMES:
        raise ValueError(f"unknown runtime {runtime!r}: use one of {', '.join(RUNTIME_NAMES)}")
    actors_per_worker = _check_capacity(workers, actors_per_worker)
    ports = {"api_port": api_port, "router_port": router_port, "admin_port": admin_port}
    _check_router(ports, router_timeout_s, parked_request_max, parked_request_budget_s)
    # the freeze tier unless told (or $GYM_SUBSTRATE_PAUSE_TIER says) otherwise
    pause_tier = resolve_pause_tier(pause_tier)
    if frozen_memory is not None and frozen_memory < 0:
        raise ValueError(f"frozen_memory must be >= 0 bytes, got {frozen_memory}")
    actor_disk = _check_actor_disk(actor_disk)
    # golden sandboxes kept frozen per template (gVisor): `local up` asks for 1; an
    # embedded backend has none unless asked (or GYM_SUBSTRATE_WARM_POOL says)
    warm_pool = warm_pool if warm_pool is not None else _warm_pool_from_env()
    if not 0 <= warm_pool <= 16:
        raise ValueError(f"warm_pool must be 0..16 sandboxes per template, got {warm_pool}")
    _check_auth(auth, tls)
    api_era = _check_api_era(api_era)
    return BackendOptions(
        runtime=runtime,
        workers=workers,
        actors_per_worker=actors_per_worker,
        api_port=api_port,
        router_port=router_port,
        admin_port=admin_port,
        router_timeout_s=router_timeout_s,
        parked_request_max=parked_request_max,
        parked_request_budget_s=parked_request_budget_s,
        suspend_on_stop=suspend_on_stop,
        tls=bool(tls),
        auth=auth,
        default_rootfs=default_rootfs,
        rootfs_dir=rootfs_dir,
        pause_tier=pause_tier,
        frozen_memory=frozen_memory,
        warm_pool=warm_pool,
        # a default template on the host's `/` opts in to host-rootfs templates already
        allow_host_rootfs=bool(allow_host_rootfs) or default_rootfs == "host",
        actor_disk=actor_disk,
        api_era=api_era,
    )
