"""The local backend's options, defined once: a row per option in `OPTIONS`.

A row is the whole of an option: `LocalBackend`'s keyword and default, its check, and its
`local up` flag with its type, command-line default and help. `LocalBackend` and
`check_options` (`backend_options.py`) read the names, defaults and checks; `local up` builds its
click options from the rows (`cli/_local_common.py`) and turns what it parsed into keywords
(`from_command_line`); a backend started with `--daemon` is re-executed with the flags of its
checked options (`command_line`). Adding an option is a row here, plus its typed field on
`BackendOptions` (a test keeps the two the same).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gym_substrate.ateapi.eras import CURRENT, ERA_RELEASES, ERAS, EraError, parse_era
from gym_substrate.local.auth import AUTH_MODES
from gym_substrate.local.runtimes import (
    DEFAULT_PAUSE_TIER,
    PAUSE_TIER_ENV,
    PAUSE_TIERS,
    RUNTIME_NAMES,
    resolve_pause_tier,
)
from gym_substrate.local.runtimes.actor_disk import ACTOR_DISK_ENV, parse_size

__all__ = [
    "API_ERA_ENV",
    "DEFAULT_ADMIN_PORT",
    "DEFAULT_API_PORT",
    "DEFAULT_ROOTFS_CHOICES",
    "DEFAULT_ROUTER_PORT",
    "MAX_WARM_POOL",
    "OPTIONS",
    "WARM_POOL_ENV",
    "BackendOption",
    "admin_port_for",
    "command_line",
    "from_command_line",
    "option",
]

# what the default template runs on: its own Debian (built on first use) or the host's `/`
DEFAULT_ROOTFS_CHOICES = ("debian", "host")
WARM_POOL_ENV = "GYM_SUBSTRATE_WARM_POOL"  # LocalBackend's warm pool when not given
API_ERA_ENV = "GYM_SUBSTRATE_API_ERA"  # LocalBackend's API era when not given
MAX_WARM_POOL = 16  # sandboxes per template (gvisor.warm.MAX_WARM_POOL, checked there too)
DEFAULT_API_PORT = 47051
DEFAULT_ROUTER_PORT = 47080
DEFAULT_ADMIN_PORT = 47090

Kind = Literal["int", "float", "choice", "flag", "size", "path"]


@dataclass(frozen=True)
class BackendOption:
    """One option of the local backend: as `LocalBackend` takes it and as `local up` spells it."""

    name: str  # LocalBackend's keyword, BackendOptions' field
    default: Any  # LocalBackend's default (None: filled in by `check`)
    kind: Kind
    help: str = ""  # `local up --help`
    flag: str | None = None  # `local up`'s flag; None: LocalBackend's only
    cli_default: Any = None  # `local up`'s default
    bounds: tuple[float, float] | None = None  # int/float: the range the flag takes
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    show_default: bool = False
    # the flag's text -> LocalBackend's value ("size" flags); ValueError is prefixed with the flag
    parse: Callable[[Any], Any] | None = None
    # LocalBackend's value -> the checked one (defaults filled in); ValueError names the problem
    check: Callable[[Any], Any] | None = None


def _port(label: str) -> Callable[[int], int]:
    def check(port: int) -> int:
        if not 0 <= port <= 65535:
            raise ValueError(f"{label} must be 0..65535, got {port}")
        return port

    return check


def _positive(label: str) -> Callable[[float], float]:
    def check(value: float) -> float:
        if value <= 0:
            raise ValueError(f"{label} must be > 0, got {value}")
        return value

    return check


def _one_of(label: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"unknown {label} {value!r}: use one of {', '.join(choices)}")
        return value

    return check


def _not_negative(label: str, unit: str = "") -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and value < 0:
            raise ValueError(f"{label} must be >= 0{unit}, got {value}")
        return value

    return check


def _actor_disk(actor_disk: int | None) -> int | None:
    """Bytes of files each actor may write: the argument, else $GYM_SUBSTRATE_ACTOR_DISK
    (what tools' backends get), else None for the runtime's default."""
    if actor_disk is None and os.environ.get(ACTOR_DISK_ENV):
        try:
            actor_disk = parse_size(os.environ[ACTOR_DISK_ENV])
        except ValueError as exc:
            raise ValueError(f"{ACTOR_DISK_ENV}: {exc}") from None
    return _not_negative("actor_disk", " bytes")(actor_disk)  # type: ignore[no-any-return]


def _warm_pool(warm_pool: int | None) -> int:
    """Golden sandboxes kept frozen per template (gVisor): `local up` asks for 1; an embedded
    backend has none unless asked (or $GYM_SUBSTRATE_WARM_POOL says)."""
    if warm_pool is None:
        text = os.environ.get(WARM_POOL_ENV, "").strip()
        try:
            warm_pool = int(text) if text else 0
        except ValueError:
            raise ValueError(
                f"{WARM_POOL_ENV}={text!r} is not a whole number of sandboxes per template "
                f"(0-{MAX_WARM_POOL})"
            ) from None
    if not 0 <= warm_pool <= MAX_WARM_POOL:
        raise ValueError(
            f"warm_pool must be 0..{MAX_WARM_POOL} sandboxes per template, got {warm_pool}"
        )
    return warm_pool


def _api_era(api_era: str | None) -> str:
    """The wire era to serve: the argument, else $GYM_SUBSTRATE_API_ERA, else current."""
    source = "api_era"
    if api_era is None:
        api_era, source = os.environ.get(API_ERA_ENV, "").strip() or CURRENT, API_ERA_ENV
    try:
        return parse_era(api_era)
    except EraError as exc:
        raise ValueError(f"{source}: {exc} (allowed: {', '.join(ERAS)})") from None


def _frozen_memory_text(text: str | None) -> int:
    from gym_substrate.local.runtimes.gvisor.freezer import (
        default_frozen_memory,
        parse_frozen_memory,
    )

    return parse_frozen_memory(text) if text else default_frozen_memory()


def _actor_disk_text(text: str | None) -> int | None:
    return parse_size(text) if text else None


_ERAS_HELP = "; ".join(f"{era}: {what}" for era, what in ERA_RELEASES.items())

# In `local up --help` order. Ranges and choices of the flags are checked by click; `check` is
# what LocalBackend checks of a caller's value (the cross-option rules are in check_options).
OPTIONS: tuple[BackendOption, ...] = (
    BackendOption(
        "workers", 4, "int", flag="--workers", cli_default=4, bounds=(1, 250),
        show_default=True,
        help="Worker pods; each holds up to --actors-per-worker running actors.",
    ),
    BackendOption(
        "actors_per_worker", None, "int", flag="--actors-per-worker", bounds=(1, 64),
        help="Actors one worker holds at once (default: from this machine's CPUs and free "
        "memory, two actors per CPU within half the free memory at 256 MiB each). At most 250 "
        "in all.",
    ),
    BackendOption(
        "runtime", "auto", "choice", flag="--runtime", cli_default="auto",
        choices=RUNTIME_NAMES, show_default=True, check=_one_of("runtime", RUNTIME_NAMES),
        help="gvisor sandboxes (runsc + root), plain processes, or auto-pick.",
    ),
    BackendOption(
        "api_port", 0, "int", flag="--api-port", cli_default=DEFAULT_API_PORT,
        bounds=(0, 65535), show_default=True, check=_port("api_port"),
        help="gRPC API port on 127.0.0.1 (0 = any free port).",
    ),
    BackendOption(
        "router_port", 0, "int", flag="--router-port", cli_default=DEFAULT_ROUTER_PORT,
        bounds=(0, 65535), show_default=True, check=_port("router_port"),
        help="Router port on 127.0.0.1 (0 = any free port).",
    ),
    BackendOption(
        "admin_port", 0, "int", flag="--admin-port", bounds=(0, 65535),
        check=_port("admin_port"),
        help="Port of the backend's own endpoints (/readyz, /metrics, /_local/*) on 127.0.0.1 "
        f"(0 = any free port; default {DEFAULT_ADMIN_PORT}, or any free port when --api-port "
        "and --router-port are both 0).",
    ),
    BackendOption(
        "router_timeout_s", 300.0, "float", flag="--router-timeout", cli_default=300.0,
        bounds=(0.1, 3600), show_default=True, check=_positive("router_timeout_s"),
        help="The router's route timeout in seconds (atenet's: 5 minutes).",
    ),
    BackendOption(
        "parked_request_max", 1024, "int", flag="--parked-requests", cli_default=1024,
        bounds=(0, 1_000_000), show_default=True, check=_not_negative("parked_request_max"),
        help="Requests the router parks while their actor waits for capacity (atenet's "
        "parked-request-max; 0 disables parking).",
    ),
    BackendOption(
        "parked_request_budget_s", 5.0, "float", flag="--resume-budget-s", cli_default=5.0,
        bounds=(0.1, 600), show_default=True, check=_positive("parked_request_budget_s"),
        help="Seconds the router keeps retrying a parked resume, from its first request "
        "(atenet's parked-request budget).",
    ),
    BackendOption(
        "suspend_on_stop", False, "flag", flag="--suspend-on-stop", check=bool,
        help="On every stop (Ctrl-C, SIGTERM, `local down`), suspend running actors first "
        "instead of letting them crash as their workers go away (`local down --suspend` does "
        "it once).",
    ),
    BackendOption(
        "tls", False, "flag", flag="--tls", check=bool,
        help="Serve the API over TLS as ateapi does (a CA and a certificate for "
        "api.ate-system.svc in <state-dir>/tls; needs gym-substrate[local-tls]). Default: "
        "plaintext.",
    ),
    BackendOption(
        "auth", "mtls", "choice", flag="--auth", cli_default="mtls", choices=AUTH_MODES,
        show_default=True, check=_one_of("auth mode", AUTH_MODES),
        help="ateapi's --auth-mode: mtls checks no caller; jwt wants a bearer token on every "
        "call (<state-dir>/auth/token; needs --tls).",
    ),
    BackendOption(
        "pause_tier", None, "choice", flag="--pause-tier", choices=PAUSE_TIERS,
        # the freeze tier unless told (or $GYM_SUBSTRATE_PAUSE_TIER says) otherwise
        check=resolve_pause_tier,
        help="What PauseActor does under gVisor: freeze the sandbox in memory (its worker is "
        "free at once; ~1 ms) or checkpoint it to node-local disk (~0.1-0.5 s). Frozen actors "
        "past --frozen-memory are checkpointed, least recently paused first. Default: "
        f"${PAUSE_TIER_ENV}, else {DEFAULT_PAUSE_TIER}.",
    ),
    BackendOption(
        "frozen_memory", None, "size", flag="--frozen-memory", metavar="SIZE",
        parse=_frozen_memory_text, check=_not_negative("frozen_memory", " bytes"),
        help="Memory (PSS) paused actors may keep frozen, e.g. 2G or 512M; 0 checkpoints every "
        "pause (default: a quarter of the memory available at start, printed).",
    ),
    BackendOption(
        "actor_disk", None, "size", flag="--actor-disk", metavar="SIZE",
        parse=_actor_disk_text, check=_actor_disk,
        help="Files each actor may write, e.g. 1GiB or 512M (gVisor: its root overlay, in "
        "memory; process runtime: its working folder and /tmp, on disk, needs root); a write "
        "past it fails with ENOSPC in that actor only; 0 turns the limit off (default: 1GiB, "
        "printed).",
    ),
    BackendOption(
        "warm_pool", None, "int", flag="--warm-pool", cli_default=1,
        bounds=(0, MAX_WARM_POOL), metavar="N", show_default=True, check=_warm_pool,
        help="Sandboxes per template kept restored from its golden snapshot and frozen "
        "(gVisor), so an actor's first resume thaws one (~tens of ms) instead of restoring "
        "(~0.5 s); each holds ~45-65 MiB inside --frozen-memory, dropped before any paused "
        "actor. 0: no pool.",
    ),
    BackendOption(
        "default_rootfs", "debian", "choice", flag="--rootfs", cli_default="debian",
        choices=DEFAULT_ROOTFS_CHOICES, show_default=True,
        check=_one_of("default rootfs", DEFAULT_ROOTFS_CHOICES),
        help="What the default template `local/sandbox` runs on: a minimal Debian of its own "
        "(built on first use, `local rootfs build`) or, as an explicit opt-in, the host's `/`.",
    ),
    BackendOption(
        "allow_host_rootfs", False, "flag", flag="--allow-host-rootfs", check=bool,
        help="Let API clients create templates on the host's own `/` (image local/host): their "
        "sandboxes see the host's files, read-only. Refused (FAILED_PRECONDITION) without it; "
        "`--rootfs host` implies it.",
    ),
    BackendOption(
        "api_era", None, "choice", flag="--api-era", choices=ERAS, check=_api_era,
        help="The ateapi release the API speaks on the wire and describes by reflection "
        f"({_ERAS_HELP}). Default: ${API_ERA_ENV}, else current.",
    ),
    BackendOption("rootfs_dir", None, "path"),  # tests and tools: a prepared rootfs folder
)  # fmt: skip

_BY_NAME = {row.name: row for row in OPTIONS}


def option(name: str) -> BackendOption:
    """The row of LocalBackend's keyword ``name`` (KeyError names the known ones)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no local backend option {name!r}: one of {', '.join(_BY_NAME)}") from None


def admin_port_for(api_port: int, router_port: int, admin_port: int | None) -> int:
    """The admin listener's port: as given, else free-chosen (0) when the other two are, so a
    second backend started with `--api-port 0 --router-port 0` does not collide on 47090."""
    if admin_port is not None:
        return admin_port
    return 0 if api_port == 0 and router_port == 0 else DEFAULT_ADMIN_PORT


def from_command_line(values: Mapping[str, Any]) -> dict[str, Any]:
    """`local up`'s parsed flags (by option name) as LocalBackend's keywords: sizes read,
    the admin port chosen. ValueError starts with the flag it is about."""
    keywords = dict(values)
    for row in OPTIONS:
        if row.parse is not None and row.name in keywords:
            try:
                keywords[row.name] = row.parse(keywords[row.name])
            except ValueError as exc:
                raise ValueError(f"{row.flag}: {exc}") from None
    keywords["admin_port"] = admin_port_for(
        keywords["api_port"], keywords["router_port"], keywords.get("admin_port")
    )
    return keywords


def command_line(values: Mapping[str, Any]) -> list[str]:
    """The `local up` flags that start a backend with these (checked) options: a flag for
    every value set, none for an unset (None) or false one."""
    argv: list[str] = []
    for row in OPTIONS:
        value = values.get(row.name)
        if row.flag is None or value is None or value is False:
            continue
        argv += [row.flag] if row.kind == "flag" else [row.flag, str(value)]
    return argv
