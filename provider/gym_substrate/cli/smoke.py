"""`gym-substrate smoke`: one sandbox through every provider method, timed, against any stack."""

from __future__ import annotations

import asyncio

import click

from gym_substrate.cli._output import Column, emit, progress

_COLUMNS = [
    Column("name", header="step"),
    Column("seconds", fmt=lambda s: f"{s:.3f}", justify="right"),
    Column("ok", header="result", fmt=lambda ok: "ok" if ok else "FAILED"),
    Column("detail"),
]


@click.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML file with a Gym `sandbox:` block whose one key is `substrate`.",
)
@click.option(
    "--local",
    "local_runtime",
    type=click.Choice(["process", "gvisor", "auto"]),
    default=None,
    help="Start a local backend with this runtime and use it.",
)
@click.option("--template", default=None, help="ActorTemplate namespace/name to create from.")
@click.option("--json", "as_json", is_flag=True, help="Print the steps as JSON.")
def smoke(
    config_file: str | None, local_runtime: str | None, template: str | None, as_json: bool
) -> None:
    """Take one sandbox through every provider method and print how long each step took."""
    from gym_substrate.lab.tools.smoke import SmokeStep, run_smoke
    from gym_substrate.local.backend import local_provider_kwargs
    from gym_substrate.nemo.config_file import load_substrate_block
    from gym_substrate.nemo.errors import ConfigError

    if config_file is None and local_runtime is None:
        raise click.UsageError("give --config FILE, --local RUNTIME, or both")
    try:
        base = load_substrate_block(config_file) if config_file else {}
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc

    async def main() -> list[SmokeStep]:
        if local_runtime is None:
            return await run_smoke(base, template=template)
        async with local_provider_kwargs(base, runtime=local_runtime) as (kwargs, _backend):
            return await run_smoke(kwargs, template=template)

    try:
        with progress.status("running the smoke test"):
            steps = asyncio.run(main())
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    emit([s.__dict__ for s in steps], _COLUMNS, title="gym-substrate smoke", as_json=as_json)
    if not steps or not all(s.ok for s in steps):
        raise SystemExit(1)
