"""`gym-substrate sweep`: delete actors left behind, by ledger, name or state (one atespace)."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from gym_substrate.cli._output import Column, emit, fail, progress


def _states(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    from gym_substrate.tools.sweep import STATES

    if value is None:
        return None
    states = [s.strip().upper() for s in value.split(",") if s.strip()]
    unknown = [s for s in states if s not in STATES]
    if unknown or not states:
        raise click.BadParameter(
            f"unknown state(s) {', '.join(unknown) or repr(value)}; use one or more of "
            f"{', '.join(STATES)}, comma-separated"
        )
    return states


@click.command("sweep")
@click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="YAML file with a Gym `sandbox:` block whose one key is `substrate`.",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Every actor in the configured atespace, not just ledger leftovers.",
)
@click.option(
    "--name",
    "pattern",
    default=None,
    metavar="PATTERN",
    help="Actors of the atespace whose id matches this glob (e.g. 'gym-4f*').",
)
@click.option(
    "--state",
    "states",
    default=None,
    callback=_states,
    metavar="STATE[,STATE]",
    help="Actors of the atespace in these states (e.g. PAUSED,SUSPENDED).",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--yes", is_flag=True, help="Delete without asking (--all, --name, --state ask).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def sweep(
    config_file: str,
    everything: bool,
    pattern: str | None,
    states: list[str] | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete actors a provider left behind, never outside the configured atespace.

    Without a selection: ledger actors past ttl_s, orphaned, or whose close failed. With --all,
    --name or --state (which combine): the atespace's live actors that match, after a
    confirmation unless --yes.
    """
    from gym_substrate import SubstrateProvider
    from gym_substrate._errors import ConfigError, SubstrateError
    from gym_substrate._yaml import load_substrate_block
    from gym_substrate.tools.sweep import SweepResult, delete_targets, find_targets

    selecting = everything or pattern is not None or bool(states)

    async def plan(kwargs: dict[str, Any]) -> tuple[str, list[Any]]:
        async with SubstrateProvider(**kwargs) as provider:
            targets = await find_targets(
                provider, everything=everything, name=pattern, states=states
            )
            return provider.connection.atespace, targets

    async def delete(kwargs: dict[str, Any], targets: list[Any]) -> list[SweepResult]:
        async with SubstrateProvider(**kwargs) as provider:
            with progress.status("deleting") as status:
                return await delete_targets(
                    provider,
                    targets,
                    on_progress=lambda done, total: status.update(f"deleting {done}/{total}"),
                )

    try:
        kwargs = load_substrate_block(config_file)
        atespace, targets = asyncio.run(plan(kwargs))
        if dry_run or not targets:
            results = [
                SweepResult(t.actor_id, t.atespace, t.reason, False, "dry run") for t in targets
            ]
        else:
            if selecting and not yes:
                try:
                    go = click.confirm(
                        f"Delete {len(targets)} actor(s) of atespace {atespace} "
                        f"({targets[0].reason})?",
                        err=True,
                    )
                except click.Abort:
                    go = False
                if not go:
                    raise fail(
                        f"nothing deleted: {len(targets)} actor(s) matched; answer y, or pass "
                        "--yes to delete without asking (--dry-run lists them)"
                    )
            results = asyncio.run(delete(kwargs, targets))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    except SubstrateError as exc:  # e.g. ateapi unreachable while listing the atespace
        raise click.ClickException(f"sweep failed, nothing more was deleted: {exc}") from exc
    emit(
        [r.__dict__ for r in results],
        [
            Column("actor_id", "actor"),
            Column("atespace"),
            Column("reason"),
            Column("deleted", fmt=lambda v: "yes" if v else "no"),
            Column("error"),
        ],
        title=f"gym-substrate sweep ({len(results)} actor(s)){' - dry run' if dry_run else ''}",
        as_json=as_json,
    )
    if any(not r.deleted for r in results) and not dry_run:
        raise SystemExit(1)
