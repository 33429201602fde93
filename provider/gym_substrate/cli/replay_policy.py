"""`gym-substrate replay-policy serve|show`: an OpenAI-compatible server of recorded rollouts."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import click

from gym_substrate.cli._experiments import run
from gym_substrate.cli._output import Column, emit, emit_json, fail, progress

_FORMATS = """\b
FILE is the JSONL Gym's rollout collection writes (output_jsonl_fpath), or a replay script, one
JSON object per line:
  {"rollout": "r1", "prompt": "Fix the bug", "turns": [
     {"think_s": 1.5, "text": "Looking.", "tool_calls": [{"name": "exec",
      "arguments": {"command": "ls"}}]}, {"text": "Done."}]}
"""


def _load(path: str) -> Any:
    from gym_substrate.lab.experiments import ExperimentError
    from gym_substrate.lab.experiments.rollouts import load_rollouts

    try:
        return load_rollouts(path)
    except ExperimentError as exc:
        raise fail(str(exc)) from exc


def _think(ctx: click.Context, param: click.Parameter, value: str) -> Any:
    from gym_substrate.lab.experiments import ThinkSpec

    try:
        return ThinkSpec.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.group("replay-policy")
def replay_policy() -> None:
    """A model stand-in: answer each request with the recorded turn of a recorded rollout."""


@replay_policy.command("show", epilog=_FORMATS)
@click.option("--rollouts", "path", required=True, metavar="FILE", help="Rollouts JSONL.")
@click.option("--json", "as_json", is_flag=True, help="Print the rollouts as JSON.")
def show(path: str, as_json: bool) -> None:
    """Check a rollouts file and list what it would replay."""
    store = _load(path)
    rows = [
        {
            "rollout": r.rollout_id,
            "model": r.model,
            "turns": len(r.turns),
            "tool_calls": sum(len(t.tool_calls) for t in r.turns),
            "recorded_latency_s": sum(t.latency_s or 0 for t in r.turns)
            if all(t.latency_s is not None for t in r.turns)
            else None,
            "first_user_message": r.key[:60],
            "source": r.source,
        }
        for r in store.rollouts
    ]
    emit(
        rows,
        [
            Column("rollout"),
            Column("model"),
            Column("turns", justify="right"),
            Column("tool_calls", "tool calls", justify="right"),
            Column("recorded_latency_s", "recorded latency, s", justify="right"),
            Column("first_user_message", "first user message"),
        ],
        title=f"{path}: {len(rows)} rollout(s)",
        as_json=as_json,
    )


@replay_policy.command("serve", epilog=_FORMATS)
@click.option("--rollouts", "path", required=True, metavar="FILE", help="Rollouts JSONL.")
@click.option(
    "--think-s",
    "think",
    default="0",
    show_default=True,
    callback=_think,
    metavar="SPEC",
    help="Think time per turn: seconds (2), a range (1-3), or recorded[:FALLBACK_S].",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port (0: any free).")
@click.option("--seed", type=int, default=0, show_default=True, help="Think-time seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics at exit as JSON.")
def serve(path: str, think: Any, host: str, port: int, seed: int, as_json: bool) -> None:
    """Serve the Responses API and Chat Completions from recorded rollouts until Ctrl-C.

    Base URL for clients: http://HOST:PORT/v1 (any API key). Prints statistics at exit.
    """
    from aiohttp import web

    from gym_substrate.lab.experiments.replay import REPLAYER, create_app

    if not 0 <= port <= 65535:
        raise click.BadParameter(f"must be 0..65535, got {port}", param_hint="--port")
    store = _load(path)

    async def main() -> dict[str, Any]:
        app = create_app(store, think, seed=seed)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            try:
                await web.TCPSite(runner, host, port).start()
            except OSError as exc:
                from gym_substrate.lab.experiments import ExperimentError

                raise ExperimentError(
                    f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port"
                ) from exc
            bound = runner.addresses[0][1]
            turns = sum(len(r.turns) for r in store.rollouts)
            progress.print(
                f"replay-policy: serving {len(store.rollouts)} rollout(s), {turns} turn(s), "
                f"model(s) {', '.join(store.models)}, think {think} s, on "
                f"http://{host}:{bound}/v1 (Ctrl-C stops)",
                highlight=False,
                soft_wrap=True,
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            stats: dict[str, Any] = app[REPLAYER].stats()
            return stats
        finally:
            await runner.cleanup()

    stats = run(main())
    if as_json:
        emit_json(stats)
        return
    rows = [
        {"figure": key.replace("_", " "), "value": value}
        for key, value in stats.items()
        if key != "served_by_rollout"
    ]
    emit(rows, [Column("figure"), Column("value", justify="right")], title="replay-policy")
