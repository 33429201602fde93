"""`gym-substrate sweep`: delete actors and snapshots left behind, by ledger, name or state
(one atespace)."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from gym_substrate.cli._output import Column, emit, fail, progress


def _states(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    from gym_substrate.lab.tools.sweep import STATES

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


def _row(result: Any) -> dict[str, Any]:
    row = dict(result.__dict__)
    if result.kind == "actor":
        row["actor_id"] = result.name  # the key scripts read before snapshots were swept too
    return row


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
    help="Actors of the atespace whose id matches this glob (e.g. 'gym-4f*'); with "
    "--snapshots, snapshots whose tag or given name matches (e.g. 'ng-*').",
)
@click.option(
    "--state",
    "states",
    default=None,
    callback=_states,
    metavar="STATE[,STATE]",
    help="Actors of the atespace in these states (e.g. PAUSED,SUSPENDED).",
)
@click.option(
    "--snapshots",
    is_flag=True,
    help="Snapshots (tags) instead of actors: every one the ledger recorded, or with --all or "
    "--name the atespace's. One that live sandboxes still borrow is refused.",
)
@click.option(
    "--checkpoints",
    is_flag=True,
    help="With --snapshots (or --all): also the snapshots NeMo Gym's session checkpointer took "
    "through snapshot(), which are otherwise left to it (--name matching one deletes it too).",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--yes", is_flag=True, help="Delete without asking (--all, --name, --state ask).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def sweep(
    config_file: str,
    everything: bool,
    pattern: str | None,
    states: list[str] | None,
    snapshots: bool,
    checkpoints: bool,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete actors and snapshots a provider left behind, never outside the configured atespace.

    Without a selection: ledger actors past ttl_s, orphaned, or whose close failed, then ledger
    snapshots past ttl_s or whose snapshot() failed. With --all, --name or --state (which
    combine): the atespace's live actors that match, after a confirmation unless --yes. With
    --snapshots: snapshots only (the ledger's, or with --all/--name the atespace's; --name
    matches the tag or the name snapshot() was given). Snapshots NeMo Gym's checkpointer took
    are its own: only --checkpoints, a matching --name or a configured snapshot_ttl_s deletes
    them. A snapshot that live sandboxes were made from and have not suspended away from is
    never deleted: it is reported, naming them.
    """
    if snapshots and states:
        raise click.UsageError("--state selects actors; it cannot be combined with --snapshots")
    from gym_substrate import SubstrateProvider
    from gym_substrate.lab.tools.sweep import SweepResult, delete_targets, find_targets
    from gym_substrate.nemo.config_file import load_substrate_block
    from gym_substrate.nemo.errors import ConfigError, ConnectionConfigError, SubstrateError

    selecting = everything or pattern is not None or bool(states) or snapshots
    what = "snapshot(s)" if snapshots else "actor(s)"

    async def plan(kwargs: dict[str, Any]) -> tuple[str, list[Any]]:
        async with SubstrateProvider(**kwargs) as provider:
            targets = await find_targets(
                provider,
                everything=everything,
                name=pattern,
                states=states,
                snapshots=snapshots,
                checkpoints=checkpoints,
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
            results = [t.skipped("dry run") for t in targets]
        else:
            if selecting and not yes:
                try:
                    go = click.confirm(
                        f"Delete {len(targets)} {what} of atespace {atespace} "
                        f"({targets[0].reason})?",
                        err=True,
                    )
                except click.Abort:
                    go = False
                if not go:
                    raise fail(
                        f"nothing deleted: {len(targets)} {what} matched; answer y, or pass "
                        "--yes to delete without asking (--dry-run lists them)"
                    )
            results = asyncio.run(delete(kwargs, targets))
    except ConnectionConfigError as exc:  # nothing (or the wrong thing) at an address
        raise click.ClickException(f"sweep failed, nothing more was deleted: {exc}") from exc
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    except ValueError as exc:  # e.g. a sweep of the golden atespace's snapshots
        raise click.UsageError(str(exc)) from exc
    except SubstrateError as exc:  # e.g. ateapi unreachable while listing the atespace
        raise click.ClickException(f"sweep failed, nothing more was deleted: {exc}") from exc
    emit(
        [_row(r) for r in results],
        [
            Column("kind"),
            Column("name"),
            Column("atespace"),
            Column("reason"),
            Column("deleted", fmt=lambda v: "yes" if v else "no"),
            Column("error"),
        ],
        title=f"gym-substrate sweep ({len(results)} found){' - dry run' if dry_run else ''}",
        as_json=as_json,
    )
    if any(not r.deleted for r in results) and not dry_run:
        raise SystemExit(1)
