"""`gym-substrate local ...`: run, inspect and stop the local Agent Substrate.

`up` runs the backend in the foreground (Ctrl-C stops it and every sandbox) or, with
`--daemon`, re-executes itself detached and returns once the API and the router answer. Other
commands find a running backend through `<state-dir>/backend.json`, so they work from any shell.
The work is done by `gym_substrate.local` (`LocalBackend`, `statedir`, `daemon`); this module
parses options and prints.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console

from gym_substrate.cli._output import Column, console, emit, emit_json, fail, table
from gym_substrate.local import daemon, statedir
from gym_substrate.local import rootfs as rootfs_mod
from gym_substrate.local.auth import AUTH_MODES
from gym_substrate.local.backend import DEFAULT_ROOTFS_CHOICES, LocalBackend
from gym_substrate.local.client_config import (
    API_SERVER_NAME,
    provider_config,
    provider_config_env,
    provider_config_yaml,
)
from gym_substrate.local.errors import BackendError
from gym_substrate.local.runtimes import RUNTIME_NAMES
from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.templates import (
    TemplateError,
    absolute_template_doc,
    load_template_file,
)

__all__ = ["local"]

DEFAULT_API_PORT = 47051
DEFAULT_ROUTER_PORT = 47080
DEFAULT_ADMIN_PORT = 47090

err = Console(stderr=True)


def _rootfs_option(func: Any) -> Any:
    return click.option(
        "--rootfs",
        type=click.Choice(DEFAULT_ROOTFS_CHOICES),
        default="debian",
        show_default=True,
        help="What the default template `local/sandbox` runs on: a minimal Debian of its own "
        "(built on first use, `local rootfs build`) or, as an explicit opt-in, the host's `/`.",
    )(func)


def _prepare_rootfs() -> None:
    try:
        rootfs_mod.ensure_rootfs()
        rootfs_mod.agent_binary()
    except rootfs_mod.RootfsError as exc:
        raise fail(str(exc)) from exc


def _state_dir_option(func: Any) -> Any:
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="State folder (default $GYM_SUBSTRATE_STATE_DIR or ~/.local/state/gym-substrate).",
    )(func)


def _resolve(state_dir: Path | None) -> Path:
    return (state_dir or statedir.default_state_dir()).expanduser().resolve()


def _make_state_dir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(
            f"cannot create the state folder {folder} ({exc.strerror or exc}); pick a writable "
            "one with --state-dir or $GYM_SUBSTRATE_STATE_DIR"
        ) from exc


def _print_up(info: dict[str, Any]) -> None:
    console.print(f"[bold green]local Agent Substrate is up[/] (runtime: {info['runtime']})")
    if info.get("runtime_reason"):
        console.print(f"  why this runtime: {info['runtime_reason']}")
    if info.get("runtime_warning"):
        console.print(f"  [yellow]warning:[/] {info['runtime_warning']}")
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
    console.print(
        f"  router (Host: <actor>.<atespace>.actors.resources.substrate.ate.dev): {info['router']}"
    )
    admin = info.get("admin", "")
    console.print(f"  admin (/readyz, /metrics, /_local/status, /_local/templates): {admin}")
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


@click.group()
def local() -> None:
    """Run Agent Substrate on this machine: ateapi control plane, router, sandboxes."""


@local.command()
@click.option(
    "--workers",
    type=click.IntRange(1, 250),
    default=4,
    show_default=True,
    help="Worker slots: how many actors may run at once.",
)
@click.option(
    "--runtime",
    type=click.Choice(RUNTIME_NAMES),
    default="auto",
    show_default=True,
    help="gvisor sandboxes (runsc + root), plain processes, or auto-pick.",
)
@_state_dir_option
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
    default=DEFAULT_ADMIN_PORT,
    show_default=True,
    help="Port of the backend's own endpoints (/readyz, /metrics, /_local/*) on 127.0.0.1 "
    "(0 = any free port).",
)
@click.option(
    "--router-timeout",
    type=click.FloatRange(0.1, 3600),
    default=10.0,
    show_default=True,
    help="Per-request router timeout in seconds (Substrate: 10).",
)
@click.option(
    "--kill-on-stop",
    is_flag=True,
    help="On stop, kill running actors instead of suspending them first.",
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
@_rootfs_option
@click.option("--daemon", is_flag=True, help="Run in the background; return once it answers.")
@click.option("--json", "as_json", is_flag=True, help="Print the addresses as JSON.")
def up(
    workers: int,
    runtime: str,
    state_dir: Path | None,
    api_port: int,
    router_port: int,
    admin_port: int,
    router_timeout: float,
    kill_on_stop: bool,
    tls: bool,
    auth: str,
    rootfs: str,
    daemon: bool,
    as_json: bool,
) -> None:
    """Start the backend (foreground unless --daemon).

    Stopping it (Ctrl-C, SIGTERM, `local down`) suspends every running actor first, so a later
    `up` resumes them where they were; --kill-on-stop skips that.
    """
    if auth == "jwt" and not tls:
        raise fail(
            "--auth jwt needs --tls: ateapi serves only TLS, and a bearer token must not cross a "
            "plaintext connection"
        )
    folder = _resolve(state_dir)
    running = statedir.read_backend_info(folder)
    if running is not None:
        raise fail(
            f"a backend (pid {running['pid']}) already runs on {folder} at {running['api']}; "
            f"stop it first with `gym-substrate local down --state-dir {folder}`"
        )
    _make_state_dir(folder)
    options = {
        "workers": workers,
        "runtime": runtime,
        "api_port": api_port,
        "router_port": router_port,
        "admin_port": admin_port,
        "router_timeout": router_timeout,
        "kill_on_stop": kill_on_stop,
        "tls": tls,
        "auth": auth,
        "rootfs": rootfs,
    }
    if daemon:
        if rootfs == "debian":  # a first build takes minutes: here, with progress, not detached
            _prepare_rootfs()
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    backend = LocalBackend(
        folder,
        runtime=options["runtime"],
        workers=options["workers"],
        api_port=options["api_port"],
        router_port=options["router_port"],
        admin_port=options["admin_port"],
        router_timeout_s=options["router_timeout"],
        tls=options["tls"],
        auth=options["auth"],
        default_rootfs=options["rootfs"],
    )
    backend.standalone = True
    backend.suspend_on_stop = not options["kill_on_stop"]
    async with backend:
        info = statedir.read_backend_info(folder) or {}
        if as_json:
            emit_json(info)
        else:
            _print_up(info)
            console.print("Ctrl-C (or `gym-substrate local down`) stops it and every sandbox.")
        sys.stdout.flush()
        await stop.wait()
        if options["kill_on_stop"]:
            err.print("stopping: ending every sandbox ...")
        else:
            err.print("stopping: suspending running actors, then ending every sandbox ...")


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
@_state_dir_option
@click.option(
    "--timeout",
    type=click.FloatRange(1, 3600),
    default=180,
    show_default=True,
    help="Seconds to wait for a clean stop (running actors are suspended first) before killing "
    "the backend.",
)
@click.option(
    "--orphans",
    is_flag=True,
    help="Instead: clean up after every backend on this machine that died without "
    "stopping its sandboxes (crashed or interrupted runs, any state folder).",
)
def down(state_dir: Path | None, timeout: float, orphans: bool) -> None:
    """Stop the backend and remove every sandbox it made (also after a crash)."""
    if orphans:
        found = asyncio.run(statedir.cleanup_orphans())
        for line in found:
            console.print(f"removed leftover: {line}")
        if not found:
            console.print("no orphaned sandboxes on this machine")
        return
    folder = _resolve(state_dir)
    info = statedir.read_backend_info(folder)
    if info is not None and not info.get("standalone", False):
        raise fail(
            f"the backend on {folder} runs inside process {info['pid']} (an embedded "
            "LocalBackend), not `local up`; stop it from that program"
        )
    if info is not None:
        pid = int(info["pid"])
        with console.status(f"stopping backend pid {pid} ..."):
            daemon.stop(
                pid,
                timeout,
                on_kill=lambda: err.print(
                    f"backend pid {pid} did not stop in {timeout:.0f} s; killing it"
                ),
            )
        console.print(f"stopped the backend (pid {pid})")
    try:
        removed = asyncio.run(statedir.cleanup_state_dir(folder))
    except BackendError as exc:
        raise fail(str(exc)) from exc
    for line in removed:
        console.print(f"removed leftover: {line}")
    left = asyncio.run(statedir.state_leftovers(folder))
    if left:
        raise fail("could not remove: " + "; ".join(left))
    if info is None and not removed:
        console.print(f"no backend was running on {folder}; nothing left behind")


@local.command()
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(state_dir: Path | None, as_json: bool) -> None:
    """Show workers, actors and templates of the running backend."""
    folder = _resolve(state_dir)
    info = statedir.read_backend_info(folder)
    if info is None:
        stored = statedir.stored_status(folder)
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
        emit_json({"running": True, **data})
        return
    console.print(
        f"runtime [bold]{data['runtime']}[/], API {data['api']}, router {data['router']}, "
        f"admin {data.get('admin', '-')}, state {data['state_dir']}"
    )
    _print_status(data)


_WORKER_COLUMNS = ("worker", "status", "actor", "address", "version")
_ACTOR_COLUMNS = (
    "atespace",
    "actor",
    "template",
    Column("status", fmt=lambda status: str(status).removeprefix("STATUS_")),
    "version",
    "worker",
    "address",
)
_TEMPLATE_COLUMNS = (
    "template",
    "rootfs",
    "snapshots",
    Column("golden_snapshot", "golden snapshot", fmt=lambda path: path or "-"),
)


def _print_status(data: dict[str, Any]) -> None:
    if data["workers"]:
        console.print(table(data["workers"], _WORKER_COLUMNS, title="workers"))
    console.print(table(data["actors"], _ACTOR_COLUMNS, title=f"actors ({len(data['actors'])})"))
    console.print(table(data["templates"], _TEMPLATE_COLUMNS, title="templates"))


@local.group()
def templates() -> None:
    """Manage local ActorTemplates."""


@templates.command("add")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_state_dir_option
def templates_add(file: Path, state_dir: Path | None) -> None:
    """Register the ActorTemplate in FILE (YAML, ActorTemplate shape plus `rootfs`)."""
    try:
        template = load_template_file(file)
    except TemplateError as exc:
        raise fail(str(exc)) from exc
    folder = _resolve(state_dir)
    info = statedir.read_backend_info(folder)
    if info is None:
        _make_state_dir(folder)
        try:
            statedir.store_template(folder, template)
        except BackendError as exc:
            raise fail(str(exc)) from exc
        console.print(
            f"registered {template.key} in {folder}; its golden snapshot is taken at the next "
            "`gym-substrate local up`"
        )
        return
    # the running backend re-validates relative paths against the file's folder itself
    body = yaml.safe_dump(absolute_template_doc(file), sort_keys=False).encode()
    with console.status(f"registering {template.key} (golden snapshot) ..."):
        try:
            result = daemon.post_template(info, folder, body, str(file))
        except BackendError as exc:
            raise fail(str(exc)) from exc
    golden = result.get("golden_snapshot") or "none (this runtime boots actors cold)"
    state = "registered" if result.get("changed") else "already registered, unchanged"
    console.print(f"{result['template']}: {state}; golden snapshot: {golden}")


@local.command()
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default="auto", show_default=True)
@click.option("--sandboxes", type=click.IntRange(1, 16), default=3, show_default=True)
@_rootfs_option
def demo(runtime: str, sandboxes: int, rootfs: str) -> None:
    """Start a throwaway backend and walk sandboxes through their whole lifecycle."""
    from gym_substrate.local.tour import run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        asyncio.run(
            run_demo(
                console,
                runtime=runtime,
                sandboxes=sandboxes,
                workers=max(4, sandboxes),
                default_rootfs=rootfs,
            )
        )
    except (BackendError, RuntimeFailure) as exc:
        raise fail(str(exc)) from exc
    console.print(
        "[bold green]demo finished[/]: every sandbox was deleted and the backend stopped."
    )


@local.command()
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default="auto", show_default=True)
@click.option(
    "--iterations",
    type=click.IntRange(3, 1000),
    default=10,
    show_default=True,
    help="Actors taken through create, pause, resume, suspend, resume.",
)
@click.option(
    "--execs",
    type=click.IntRange(10, 100000),
    default=200,
    show_default=True,
    help="Exec requests timed through the router and directly.",
)
@_rootfs_option
@click.option("--json", "as_json", is_flag=True, help="Also print the figures as JSON.")
def bench(runtime: str, iterations: int, execs: int, rootfs: str, as_json: bool) -> None:
    """Time the actor lifecycle and the router on this machine (p50/p90, memory per actor)."""
    from gym_substrate.local.tour import run_bench

    logging.basicConfig(level=logging.ERROR)
    try:
        result = asyncio.run(
            run_bench(
                console,
                runtime=runtime,
                iterations=iterations,
                execs=execs,
                default_rootfs=rootfs,
            )
        )
    except (BackendError, RuntimeFailure) as exc:
        raise fail(str(exc)) from exc
    if as_json:
        emit_json(result)


# ---------------------------------------------------------------------- local rootfs ...
@local.group("rootfs")
def rootfs_group() -> None:
    """The default template's own root filesystem (a minimal Debian, built once per machine)."""


def _rootfs_dir_option(func: Any) -> Any:
    return click.option(
        "--dir",
        "base",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=f"Where built root filesystems are kept (default ${rootfs_mod.ROOTFS_DIR_ENV} or "
        "rootfs/ in the default state folder).",
    )(func)


def _rootfs_row(built: rootfs_mod.BuiltRootfs) -> dict[str, Any]:
    info = built.info
    return {
        "rootfs": built.key,
        "path": str(built.path),
        "suite": info.get("suite", ""),
        "mirror": info.get("mirror", ""),
        "packages": " ".join(info.get("packages", [])),
        "size_mb": round(int(info.get("size_bytes", 0)) / 1e6),
        "build_s": info.get("build_seconds"),
        "built_at": info.get("built_at", ""),
    }


_ROOTFS_COLUMNS = [
    Column("rootfs"),
    Column("path"),
    Column("suite"),
    Column("size_mb", "size MB", justify="right"),
    Column("build_s", "build s", justify="right"),
    Column("built_at", "built"),
    Column("mirror"),
]


@rootfs_group.command("build")
@_rootfs_dir_option
@click.option(
    "--mirror",
    default=None,
    help=f"Debian archive to debootstrap from (default ${rootfs_mod.MIRROR_ENV} or the one "
    "/etc/apt/sources.list* names).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def rootfs_build(base: Path | None, mirror: str | None, as_json: bool) -> None:
    """Build the rootfs and the agent copy it uses (nothing to do when already built)."""
    try:
        built = rootfs_mod.build_rootfs(base, mirror=mirror)
        agent = rootfs_mod.agent_binary(base)
    except rootfs_mod.RootfsError as exc:
        raise fail(str(exc)) from exc
    row = {**_rootfs_row(built), "agent": str(agent)}
    emit(
        [row],
        [*_ROOTFS_COLUMNS, Column("agent")],
        title="sandbox root filesystem",
        as_json=as_json,
        json_data=row,
    )


@rootfs_group.command("show")
@_rootfs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def rootfs_show(base: Path | None, as_json: bool) -> None:
    """Show the built rootfs, if any (exit 1 when none is built)."""
    built = rootfs_mod.find_rootfs(base)
    folder = base or rootfs_mod.default_rootfs_dir()
    if as_json:
        row = _rootfs_row(built) if built else {}
        emit_json({"built": built is not None, "dir": str(folder), **row})
    elif built is not None:
        emit([_rootfs_row(built)], _ROOTFS_COLUMNS, title="sandbox root filesystem")
    else:
        console.print(
            f"no rootfs built in {folder}; `gym-substrate local rootfs build` makes one "
            "(the backend also builds it on first use)"
        )
    if built is None:
        sys.exit(1)


@rootfs_group.command("remove")
@_rootfs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def rootfs_remove(base: Path | None, as_json: bool) -> None:
    """Remove every built rootfs and agent copy (the next backend start builds it again)."""
    try:
        removed = rootfs_mod.remove_rootfs(base)
    except (rootfs_mod.RootfsError, OSError) as exc:
        raise fail(str(exc)) from exc
    emit(
        [{"removed": path} for path in removed],
        ["removed"],
        title=f"removed ({len(removed)})",
        as_json=as_json,
        json_data={"removed": removed},
    )
