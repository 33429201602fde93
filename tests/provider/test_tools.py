"""`gym-substrate smoke` and `gym-substrate sweep` against the local backend (and a live stack)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gym_substrate.ateapi.eras import ERAS
from gym_substrate.cli import main
from gym_substrate.lab.tools.sweep import sweep_actors
from gym_substrate.nemo.types import SandboxSpec

from .conftest import Stack

ROOT = Path(__file__).resolve().parents[2]
STEPS = [
    "create",
    "exec",
    "exec nonzero",
    "exec timeout",
    "upload",
    "download",
    "status",
    "endpoint :80",
    "serialize/connect",
    "pause",
    "resume",
    "close",
]


def _smoke(*args: str) -> tuple[int, list[dict[str, object]]]:
    result = CliRunner().invoke(main, ["smoke", *args, "--json"], catch_exceptions=False)
    start = result.output.find("[")
    return result.exit_code, json.loads(result.output[start:]) if start >= 0 else []


@pytest.mark.parametrize("era", ERAS)
def test_smoke_command_on_the_local_backend(era: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against each API era the backend serves (issue 30): the provider reads it by reflection."""
    monkeypatch.setenv("GYM_SUBSTRATE_API_ERA", era)
    code, steps = _smoke("--config", str(ROOT / "configs" / "substrate.yaml"), "--local", "process")
    assert [s["name"] for s in steps] == STEPS
    assert all(s["ok"] for s in steps), steps
    assert code == 0


@pytest.mark.runsc
def test_smoke_command_on_the_local_backend_with_gvisor() -> None:
    code, steps = _smoke("--local", "gvisor")
    assert all(s["ok"] for s in steps), steps
    assert [s["name"] for s in steps] == STEPS
    assert code == 0


def test_smoke_exits_nonzero_and_says_why(tmp_path: Path) -> None:
    cfg = tmp_path / "dead.yaml"
    cfg.write_text(
        "sandbox:\n  substrate:\n    connection: {api: '127.0.0.1:9', router: 'http://127.0.0.1:9',"
        " tls: {plaintext: true}, request_timeout_s: 0.2,"
        " connect_timeout_s: 0.3}\n"
        "    create: {retry: {deadline: 0.3}}\n    lifecycle: {ledger: null}\n"
    )
    code, steps = _smoke("--config", str(cfg))
    assert code == 1
    assert steps[-1]["name"] == "create"
    assert not steps[-1]["ok"]
    assert "GetActorTemplate" in str(steps[-1]["detail"])  # create's first call
    bad = CliRunner().invoke(main, ["smoke", "--config", str(ROOT / "pyproject.toml")])
    assert bad.exit_code == 2
    assert "not valid YAML" in bad.output


def test_sweep_with_the_control_plane_down_says_why(tmp_path: Path) -> None:
    cfg = tmp_path / "dead.yaml"
    cfg.write_text(
        "sandbox:\n  substrate:\n    connection: {api: '127.0.0.1:9', router: 'http://127.0.0.1:9',"
        " tls: {plaintext: true}, request_timeout_s: 0.2,"
        " connect_timeout_s: 0.3}\n    lifecycle: {ledger: null}\n"
    )
    result = CliRunner().invoke(main, ["sweep", "--all", "--config", str(cfg)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "sweep failed" in result.output
    # the first call (the server's API check, then ListActors) is what could not connect
    assert ": UNAVAILABLE: " in result.output
    assert "nothing is listening on 127.0.0.1:9" in result.output  # and the key to fix


@pytest.mark.cluster
def test_smoke_against_the_live_stack() -> None:
    code, steps = _smoke("--config", os.environ["GYM_SUBSTRATE_STACK_CONFIG"])
    assert all(s["ok"] for s in steps), steps
    assert code == 0


def _rewrite_pid(ledger: Path, actor_id: str, pid: int) -> None:
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    for rec in lines:
        if rec["actor_id"] == actor_id:
            rec["pid"] = pid
    ledger.write_text("".join(json.dumps(r) + "\n" for r in lines))


async def test_sweep_deletes_expired_and_orphaned_ledger_actors(stack: Stack) -> None:
    kwargs = stack.kwargs()
    p = stack.provider()
    expired = await p.create(SandboxSpec(ttl_s=0.01))
    alive = await p.create(SandboxSpec(ttl_s=3600))
    orphan = await p.create(SandboxSpec())
    # Pretend `orphan` was made by a process that has since died.
    _rewrite_pid(Path(kwargs["lifecycle"]["ledger"]), orphan.sandbox_id, 2**22 + 12345)
    await asyncio.sleep(0.05)

    dry = await sweep_actors(kwargs, dry_run=True)
    assert {r.actor_id for r in dry} == {expired.sandbox_id, orphan.sandbox_id}
    assert len(await stack.actors()) == 3

    results = await sweep_actors(kwargs)
    assert {(r.actor_id, r.deleted) for r in results} == {
        (expired.sandbox_id, True),
        (orphan.sandbox_id, True),
    }
    assert await stack.actors() == [alive.sandbox_id]
    assert await sweep_actors(kwargs) == []  # the ledger now records them as deleted

    everything = await sweep_actors(kwargs, everything=True)
    assert [(r.actor_id, r.reason, r.deleted) for r in everything] == [
        (alive.sandbox_id, "--all", True)
    ]
    assert await stack.actors() == []
    await p.aclose()


async def _sweep_cli(config: Path, *args: str) -> tuple[int, list[dict[str, object]], str]:
    """The command as a user runs it (in a thread: it runs its own event loop)."""
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["sweep", "--config", str(config), *args, "--json"]
    )
    start = result.output.find("[")
    rows = json.loads(result.output[start:]) if start >= 0 else []
    return result.exit_code, rows, result.output


async def test_sweep_removes_left_behind_snapshots_and_refuses_one_in_use(
    stack: Stack, tmp_path: Path
) -> None:
    import grpc

    from gym_substrate import SnapshotError

    kwargs = stack.kwargs()
    config = tmp_path / "sweep.yaml"
    config.write_text(json.dumps({"sandbox": {"substrate": kwargs}}))
    p = stack.provider()
    source = await p.create(SandboxSpec())
    await p.take_snapshot(source, name="expired", ttl_s=0.01)
    await p.take_snapshot(source, name="kept", ttl_s=3600)
    in_use = await p.take_snapshot(source, name="in-use", ttl_s=0.01)
    child = await p.create(SandboxSpec(), snapshot=in_use)
    # A snapshot() that died after CreateTag landed: the tag is there, the ledger says failed.
    stack.grpc_proxy.inject("CreateTag", grpc.StatusCode.INTERNAL, "boom", after_forward=True)
    with pytest.raises(SnapshotError, match="boom"):
        await p.take_snapshot(source, name="half-made")
    await asyncio.sleep(0.05)

    def names(rows: list[Any]) -> set[tuple[str, str]]:
        return {(r.kind, r.name) for r in rows}

    assert names(await sweep_actors(kwargs, dry_run=True)) == {
        ("snapshot", "expired"),
        ("snapshot", "in-use"),
        ("snapshot", "half-made"),
    }
    results = {r.name: r for r in await sweep_actors(kwargs)}
    assert results["expired"].deleted
    assert results["half-made"].deleted
    assert not results["in-use"].deleted
    assert f"in use by live sandboxes gym/{child.sandbox_id}" in results["in-use"].error
    assert {s.name for s in await p.list_snapshots()} == {"kept", "in-use"}

    # --snapshots: every snapshot the ledger recorded, whatever its TTL; still never one in use
    code, rows, output = await _sweep_cli(config, "--snapshots", "--name", "in-*", "--yes")
    assert code == 1, output
    assert [(r["kind"], r["name"], r["deleted"]) for r in rows] == [("snapshot", "in-use", False)]
    assert child.sandbox_id in str(rows[0]["error"])
    code, rows, _ = await _sweep_cli(config, "--snapshots", "--dry-run")
    assert {r["name"] for r in rows} == {"kept", "in-use"}
    await p.close(child)
    code, rows, output = await _sweep_cli(config, "--snapshots", "--all", "--yes")
    assert code == 0, output
    assert {(r["name"], r["deleted"]) for r in rows} == {("kept", True), ("in-use", True)}
    assert await p.list_snapshots() == []
    bad = CliRunner().invoke(
        main, ["sweep", "--config", str(config), "--snapshots", "--state", "PAUSED"]
    )
    assert bad.exit_code == 2
    assert "--state selects actors" in bad.output
    await p.close(source)
    await p.aclose()
