"""`gym-substrate local ...`: run, inspect and stop the local Agent Substrate.

`up` runs the backend in the foreground (Ctrl-C stops it and every sandbox) or, with
`--daemon`, re-executes itself detached and returns once the API and the router answer. Other
commands find a running backend through `<state-dir>/backend.json`, so they work from any shell.
The work is done by `gym_substrate.local` (`LocalBackend`, `statedir`, `daemon`); this module
parses options and prints. `up` (`local_up.py`), `templates`/`images` and `rootfs` live in
their own modules.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from gym_substrate.cli._local_common import resolve, state_dir_option
from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, console, emit_json, fail, table
from gym_substrate.cli.local_bench import bench, demo
from gym_substrate.cli.local_rootfs import rootfs_group
from gym_substrate.cli.local_templates import images, templates
from gym_substrate.cli.local_up import capacity_line, up
from gym_substrate.local import daemon, settle, statedir
from gym_substrate.local.errors import BackendError
from gym_substrate.local.runtimes.base import RuntimeFailure

__all__ = ["local"]

err = Console(stderr=True)


@click.group()
def local() -> None:
    """Run Agent Substrate on this machine: ateapi control plane, router, sandboxes."""


local.add_command(templates)
local.add_command(images)
local.add_command(rootfs_group)
local.add_command(demo)
local.add_command(bench)
local.add_command(up)


_DOWN_OPTIONS = options(
    state_dir_option,
    click.option(
        "--timeout",
        type=click.FloatRange(1, 3600),
        default=180,
        show_default=True,
        help="Seconds to wait for a clean stop before killing the backend.",
    ),
    click.option(
        "--suspend",
        is_flag=True,
        help="Suspend running actors before stopping (else they show CRASHED: their workers went "
        "away; RevertActor takes them back to their last suspend).",
    ),
    click.option(
        "--purge",
        is_flag=True,
        help="Then remove the state folder's contents (actors, templates, tags, snapshots, images, "
        "credentials; the shared rootfs build stays): also for a folder of an older backend.",
    ),
    click.option(
        "--orphans",
        is_flag=True,
        help="Instead: clean up after every backend on this machine that died without "
        "stopping its sandboxes (crashed or interrupted runs, any state folder).",
    ),
    click.option(
        "--discard",
        is_flag=True,
        help="After a crash, remove the sandboxes the dead backend left running without adopting "
        "them first: their actors' state since their last snapshot is dropped (they show CRASHED).",
    ),
)


@local.command()
@_DOWN_OPTIONS
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
        f"runtime [bold]{data['runtime']}[/], {capacity_line(info)}, API {data['api']} (ateapi era "
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
