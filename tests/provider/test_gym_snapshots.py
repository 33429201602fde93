"""NeMo Gym's snapshot capability (after 0.7.0) against the in-memory fakes, call by call.

`snapshot()` returns the id as a `str`; any name works (Gym's are `ng-<session id>-<time>`);
`create()` restores from `provider_options["snapshot_id"]` with `image=None`, `files={}`;
`delete_snapshot()` of an id already gone is quiet; a checkpoint has no TTL and sweep leaves it
unless told; Gym's create-retry counter is fed when Gym is there. The same protocol end to end on
a local backend is test_checkpoint_protocol.py.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import grpc
import pytest

from gym_substrate import SnapshotError, SnapshotInUseError, SubstrateCreateError
from gym_substrate.lab.tools.sweep import find_targets
from gym_substrate.nemo.snapshot import SupportsSandboxSnapshot, tag_name
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .checkpointer import Checkpointer
from .fakes import FakeAgents, FakeControl, _error

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}
GYM_NAME = "ng-Sess_01:ÄB/x y-1765000000"


def _provider(control: FakeControl, tmp_path: Path, **lifecycle: Any) -> Any:
    from gym_substrate import SubstrateProvider

    return SubstrateProvider(
        connection=CONN,
        control=control,
        http=FakeAgents(control),
        create={"retry": {"initial": 0.001, "maximum": 0.01, "deadline": 5}},
        lifecycle={"ledger": str(tmp_path / "ledger.jsonl"), **lifecycle},
    )


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if '"tag"' in line]


def test_a_name_that_is_not_a_label_gets_a_stable_tag_of_its_own() -> None:
    tag = tag_name(GYM_NAME, "gym-1")
    assert tag == tag_name(GYM_NAME, "gym-2")  # stable: the name alone says
    assert tag.startswith("ng-sess-01-b-x-y-1765000000-")
    assert len(tag) <= 63
    assert tag_name("ng-Sess_01:ÄB/x_y-1765000000", "gym-1") != tag  # reads alike, differs
    assert tag_name("a-label", "gym-1") == "a-label"  # a DNS label is kept as it is
    assert len(tag_name("X" * 500, "gym-1")) <= 63
    assert tag_name("___", "gym-1").startswith("s-")
    with pytest.raises(ValueError, match="non-empty string"):
        tag_name("", "gym-1")


async def test_snapshot_returns_the_id_as_a_string_for_any_name(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path, ttl_s=7200) as p:
        handle = await p.create(SandboxSpec())
        snapshot_id = await p.snapshot(handle, name=GYM_NAME)
        assert type(snapshot_id) is str
        assert snapshot_id == f"gym/{tag_name(GYM_NAME, handle.sandbox_id)}"
        with pytest.raises(SnapshotError, match=f"a snapshot named {GYM_NAME!r} .* exists"):
            await p.snapshot(handle, name=GYM_NAME)  # the same name again: refused, kept
        listed = {s.ref: s.label for s in await p.list_snapshots()}
        assert listed == {snapshot_id: GYM_NAME}
        info = await p.describe_snapshot(snapshot_id)
        assert (info.ref, info.label, info.source, info.borrowers) == (
            snapshot_id,
            GYM_NAME,
            handle.sandbox_id,
            (),
        )
        assert (info.template, info.fidelity) == ("default/sandbox", "MEMORY")
        taken = _ledger(tmp_path)[0]
        # a checkpoint: no TTL (not the actors' ttl_s), its caller's name kept
        assert (taken["ttl_s"], taken["label"], taken["checkpoint"]) == (None, GYM_NAME, True)
        plain = await p.snapshot(handle)
        assert plain.startswith(f"gym/{handle.sandbox_id[:50]}-")
        await p.close(handle)


async def test_labels_come_back_from_the_ledger_in_another_provider(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        snapshot_id = await p.snapshot(handle, name=GYM_NAME)
        await p.close(handle)
    async with _provider(control, tmp_path) as again:
        assert [s.label for s in await again.list_snapshots()] == [GYM_NAME]
        assert (await again.describe_snapshot(snapshot_id)).label == GYM_NAME
        await again.delete_snapshot(snapshot_id)
        with pytest.raises(SnapshotError, match="does not exist"):
            await again.describe_snapshot(snapshot_id)


async def test_snapshot_ttl_is_the_configured_one(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path, ttl_s=7200, snapshot_ttl_s=600) as p:
        handle = await p.create(SandboxSpec())
        await p.snapshot(handle, name="a")
        await p.take_snapshot(handle, name="b", ttl_s=5)
        assert [e["ttl_s"] for e in _ledger(tmp_path)] == [600, 5]
        await p.close(handle)


async def test_create_restores_from_snapshot_id_with_the_specs_env_and_workdir(
    tmp_path: Path,
) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        spec = SandboxSpec(image=None, workdir="/work", env={"A": "1"})
        source = await p.create(spec)
        snapshot_id = await p.snapshot(source, name=GYM_NAME)
        restored = await p.create(
            SandboxSpec(
                image=None,
                files={},
                workdir="/work",
                env={"A": "1"},
                provider_options={"snapshot_id": snapshot_id},
            )
        )
        assert restored.raw.snapshot == snapshot_id
        assert (restored.raw.workdir, dict(restored.raw.env)) == ("/work", {"A": "1"})
        assert control.actors[("gym", restored.sandbox_id)].source_tag == snapshot_id
        both = {"snapshot_id": snapshot_id, "from_snapshot": snapshot_id}
        twice = await p.create(SandboxSpec(provider_options=both))  # the same one: fine
        with pytest.raises(SubstrateCreateError, match="name different snapshots"):
            await p.create(SandboxSpec(provider_options={**both, "from_snapshot": "gym/other"}))
        with pytest.raises(SubstrateCreateError, match="provider_options.snapshot_id"):
            await p.create(SandboxSpec(provider_options={"snapshot_id": "not a ref"}))
        for h in (source, restored, twice):
            await p.close(h)


async def test_delete_snapshot_is_quiet_for_an_id_already_gone(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec())
        snapshot_id = await p.snapshot(source, name=GYM_NAME)
        child = await p.create(SandboxSpec(provider_options={"snapshot_id": snapshot_id}))
        with pytest.raises(SnapshotInUseError):
            await p.delete_snapshot(snapshot_id)  # a live sandbox still runs on it
        assert (await p.describe_snapshot(snapshot_id)).borrowers == (f"gym/{child.sandbox_id}",)
        await p.close(child)  # Gym's "stop and forget": the sandbox first ...
        await p.delete_snapshot(snapshot_id)  # ... then its snapshot
        await p.delete_snapshot(snapshot_id)  # gone already: quiet
        assert await p.list_snapshots() == []
        await p.close(source)


async def test_the_protocol_model_restores_all_or_nothing_on_fakes(tmp_path: Path) -> None:
    control = FakeControl(workers=4)
    async with _provider(control, tmp_path, idle_policy="pause", idle_after_s=0.05) as p:
        ckpt = Checkpointer(p, parallelism=16)
        ids = [f"Sess_{i}:{'x' * 20}" for i in range(6)]
        for session_id in ids:
            await ckpt.create(session_id, SandboxSpec(env={"S": session_id}))
        states = await ckpt.export(ids)
        assert all(type(s.snapshot_id) is str for s in states.values())
        await ckpt.park(ids)
        originals = set(control.actors)
        real = control.create_actor
        calls = 0

        async def third_fails(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise _error("CreateActor", grpc.StatusCode.PERMISSION_DENIED, "denied")
            return await real(*args, **kwargs)

        control.create_actor = third_fails  # type: ignore[method-assign]
        with pytest.raises(Exception, match="could not be re-created"):
            await ckpt.restore(states)
        assert set(control.actors) == originals  # nothing the failed restore made stays
        control.create_actor = real  # type: ignore[method-assign]
        await ckpt.restore(states)
        assert not originals & set(control.actors)  # the superseded ones were stopped
        for session_id in ids:
            await ckpt.stop(session_id, states[session_id].snapshot_id)
        assert (control.actors, control.tags) == ({}, {})


async def test_sweep_leaves_a_checkpoint_alone_unless_told(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        checkpoint = await p.snapshot(handle, name=GYM_NAME)
        await p.take_snapshot(handle, name="plain")

        async def found(**how: Any) -> set[str]:
            return {t.name for t in await find_targets(p, **how)}

        tag = checkpoint.partition("/")[2]
        assert await found() == set()  # ledger sweep: no TTL, nothing failed
        assert await found(snapshots=True) == {"plain"}
        assert await found(snapshots=True, everything=True) == {"plain"}
        assert await found(snapshots=True, checkpoints=True) == {"plain", tag}
        assert await found(snapshots=True, everything=True, checkpoints=True) == {"plain", tag}
        assert await found(snapshots=True, name="ng-Sess_01:*") == {tag}  # by the given name
        assert await found(snapshots=True, name=tag) == {tag}  # or by the tag's
        await p.close(handle)


def test_the_capability_says_a_pause_is_not_a_checkpoint() -> None:
    from gym_substrate import SubstrateProvider

    provider = SubstrateProvider(connection=CONN)
    assert isinstance(provider, SupportsSandboxSnapshot)
    caps = provider.snapshot_capabilities()
    assert caps.pause_is_checkpoint is False
    assert caps.restore_option == "snapshot_id"
    assert "never a checkpoint" in caps.paused_means
    assert "idle policy" in caps.paused_means
    assert "never a checkpoint" in (type(provider).status.__doc__ or "")
    assert SandboxStatus.PAUSED  # the status the rule is about exists in this Gym


def _fake_gym(monkeypatch: pytest.MonkeyPatch, *, enabled: bool) -> list[dict[str, Any]]:
    """Gym 0.7.0's telemetry modules as the provider reaches them, recording the calls."""
    recorded: list[dict[str, Any]] = []
    metrics = types.ModuleType("nemo_gym.telemetry.gym_metrics")
    metrics.record_sandbox_create_retry = lambda **kw: recorded.append(kw)  # type: ignore[attr-defined]
    fallbacks = types.ModuleType("nemo_gym.telemetry._fallbacks")
    fallbacks.is_span_group_enabled = lambda group: enabled and group == "sandbox"  # type: ignore[attr-defined]
    groups = types.ModuleType("nemo_gym.telemetry.span_groups")
    groups.GymSpanGroup = type("GymSpanGroup", (), {"SANDBOX": "sandbox"})  # type: ignore[attr-defined]
    for module in (metrics, fallbacks, groups):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return recorded


@pytest.mark.parametrize("enabled", [True, False])
async def test_create_retries_reach_gyms_telemetry_when_gym_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    recorded = _fake_gym(monkeypatch, enabled=enabled)
    control = FakeControl()
    control.fail("CreateActor", grpc.StatusCode.UNAVAILABLE, times=2)
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        assert recorded == ([{"provider": "substrate"}] * 2 if enabled else [])
        await p.close(handle)


async def test_without_gym_a_retried_create_reports_nowhere(tmp_path: Path) -> None:
    from gym_substrate.nemo import _gym_telemetry

    assert "nemo_gym" not in sys.modules  # this venv has no Gym
    _gym_telemetry.create_retried()  # nothing to report to, and no error
    control = FakeControl()
    control.fail("CreateActor", grpc.StatusCode.UNAVAILABLE)
    async with _provider(control, tmp_path) as p:
        await p.close(await p.create(SandboxSpec()))
