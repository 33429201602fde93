"""`gym-substrate local ...`: run, inspect and stop the local Agent Substrate.

`up` runs the backend in the foreground (Ctrl-C stops it and every sandbox) or, with
`--daemon`, re-executes itself detached and returns once the API and the router answer. Other
commands find a running backend through `<state-dir>/backend.json`, so they work from any shell.
The work is done by `gym_substrate.local` (`LocalBackend`, `statedir`, `daemon`); this module
parses options and prints. `templates`/`images` and `rootfs` live in their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from gym_substrate.cli._local_common import (
    api_era_option,
    make_state_dir,
    prepare_rootfs,
    resolve,
    rootfs_option,
    state_dir_option,
    warm_pool_option,
)
from gym_substrate.cli._output import Column, console, emit_json, fail, table
from gym_substrate.cli.local_bench import bench, demo
from gym_substrate.cli.local_rootfs import rootfs_group
from gym_substrate.cli.local_templates import images, templates
from gym_substrate.local import daemon, settle, statedir
from gym_substrate.local.auth import AUTH_MODES
from gym_substrate.local.backend import LocalBackend, default_actors_per_worker
from gym_substrate.local.client_config import (
    API_SERVER_NAME,
    provider_config,
    provider_config_env,
    provider_config_yaml,
)
from gym_substrate.local.errors import BackendError
from gym_substrate.local.runtimes import (
    DEFAULT_PAUSE_TIER,
    PAUSE_TIER_ENV,
    PAUSE_TIERS,
    RUNTIME_NAMES,
    resolve_pause_tier,
)
from gym_substrate.local.runtimes.base import RuntimeFailure

__all__ = ["local"]

DEFAULT_API_PORT = 47051
DEFAULT_ROUTER_PORT = 47080
DEFAULT_ADMIN_PORT = 47090

err = Console(stderr=True)


def admin_port_for(api_port: int, router_port: int, admin_port: int | None) -> int:
    """The admin listener's port: as given, else free-chosen (0) when the other two are, so a
    second backend started with `--api-port 0 --router-port 0` does not collide on 47090."""
    if admin_port is not None:
        return admin_port
    return 0 if api_port == 0 and router_port == 0 else DEFAULT_ADMIN_PORT


def _print_up(info: dict[str, Any]) -> None:
    console.print(f"[bold green]local Agent Substrate is up[/] (runtime: {info['runtime']})")
    if info.get("runtime_reason"):
        console.print(f"  why this runtime: {info['runtime_reason']}")
    if info.get("runtime_warning"):
        console.print(f"  [yellow]warning:[/] {info['runtime_warning']}")
    console.print(f"  capacity: {_capacity(info)}", highlight=False)
    console.print(f"  ateapi era on the wire (--api-era): {info.get('api_era', 'current')}")
    if info.get("tls"):
        console.print(
            f"  API (ateapi.Control, TLS gRPC for {API_SERVER_NAME}, auth {info['auth']}): "
            f"{info['api']}"
        )
        console.print(f"  CA to pin: {info['ca_file']}")
        if info.get("token_file"):
            console.print(f"  bearer token (rewritten every 48 min): {info['token_file']}")
    else:
        console.print(f"  API (ateapi.Control, plaintext gRPC): {info['api']}")
    console.print(f"  router (header ate-target-actor: <atespace>/<actor>): {info['router']}")
    admin = info.get("admin", "")
    console.print(f"  admin (/readyz, /metrics, /_local/status, /_local/images): {admin}")
    if info.get("admin_token_file"):
        console.print(f"  admin token (/_local/*, this user only): {info['admin_token_file']}")
    console.print(f"  metrics: {admin}/metrics")
    config = provider_config(
        info["api"],
        info["router"],
        ca_file=info.get("ca_file") or None,
        token_file=info.get("token_file") or None,
    )
    console.print("Provider config (paste under your substrate provider):")
    console.print(provider_config_yaml(config), markup=False, highlight=False, soft_wrap=True)
    console.print("or, with configs/substrate.yaml:")
    console.print(provider_config_env(config), markup=False, highlight=False, soft_wrap=True)


def _capacity(info: dict[str, Any]) -> str:
    workers, per = int(info.get("workers", 0)), int(info.get("actors_per_worker", 0))
    worker_s, actor_s = (
        ("worker" if workers == 1 else "workers"),
        ("actor" if per == 1 else "actors"),
    )
    return f"{workers} {worker_s} x {per} {actor_s} ({workers * per} running at once)"


@click.group()
def local() -> None:
    """Run Agent Substrate on this machine: ateapi control plane, router, sandboxes."""


local.add_command(templates)
local.add_command(images)
local.add_command(rootfs_group)
local.add_command(demo)
local.add_command(bench)


@local.command()
@click.option(
    "--workers",
    type=click.IntRange(1, 250),
    default=4,
    show_default=True,
    help="Worker pods; each holds up to --actors-per-worker running actors.",
)
@click.option(
    "--actors-per-worker",
    type=click.IntRange(1, 64),
    default=None,
    help="Actors one worker holds at once (default: from this machine's CPUs and free memory, "
    "two actors per CPU within half the free memory at 256 MiB each). At most 250 in all.",
)
@click.option(
    "--runtime",
    type=click.Choice(RUNTIME_NAMES),
    default="auto",
    show_default=True,
    help="gvisor sandboxes (runsc + root), plain processes, or auto-pick.",
)
@state_dir_option
@click.option(
    "--api-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_API_PORT,
    show_default=True,
    help="gRPC API port on 127.0.0.1 (0 = any free port).",
)
@click.option(
    "--router-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_ROUTER_PORT,
    show_default=True,
    help="Router port on 127.0.0.1 (0 = any free port).",
)
@click.option(
    "--admin-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port of the backend's own endpoints (/readyz, /metrics, /_local/*) on 127.0.0.1 "
    f"(0 = any free port; default {DEFAULT_ADMIN_PORT}, or any free port when --api-port and "
    "--router-port are both 0).",
)
@click.option(
    "--router-timeout",
    type=click.FloatRange(0.1, 3600),
    default=300.0,
    show_default=True,
    help="The router's route timeout in seconds (atenet's: 5 minutes).",
)
@click.option(
    "--parked-requests",
    type=click.IntRange(0, 1_000_000),
    default=1024,
    show_default=True,
    help="Requests the router parks while their actor waits for capacity (atenet's "
    "parked-request-max; 0 disables parking).",
)
@click.option(
    "--resume-budget-s",
    type=click.FloatRange(0.1, 600, min_open=False),
    default=5.0,
    show_default=True,
    help="Seconds the router keeps retrying a parked resume, from its first request (atenet's "
    "parked-request budget).",
)
@click.option(
    "--suspend-on-stop",
    is_flag=True,
    help="On every stop (Ctrl-C, SIGTERM, `local down`), suspend running actors first instead "
    "of letting them crash as their workers go away (`local down --suspend` does it once).",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Serve the API over TLS as ateapi does (a CA and a certificate for api.ate-system.svc "
    "in <state-dir>/tls; needs gym-substrate[local-tls]). Default: plaintext.",
)
@click.option(
    "--auth",
    type=click.Choice(AUTH_MODES),
    default="mtls",
    show_default=True,
    help="ateapi's --auth-mode: mtls checks no caller; jwt wants a bearer token on every call "
    "(<state-dir>/auth/token; needs --tls).",
)
@click.option(
    "--pause-tier",
    type=click.Choice(PAUSE_TIERS),
    default=None,
    help="What PauseActor does under gVisor: freeze the sandbox in memory (its worker is free "
    "at once; ~1 ms) or checkpoint it to node-local disk (~0.1-0.5 s). Frozen actors past "
    "--frozen-memory are checkpointed, least recently paused first. Default: "
    f"${PAUSE_TIER_ENV}, else {DEFAULT_PAUSE_TIER}.",
)
@click.option(
    "--frozen-memory",
    metavar="SIZE",
    default=None,
    help="Memory (PSS) paused actors may keep frozen, e.g. 2G or 512M; 0 checkpoints every "
    "pause (default: a quarter of the memory available at start, printed).",
)
@click.option(
    "--actor-disk",
    metavar="SIZE",
    default=None,
    help="Files each actor may write, e.g. 1GiB or 512M (gVisor: its root overlay, in memory; "
    "process runtime: its working folder and /tmp, on disk, needs root); a write past it fails "
    "with ENOSPC in that actor only; 0 turns the limit off (default: 1GiB, printed).",
)
@warm_pool_option(
    1,
    "Sandboxes per template kept restored from its golden snapshot and frozen (gVisor), "
    "so an actor's first resume thaws one (~tens of ms) instead of restoring (~0.5 s); each "
    "holds ~45-65 MiB inside --frozen-memory, dropped before any paused actor. 0: no pool.",
)
@rootfs_option
@click.option(
    "--allow-host-rootfs",
    is_flag=True,
    help="Let API clients create templates on the host's own `/` (image local/host): their "
    "sandboxes see the host's files, read-only. Refused (FAILED_PRECONDITION) without it; "
    "`--rootfs host` implies it.",
)
@api_era_option
@click.option("--daemon", is_flag=True, help="Run in the background; return once it answers.")
@click.option("--json", "as_json", is_flag=True, help="Print the addresses as JSON.")
def up(
    workers: int,
    actors_per_worker: int | None,
    runtime: str,
    state_dir: Path | None,
    api_port: int,
    router_port: int,
    admin_port: int | None,
    router_timeout: float,
    parked_requests: int,
    resume_budget_s: float,
    suspend_on_stop: bool,
    tls: bool,
    auth: str,
    pause_tier: str | None,
    frozen_memory: str | None,
    actor_disk: str | None,
    warm_pool: int,
    rootfs: str,
    allow_host_rootfs: bool,
    api_era: str | None,
    daemon: bool,
    as_json: bool,
) -> None:
    """Start the backend (foreground unless --daemon).

    Stopping it (Ctrl-C, SIGTERM, `local down`) ends every sandbox; its running actors show
    CRASHED (`worker pod went away while hosting the actor`) and RevertActor takes them back to
    their last suspend, unless --suspend-on-stop (or `local down --suspend`) suspends them first.
    """
    if auth == "jwt" and not tls:
        raise fail(
            "--auth jwt needs --tls: ateapi serves only TLS, and a bearer token must not cross a "
            "plaintext connection"
        )
    from gym_substrate.local.runtimes.gvisor.freezer import (
        default_frozen_memory,
        parse_frozen_memory,
    )

    try:
        frozen_bytes = (
            parse_frozen_memory(frozen_memory) if frozen_memory else default_frozen_memory()
        )
    except ValueError as exc:
        raise fail(f"--frozen-memory: {exc}") from None
    try:
        pause_tier = resolve_pause_tier(pause_tier)
    except ValueError as exc:
        raise fail(str(exc)) from None
    from gym_substrate.local.runtimes.actor_disk import describe, parse_size

    try:
        disk_bytes = parse_size(actor_disk) if actor_disk else None
    except ValueError as exc:
        raise fail(f"--actor-disk: {exc}") from None
    per_worker = actors_per_worker or default_actors_per_worker(workers)
    if workers * per_worker > 250:
        raise fail(
            f"--workers {workers} x --actors-per-worker {per_worker} is {workers * per_worker} "
            "actors; the local backend runs at most 250 at once: lower one of them"
        )
    folder = resolve(state_dir)
    running = statedir.read_backend_info(folder)
    if running is not None:
        raise fail(
            f"a backend (pid {running['pid']}) already runs on {folder} at {running['api']}; "
            f"stop it first with `gym-substrate local down --state-dir {folder}`"
        )
    make_state_dir(folder)
    options = {
        "workers": workers,
        "actors_per_worker": actors_per_worker,
        "runtime": runtime,
        "api_port": api_port,
        "router_port": router_port,
        "admin_port": admin_port_for(api_port, router_port, admin_port),
        "router_timeout": router_timeout,
        "parked_requests": parked_requests,
        "resume_budget_s": resume_budget_s,
        "suspend_on_stop": suspend_on_stop,
        "tls": tls,
        "auth": auth,
        "rootfs": rootfs,
        "pause_tier": pause_tier,
        "frozen_memory": frozen_bytes,
        "warm_pool": warm_pool,
        "allow_host_rootfs": allow_host_rootfs,
        "actor_disk": disk_bytes,
        "api_era": api_era,
    }
    if not as_json:
        err.print(describe(disk_bytes))
    if pause_tier == "freeze" and not as_json:
        err.print(
            f"pause tier (gVisor runtime): freeze; up to {frozen_bytes / 2**20:.0f} MiB of "
            "paused actors stay frozen in memory (--frozen-memory), past it they are checkpointed"
        )
    if runtime != "process" and not as_json:
        pool = f"{warm_pool} frozen golden sandbox(es) per template" if warm_pool else "off"
        err.print(f"warm pool (gVisor runtime, --warm-pool): {pool}, within --frozen-memory")
    if daemon:
        if rootfs == "debian":  # a first build takes minutes: here, with progress, not detached
            prepare_rootfs(runtime)
        _up_detached(folder, options, as_json)
        return
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(_foreground(folder, options, as_json))
    except (BackendError, RuntimeFailure, ValueError) as exc:
        raise fail(str(exc)) from exc


async def _foreground(folder: Path, options: dict[str, Any], as_json: bool) -> None:
    backend = LocalBackend(
        folder,
        runtime=options["runtime"],
        workers=options["workers"],
        actors_per_worker=options["actors_per_worker"],
        api_port=options["api_port"],
        router_port=options["router_port"],
        admin_port=options["admin_port"],
        router_timeout_s=options["router_timeout"],
        parked_request_max=options["parked_requests"],
        parked_request_budget_s=options["resume_budget_s"],
        suspend_on_stop=options["suspend_on_stop"],
        tls=options["tls"],
        auth=options["auth"],
        default_rootfs=options["rootfs"],
        pause_tier=options["pause_tier"],
        frozen_memory=options["frozen_memory"],
        warm_pool=options["warm_pool"],
        allow_host_rootfs=options["allow_host_rootfs"],
        actor_disk=options["actor_disk"],
        api_era=options["api_era"],
    )
    backend.standalone = True
    stop = asyncio.Event()

    def suspend_and_stop() -> None:  # `local down --suspend`
        backend.suspend_on_stop = True
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(daemon.SUSPEND_AND_STOP, suspend_and_stop)
    async with backend:
        info = statedir.read_backend_info(folder) or {}
        if as_json:
            emit_json(info)
        else:
            _print_up(info)
            console.print("Ctrl-C (or `gym-substrate local down`) stops it and every sandbox.")
        sys.stdout.flush()
        await stop.wait()
        if backend.suspend_on_stop:
            err.print("stopping: suspending running actors, then ending every sandbox ...")
        else:
            err.print(
                "stopping: ending every sandbox; running actors show CRASHED (RevertActor takes "
                "them back to their last suspend) ..."
            )


def _up_detached(folder: Path, options: dict[str, Any], as_json: bool) -> None:
    proc = daemon.spawn(folder, **options)
    with console.status("starting the backend (control plane, router, templates) ..."):
        try:
            info = daemon.wait_until_serving(folder, proc)
        except BackendError as exc:
            raise fail(str(exc)) from exc
    if as_json:
        emit_json(info)
    else:
        _print_up(info)
        console.print(
            f"log: {folder / 'backend.log'}; stop it with `gym-substrate local down "
            f"--state-dir {folder}`"
        )


@local.command()
@state_dir_option
@click.option(
    "--timeout",
    type=click.FloatRange(1, 3600),
    default=180,
    show_default=True,
    help="Seconds to wait for a clean stop before killing the backend.",
)
@click.option(
    "--suspend",
    is_flag=True,
    help="Suspend running actors before stopping (else they show CRASHED: their workers went "
    "away; RevertActor takes them back to their last suspend).",
)
@click.option(
    "--purge",
    is_flag=True,
    help="Then remove the state folder's contents (actors, templates, tags, snapshots, images, "
    "credentials; the shared rootfs build stays): also for a folder of an older backend.",
)
@click.option(
    "--orphans",
    is_flag=True,
    help="Instead: clean up after every backend on this machine that died without "
    "stopping its sandboxes (crashed or interrupted runs, any state folder).",
)
@click.option(
    "--discard",
    is_flag=True,
    help="After a crash, remove the sandboxes the dead backend left running without adopting "
    "them first: their actors' state since their last snapshot is dropped (they show CRASHED).",
)
def down(
    state_dir: Path | None,
    timeout: float,
    suspend: bool,
    purge: bool,
    orphans: bool,
    discard: bool,
) -> None:
    """Stop the backend and remove every sandbox it made (also after a crash: running actors
    are adopted first, then suspended with --suspend or CRASHED without)."""
    if suspend and discard:
        raise fail("--suspend keeps running actors' state and --discard drops it: pick one")
    if orphans:
        if suspend or purge or discard or state_dir is not None:
            raise fail("--orphans cleans up every dead backend: it takes no --state-dir, "
                       "--suspend, --discard or --purge")  # fmt: skip
        found = asyncio.run(statedir.cleanup_orphans())
        for line in found:
            console.print(f"removed leftover: {line}")
        if not found:
            console.print("no orphaned sandboxes on this machine")
        return
    folder = resolve(state_dir)
    info = statedir.read_backend_info(folder)
    if info is not None and not info.get("standalone", False):
        raise fail(
            f"the backend on {folder} runs inside process {info['pid']} (an embedded "
            "LocalBackend), not `local up`; stop it from that program"
        )
    if info is not None:
        pid = int(info["pid"])
        how = "suspending its running actors" if suspend else "its running actors crash"
        with console.status(f"stopping backend pid {pid} ({how}) ..."):
            daemon.stop(
                pid,
                timeout,
                suspend=suspend,
                on_kill=lambda: err.print(
                    f"backend pid {pid} did not stop in {timeout:.0f} s; killing it"
                ),
            )
        console.print(f"stopped the backend (pid {pid})")
    removed = _settle_after_crash(folder, suspend=suspend, discard=discard)
    try:
        removed += asyncio.run(statedir.cleanup_state_dir(folder))
    except (BackendError, RuntimeFailure) as exc:
        raise fail(str(exc)) from exc
    for line in removed:
        console.print(f"removed leftover: {line}")
    left = asyncio.run(statedir.state_leftovers(folder))
    if left:
        raise fail("could not remove: " + "; ".join(left))
    if purge:
        try:
            purged = statedir.purge_state_dir(folder)
        except BackendError as exc:
            raise fail(str(exc)) from exc
        for line in purged:
            console.print(f"purged: {line}", highlight=False)
        console.print(f"purged {folder} ({len(purged)} entries; rootfs/ kept if there)")
    elif info is None and not removed:
        console.print(f"no backend was running on {folder}; nothing left behind")


def _settle_after_crash(folder: Path, *, suspend: bool, discard: bool) -> list[str]:
    """What a dead (or killed) backend left running: adopted, then suspended or crashed, and
    said so; with --discard only listed, as its sandboxes are removed. What it removed."""
    try:
        if discard:
            for line in settle.active_actors(folder):
                console.print(
                    f"discarded: actor {line}: its sandbox is removed without a checkpoint; it "
                    "shows CRASHED at the next start",
                    highlight=False,
                )
            return []
        with console.status("adopting what the stopped backend left running ..."):
            lines, removed = asyncio.run(settle.settle_stopped_backend(folder, suspend=suspend))
    except (BackendError, RuntimeFailure, ValueError, OSError) as exc:
        raise fail(
            f"could not adopt what the stopped backend on {folder} left running: {exc}; "
            "`gym-substrate local down --discard` removes its sandboxes without adopting them "
            "(their actors then show CRASHED)"
        ) from exc
    for line in lines:
        console.print(line, highlight=False)
    return removed


@local.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(state_dir: Path | None, as_json: bool) -> None:
    """Show workers, actors, templates and tags of the running backend (or a stopped one's)."""
    folder = resolve(state_dir)
    info = statedir.read_backend_info(folder)
    if info is None:
        try:
            stored = statedir.stored_status(folder)
        except BackendError as exc:
            raise fail(str(exc)) from exc
        if as_json:
            emit_json({"running": False, "state_dir": str(folder), **(stored or {})})
            return
        if stored is None:
            raise fail(
                f"no backend is running on {folder} and it holds no state; start one with "
                "`gym-substrate local up`"
            )
        console.print(
            f"[bold]no backend is running[/] on {folder}; its stored state (start it with "
            "`gym-substrate local up`):"
        )
        _print_status(stored)
        return
    try:
        data = daemon.fetch_status(info, folder)
    except BackendError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        emit_json({"running": True, "api_era": info.get("api_era", "current"), **data})
        return
    console.print(
        f"runtime [bold]{data['runtime']}[/], {_capacity(info)}, API {data['api']} (ateapi era "
        f"{info.get('api_era', 'current')}), router "
        f"{data['router']}, admin {data.get('admin', '-')}, state {data['state_dir']}"
    )
    _print_status(data)


def _joined(items: Any) -> str:
    return ", ".join(items) if items else "-"


_WORKER_COLUMNS = (
    Column("worker"),
    Column("state"),
    Column("allocated", "actors held", fmt=lambda n: str(n), justify="right"),
    Column("capacity", justify="right"),
    Column("actors", fmt=_joined),
    Column("epoch", justify="right"),
)
_ACTOR_COLUMNS = (
    Column("ref", "actor"),
    "template",
    "state",
    "version",
    Column("worker", fmt=lambda w: w or "-"),
    Column("address", fmt=lambda a: a or "-"),
    Column("crash", "crash message", fmt=lambda m: m or "-"),
)
_TEMPLATE_COLUMNS = (
    "template",
    Column("golden", "golden tag"),
    "uid",
)
_TAG_COLUMNS = ("tag", "scope", Column("source_actor", "source actor"), "status")


def _golden(row: dict[str, Any]) -> str:
    if row.get("golden_error"):
        return f"error: {row['golden_error']}"
    return str(row.get("golden_tag") or "building")


def _print_status(data: dict[str, Any]) -> None:
    if data["workers"]:
        console.print(table(data["workers"], _WORKER_COLUMNS, title="workers"))
    actors = [{**a, "ref": f"{a['atespace']}/{a['actor']}"} for a in data["actors"]]
    console.print(table(actors, _ACTOR_COLUMNS, title=f"actors ({len(actors)})"))
    rows = [{**t, "golden": _golden(t)} for t in data["templates"]]
    console.print(table(rows, _TEMPLATE_COLUMNS, title="templates"))
    tags = data.get("tags") or []
    console.print(table(tags, _TAG_COLUMNS, title=f"tags ({len(tags)})"))
