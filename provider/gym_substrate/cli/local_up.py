"""`gym-substrate local up`: run the local backend, in the foreground or as a daemon.

The command parses its flags into one `UpRequest`: the state folder, the backend's options
checked by the backend's own rules (`check_options`, from the rows of
`gym_substrate.local.option_table`, which also make the flags) and how to run it. `LocalBackend`
then runs in this process, or `daemon.spawn` re-executes `local up` detached with the same
options as flags (`option_table.command_line`). This module only parses, prints and waits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from gym_substrate.cli._local_common import (
    backend_options,
    make_state_dir,
    prepare_rootfs,
    resolve,
    state_dir_option,
)
from gym_substrate.cli._output import console, emit_json, fail
from gym_substrate.local import daemon, statedir
from gym_substrate.local.backend import LocalBackend
from gym_substrate.local.backend_options import (
    BackendOptions,
    check_options,
    default_actors_per_worker,
    keywords,
)
from gym_substrate.local.client_config import (
    API_SERVER_NAME,
    provider_config,
    provider_config_env,
    provider_config_yaml,
)
from gym_substrate.local.errors import BackendError
from gym_substrate.local.option_table import from_command_line
from gym_substrate.local.runtimes.base import RuntimeFailure

__all__ = ["UpRequest", "capacity_line", "up"]

err = Console(stderr=True)


@dataclass(frozen=True)
class UpRequest:
    """What `local up` was asked: the state folder, the backend's checked options, and
    whether to detach (`--daemon`) and print JSON."""

    folder: Path
    options: BackendOptions
    daemon: bool
    as_json: bool

    @classmethod
    def parse(
        cls, state_dir: Path | None, flags: dict[str, Any], *, daemon: bool, as_json: bool
    ) -> UpRequest:
        """The flags (by option name) checked as `LocalBackend` checks them; a refusal is one
        line and exit 1."""
        if flags["auth"] == "jwt" and not flags["tls"]:
            raise fail(
                "--auth jwt needs --tls: ateapi serves only TLS, and a bearer token must not "
                "cross a plaintext connection"
            )
        workers = flags["workers"]
        per_worker = flags["actors_per_worker"] or default_actors_per_worker(workers)
        if workers * per_worker > 250:
            raise fail(
                f"--workers {workers} x --actors-per-worker {per_worker} is "
                f"{workers * per_worker} actors; the local backend runs at most 250 at once: "
                "lower one of them"
            )
        try:
            options = check_options(**from_command_line(flags))
        except ValueError as exc:
            raise fail(str(exc)) from None
        return cls(resolve(state_dir), options, daemon, as_json)


@click.command()
@state_dir_option
@backend_options
@click.option("--daemon", is_flag=True, help="Run in the background; return once it answers.")
@click.option("--json", "as_json", is_flag=True, help="Print the addresses as JSON.")
def up(state_dir: Path | None, daemon: bool, as_json: bool, **flags: Any) -> None:
    """Start the backend (foreground unless --daemon).

    Stopping it (Ctrl-C, SIGTERM, `local down`) ends every sandbox; its running actors show
    CRASHED (`worker pod went away while hosting the actor`) and RevertActor takes them back to
    their last suspend, unless --suspend-on-stop (or `local down --suspend`) suspends them first.
    """
    start(UpRequest.parse(state_dir, flags, daemon=daemon, as_json=as_json))


def start(request: UpRequest) -> None:
    """Refuse a folder another backend serves, say what the options mean, then run it."""
    folder, options = request.folder, request.options
    running = statedir.read_backend_info(folder)
    if running is not None:
        raise fail(
            f"a backend (pid {running['pid']}) already runs on {folder} at {running['api']}; "
            f"stop it first with `gym-substrate local down --state-dir {folder}`"
        )
    make_state_dir(folder)
    if not request.as_json:
        _print_notes(options)
    if request.daemon:
        if options.default_rootfs == "debian":  # a first build takes minutes: here, not detached
            prepare_rootfs(options.runtime)
        _up_detached(request)
        return
    logging.basicConfig(
        level=_log_level(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(_foreground(request))
    except (BackendError, RuntimeFailure, ValueError) as exc:
        raise fail(str(exc)) from exc


def _print_notes(options: BackendOptions) -> None:
    """The limits `local up` chose for what was not given: actor disk, frozen memory, pool."""
    from gym_substrate.local.runtimes.actor_disk import describe

    err.print(describe(options.actor_disk))
    if options.pause_tier == "freeze":
        frozen = (options.frozen_memory or 0) / 2**20
        err.print(
            f"pause tier (gVisor runtime): freeze; up to {frozen:.0f} MiB of paused actors "
            "stay frozen in memory (--frozen-memory), past it they are checkpointed"
        )
    if options.runtime != "process":
        pool = options.warm_pool
        said = f"{pool} frozen golden sandbox(es) per template" if pool else "off"
        err.print(f"warm pool (gVisor runtime, --warm-pool): {said}, within --frozen-memory")


async def _foreground(request: UpRequest) -> None:
    folder, as_json = request.folder, request.as_json
    backend = LocalBackend(folder, **keywords(request.options))
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


def _up_detached(request: UpRequest) -> None:
    folder, as_json = request.folder, request.as_json
    proc = daemon.spawn(folder, request.options)
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


def _print_up(info: dict[str, Any]) -> None:
    console.print(f"[bold green]local Agent Substrate is up[/] (runtime: {info['runtime']})")
    if info.get("runtime_reason"):
        console.print(f"  why this runtime: {info['runtime_reason']}")
    if info.get("runtime_warning"):
        console.print(f"  [yellow]warning:[/] {info['runtime_warning']}")
    console.print(f"  capacity: {capacity_line(info)}", highlight=False)
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


def _log_level() -> int:
    """INFO, or `GYM_SUBSTRATE_LOG_LEVEL` (DEBUG shows every start, thaw and eviction)."""
    name = os.environ.get("GYM_SUBSTRATE_LOG_LEVEL", "INFO").upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise fail(
            f"GYM_SUBSTRATE_LOG_LEVEL={name!r} is no log level: use DEBUG, INFO, WARNING or ERROR"
        )
    return level


def capacity_line(info: dict[str, Any]) -> str:
    """ "W workers x K actors (N running at once)" of a `backend.json`."""
    workers, per = int(info.get("workers", 0)), int(info.get("actors_per_worker", 0))
    worker_s, actor_s = (
        ("worker" if workers == 1 else "workers"),
        ("actor" if per == 1 else "actors"),
    )
    return f"{workers} {worker_s} x {per} {actor_s} ({workers * per} running at once)"
