"""`gym-substrate local ...`: run, inspect and stop the local Agent Substrate.

`up` runs the backend in the foreground (Ctrl-C stops it and every sandbox) or, with
`--daemon`, re-executes itself detached and returns once the API and the router answer. Other
commands find a running backend through `<state-dir>/backend.json`, so they work from any shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from gym_substrate.local.backend import (
    BackendError,
    LocalBackend,
    cleanup_state_dir,
    default_state_dir,
    load_template_file,
    read_backend_info,
    state_leftovers,
)
from gym_substrate.local.runtimes import RUNTIME_NAMES
from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.templates import (
    DEFAULT_TEMPLATE_NAME,
    DEFAULT_TEMPLATE_NAMESPACE,
    TemplateError,
)

__all__ = ["local"]

DEFAULT_API_PORT = 47051
DEFAULT_ROUTER_PORT = 47080

console = Console()
err = Console(stderr=True)


def _state_dir_option(func: Any) -> Any:
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="State folder (default $GYM_SUBSTRATE_STATE_DIR or ~/.local/state/gym-substrate).",
    )(func)


def _resolve(state_dir: Path | None) -> Path:
    return (state_dir or default_state_dir()).expanduser().resolve()


def _make_state_dir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(
            f"cannot create the state folder {folder} ({exc.strerror or exc}); pick a writable "
            "one with --state-dir or $GYM_SUBSTRATE_STATE_DIR"
        ) from exc


def _provider_block(api: str, router: str) -> str:
    block = {
        "connection": {"api": api, "router": router, "tls": {"plaintext": True}},
        "create": {"template": f"{DEFAULT_TEMPLATE_NAMESPACE}/{DEFAULT_TEMPLATE_NAME}"},
    }
    return yaml.safe_dump(block, sort_keys=False).rstrip()


def _provider_env(api: str, router: str) -> str:
    """The same settings as the variables configs/substrate.yaml interpolates."""
    template = f"{DEFAULT_TEMPLATE_NAMESPACE}/{DEFAULT_TEMPLATE_NAME}"
    return (
        f"export SUBSTRATE_API={api} SUBSTRATE_ROUTER={router} SUBSTRATE_PLAINTEXT=true "
        f"SUBSTRATE_TEMPLATE={template}"
    )


def _print_up(info: dict[str, Any]) -> None:
    console.print(f"[bold green]local Agent Substrate is up[/] (runtime: {info['runtime']})")
    if info.get("runtime_reason"):
        console.print(f"  why this runtime: {info['runtime_reason']}")
    if info.get("runtime_warning"):
        console.print(f"  [yellow]warning:[/] {info['runtime_warning']}")
    console.print(f"  API (ateapi.Control, plaintext gRPC): {info['api']}")
    console.print(
        f"  router (Host: <actor>.<atespace>.actors.resources.substrate.ate.dev): {info['router']}"
    )
    console.print(f"  metrics: {info['router']}/metrics")
    console.print("Provider config (paste under your substrate provider):")
    console.print(_provider_block(info["api"], info["router"]), markup=False, highlight=False)
    console.print("or, with configs/substrate.yaml:")
    console.print(
        _provider_env(info["api"], info["router"]), markup=False, highlight=False, soft_wrap=True
    )


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
@click.option("--daemon", is_flag=True, help="Run in the background; return once it answers.")
@click.option("--json", "as_json", is_flag=True, help="Print the addresses as JSON.")
def up(
    workers: int,
    runtime: str,
    state_dir: Path | None,
    api_port: int,
    router_port: int,
    router_timeout: float,
    kill_on_stop: bool,
    daemon: bool,
    as_json: bool,
) -> None:
    """Start the backend (foreground unless --daemon).

    Stopping it (Ctrl-C, SIGTERM, `local down`) suspends every running actor first, so a later
    `up` resumes them where they were; --kill-on-stop skips that.
    """
    folder = _resolve(state_dir)
    running = read_backend_info(folder)
    if running is not None:
        raise click.ClickException(
            f"a backend (pid {running['pid']}) already runs on {folder} at {running['api']}; "
            f"stop it first with `gym-substrate local down --state-dir {folder}`"
        )
    _make_state_dir(folder)
    if daemon:
        _daemon(
            folder, workers, runtime, api_port, router_port, router_timeout, kill_on_stop, as_json
        )
        return
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(
            _foreground(
                folder,
                workers,
                runtime,
                api_port,
                router_port,
                router_timeout,
                kill_on_stop,
                as_json,
            )
        )
    except (BackendError, RuntimeFailure, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


async def _foreground(
    folder: Path,
    workers: int,
    runtime: str,
    api_port: int,
    router_port: int,
    router_timeout: float,
    kill_on_stop: bool,
    as_json: bool,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    backend = LocalBackend(
        folder,
        runtime=runtime,
        workers=workers,
        api_port=api_port,
        router_port=router_port,
        router_timeout_s=router_timeout,
    )
    backend.standalone = True
    backend.suspend_on_stop = not kill_on_stop
    async with backend:
        info = read_backend_info(folder) or {}
        if as_json:
            console.print_json(json.dumps(info))
        else:
            _print_up(info)
            console.print("Ctrl-C (or `gym-substrate local down`) stops it and every sandbox.")
        sys.stdout.flush()
        await stop.wait()
        if kill_on_stop:
            err.print("stopping: ending every sandbox ...")
        else:
            err.print("stopping: suspending running actors, then ending every sandbox ...")


def _daemon(
    folder: Path,
    workers: int,
    runtime: str,
    api_port: int,
    router_port: int,
    router_timeout: float,
    kill_on_stop: bool,
    as_json: bool,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "backend.log"
    argv = [
        sys.executable, "-m", "gym_substrate.local", "up",
        "--workers", str(workers), "--runtime", runtime, "--state-dir", str(folder),
        "--api-port", str(api_port), "--router-port", str(router_port),
        "--router-timeout", str(router_timeout),
    ] + (["--kill-on-stop"] if kill_on_stop else [])  # fmt: skip
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    with console.status("starting the backend (control plane, router, templates) ..."):
        while True:
            info = read_backend_info(folder)
            if info is not None and info.get("pid") == proc.pid and _answers(info):
                break
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise click.ClickException(f"the backend exited during start-up:\n{tail}")
            if time.monotonic() > deadline:
                raise click.ClickException(f"the backend did not answer in 120 s; see {log_path}")
            time.sleep(0.1)
    if as_json:
        console.print_json(json.dumps(info))
    else:
        _print_up(info)
        console.print(
            f"log: {log_path}; stop it with `gym-substrate local down --state-dir {folder}`"
        )


def _answers(info: dict[str, Any]) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{info['router']}/readyz", timeout=1) as response:
            if response.status != 200:
                return False
    except OSError:
        return False
    import grpc

    channel = grpc.insecure_channel(info["api"])
    try:
        grpc.channel_ready_future(channel).result(timeout=1)
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()
    return True


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
        from gym_substrate.local.backend import cleanup_orphans

        found = asyncio.run(cleanup_orphans())
        for line in found:
            console.print(f"removed leftover: {line}")
        if not found:
            console.print("no orphaned sandboxes on this machine")
        return
    folder = _resolve(state_dir)
    info = read_backend_info(folder)
    if info is not None and not info.get("standalone", False):
        raise click.ClickException(
            f"the backend on {folder} runs inside process {info['pid']} (an embedded "
            "LocalBackend), not `local up`; stop it from that program"
        )
    if info is not None:
        pid = int(info["pid"])
        with console.status(f"stopping backend pid {pid} ..."):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _pid_alive(pid):
                time.sleep(0.05)
            if _pid_alive(pid):
                err.print(f"backend pid {pid} did not stop in {timeout:.0f} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                while _pid_alive(pid):
                    time.sleep(0.05)
        console.print(f"stopped the backend (pid {pid})")
    try:
        removed = asyncio.run(cleanup_state_dir(folder))
    except BackendError as exc:
        raise click.ClickException(str(exc)) from exc
    for line in removed:
        console.print(f"removed leftover: {line}")
    left = asyncio.run(state_leftovers(folder))
    if left:
        raise click.ClickException("could not remove: " + "; ".join(left))
    if info is None and not removed:
        console.print(f"no backend was running on {folder}; nothing left behind")


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


@local.command()
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(state_dir: Path | None, as_json: bool) -> None:
    """Show workers, actors and templates of the running backend."""
    import urllib.request

    from gym_substrate.local.backend import stored_status

    folder = _resolve(state_dir)
    info = read_backend_info(folder)
    if info is None:
        stored = stored_status(folder)
        if as_json:
            console.print_json(
                json.dumps({"running": False, "state_dir": str(folder), **(stored or {})})
            )
            return
        if stored is None:
            raise click.ClickException(
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
        with urllib.request.urlopen(f"{info['router']}/_local/status", timeout=10) as response:
            data = json.loads(response.read())
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, a non-JSON answer
        raise click.ClickException(
            f"the backend (pid {info.get('pid')}) on {folder} did not report its status at "
            f"{info['router']}: {exc}; if it hangs, stop it with `gym-substrate local down "
            f"--state-dir {folder}`"
        ) from exc
    if as_json:
        console.print_json(json.dumps({"running": True, **data}))
        return
    console.print(
        f"runtime [bold]{data['runtime']}[/], API {data['api']}, router {data['router']}, "
        f"state {data['state_dir']}"
    )
    _print_status(data)


def _print_status(data: dict[str, Any]) -> None:
    if data["workers"]:
        workers = Table(title="workers")
        for column in ("worker", "status", "actor", "address", "version"):
            workers.add_column(column)
        for row in data["workers"]:
            workers.add_row(
                row["worker"], row["status"], row["actor"], row["address"], str(row["version"])
            )
        console.print(workers)
    actors = Table(title=f"actors ({len(data['actors'])})")
    for column in ("atespace", "actor", "template", "status", "version", "worker", "address"):
        actors.add_column(column)
    for row in data["actors"]:
        actors.add_row(
            row["atespace"], row["actor"], row["template"], row["status"].removeprefix("STATUS_"),
            str(row["version"]), row["worker"], row["address"],
        )  # fmt: skip
    console.print(actors)
    templates = Table(title="templates")
    for column in ("template", "rootfs", "snapshots", "golden snapshot"):
        templates.add_column(column)
    for row in data["templates"]:
        templates.add_row(
            row["template"], row["rootfs"], row["snapshots"], row["golden_snapshot"] or "-"
        )
    console.print(templates)


@local.group()
def templates() -> None:
    """Manage local ActorTemplates."""


@templates.command("add")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_state_dir_option
def templates_add(file: Path, state_dir: Path | None) -> None:
    """Register the ActorTemplate in FILE (YAML, ActorTemplate shape plus `rootfs`)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    try:
        template = load_template_file(file)
    except TemplateError as exc:
        raise click.ClickException(str(exc)) from exc
    folder = _resolve(state_dir)
    info = read_backend_info(folder)
    if info is None:
        from gym_substrate.local.store import Store

        _make_state_dir(folder)
        from gym_substrate.local.template_registry import template_in_use_message

        store = Store(folder / "state.db")
        try:
            stored = {t.key: t for t, _ in store.templates()}.get(template.key)
            if stored is not None and stored != template:
                users = sum(
                    1
                    for record in store.actors()
                    if f"{record.template_namespace}/{record.template_name}" == template.key
                )
                if users:
                    raise click.ClickException(template_in_use_message(stored, template, users))
            store.put_template(template)
        finally:
            store.close()
        console.print(
            f"registered {template.key} in {folder}; its golden snapshot is taken at the next "
            "`gym-substrate local up`"
        )
        return
    # the running backend re-validates relative paths against the file's folder itself
    body = yaml.safe_dump(_absolute_doc(file), sort_keys=False).encode()
    url = f"{info['router']}/_local/templates?" + urllib.parse.urlencode({"source": str(file)})
    request = urllib.request.Request(url, data=body, method="POST")
    with console.status(f"registering {template.key} (golden snapshot) ..."):
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                result = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                detail = str(json.loads(raw)["error"]["message"])
            except (ValueError, TypeError, KeyError):
                text = raw.decode(errors="replace").strip()
                detail = f"the backend answered {exc.code}: {text or exc.reason}"
            raise click.ClickException(detail) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise click.ClickException(
                f"cannot reach the backend at {info['router']} ({exc}); check `gym-substrate "
                f"local status --state-dir {folder}`"
            ) from exc
    golden = result.get("golden_snapshot") or "none (this runtime boots actors cold)"
    state = "registered" if result.get("changed") else "already registered, unchanged"
    console.print(f"{result['template']}: {state}; golden snapshot: {golden}")


def _absolute_doc(file: Path) -> Any:
    """The template document with relative rootfs/location paths made absolute."""
    doc = yaml.safe_load(file.read_text())
    base = file.parent.resolve()
    spec = doc.get("spec", {}) if isinstance(doc, dict) else {}
    snaps = spec.get("snapshotsConfig") if isinstance(spec, dict) else None
    if isinstance(snaps, dict) and isinstance(snaps.get("location"), str):
        location = snaps["location"]
        if "://" not in location and not Path(location).expanduser().is_absolute():
            snaps["location"] = str(base / location)
    rootfs = spec.get("rootfs") if isinstance(spec, dict) else None
    if (
        isinstance(rootfs, dict)
        and isinstance(rootfs.get("directory"), str)
        and not Path(rootfs["directory"]).expanduser().is_absolute()
    ):
        rootfs["directory"] = str(base / rootfs["directory"])
    return doc


@local.command()
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default="auto", show_default=True)
@click.option("--sandboxes", type=click.IntRange(1, 16), default=3, show_default=True)
def demo(runtime: str, sandboxes: int) -> None:
    """Start a throwaway backend and walk sandboxes through their whole lifecycle."""
    from gym_substrate.local.tour import run_demo

    logging.basicConfig(level=logging.ERROR)
    try:
        asyncio.run(
            run_demo(console, runtime=runtime, sandboxes=sandboxes, workers=max(4, sandboxes))
        )
    except (BackendError, RuntimeFailure) as exc:
        raise click.ClickException(str(exc)) from exc
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
@click.option("--json", "as_json", is_flag=True, help="Also print the figures as JSON.")
def bench(runtime: str, iterations: int, execs: int, as_json: bool) -> None:
    """Time the actor lifecycle and the router on this machine (p50/p90, memory per actor)."""
    from gym_substrate.local.tour import run_bench

    logging.basicConfig(level=logging.ERROR)
    result = asyncio.run(run_bench(console, runtime=runtime, iterations=iterations, execs=execs))
    if as_json:
        console.print_json(json.dumps(result))
