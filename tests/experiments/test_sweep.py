"""`sweep --name/--state`, --dry-run and the confirmation, never outside the atespace."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gym_substrate import SubstrateProvider
from gym_substrate.nemo.config_file import load_substrate_block
from gym_substrate.nemo.types import SandboxSpec

from .helpers import invoke, invoke_json


async def _actors(kwargs: dict[str, Any], other: str) -> dict[str, str]:
    """PAUSED, RUNNING and SUSPENDED actors in the config's atespace, one SUSPENDED in `other`.

    At most one holds a worker, so deleting the paused one (resumed first) finds a free one.
    """
    made = {}
    for name, mode, options in (
        ("elsewhere", "suspend", {"atespace": other}),
        ("paused", "pause", {}),
        ("b", "suspend", {}),
        ("a", None, {}),
    ):
        async with SubstrateProvider(**kwargs, pause_mode=mode or "pause") as provider:
            handle = await provider.create(SandboxSpec(provider_options=options))
            made[name] = handle.sandbox_id
            if mode is not None:
                await provider.pause(handle)
    return made


async def _live(kwargs: dict[str, Any], atespace: str) -> set[str]:
    async with SubstrateProvider(**kwargs) as provider:
        return {a.metadata.name for a in await provider.control.list_actors(atespace)}


def test_sweep_by_state_and_name_with_confirmation(config: Path) -> None:
    kwargs = load_substrate_block(config)
    space = kwargs["connection"]["atespace"]
    other = f"{space}-other"
    made = asyncio.run(_actors(kwargs, other))
    args = ["sweep", "--config", str(config)]

    code, dry = invoke_json(*args, "--state", "PAUSED", "--dry-run")
    assert code == 0
    assert [r["actor_id"] for r in dry] == [made["paused"]]
    refused = invoke(*args, "--name", "gym-*", input="n\n")
    assert refused.exit_code == 1
    assert "nothing deleted: 3 actor(s) matched" in refused.output
    assert len(asyncio.run(_live(kwargs, space))) == 3

    code, deleted = invoke_json(*args, "--state", "paused,suspended", "--yes")
    assert code == 0
    assert {(r["actor_id"], r["deleted"]) for r in deleted} == {
        (made["paused"], True),
        (made["b"], True),
    }
    assert asyncio.run(_live(kwargs, space)) == {made["a"]}
    confirmed = invoke(*args, "--all", input="y\n")
    assert confirmed.exit_code == 0, confirmed.output
    assert asyncio.run(_live(kwargs, space)) == set()
    assert asyncio.run(_live(kwargs, other)) == {made["elsewhere"]}  # never outside
    code, _ = invoke_json(*args, "--name", made["elsewhere"], "--yes")
    assert asyncio.run(_live(kwargs, other)) == {made["elsewhere"]}
    kwargs["connection"]["atespace"] = other
    code, _ = invoke_json("sweep", "--config", str(_config_for(config, other)), "--all", "--yes")
    assert code == 0
    assert asyncio.run(_live(kwargs, other)) == set()


def _config_for(config: Path, atespace: str) -> Path:
    text = config.read_text()
    path = config.with_name("other.yaml")
    kwargs = load_substrate_block(config)
    path.write_text(
        text.replace(f"atespace: {kwargs['connection']['atespace']}", f"atespace: {atespace}")
    )
    return path
