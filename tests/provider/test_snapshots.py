"""Snapshots and forks against the in-memory fakes: what a caller sees, call by call.

The fakes keep ateapi's tag rules (CreateTag only from SUSPENDED; CreateActor(source_tag) checks
the tag's existence, scope, completion and template, in upstream's order and words; an actor made
from a tag borrows its snapshot until its first suspend). The end-to-end behaviour (files,
processes and memory in the children) is in test_forks_local.py.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path
from typing import Any

import grpc
import pytest

from gym_substrate import (
    ActorCrashedError,
    SandboxSnapshot,
    SnapshotBusyError,
    SnapshotError,
    SnapshotInUseError,
    SubstrateCreateError,
    SubstrateProvider,
    SupportsSandboxFork,
    SupportsSandboxSnapshot,
)
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .fakes import PAUSED, RUNNING, SUSPENDED, FakeAgents, FakeControl, _error

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}


def _provider(control: FakeControl, tmp_path: Path, **sections: Any) -> SubstrateProvider:
    sections.setdefault("create", {"retry": {"initial": 0.001, "maximum": 0.01, "deadline": 5}})
    sections.setdefault("lifecycle", {"ledger": str(tmp_path / "ledger.jsonl")})
    return SubstrateProvider(connection=CONN, control=control, http=FakeAgents(control), **sections)


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def test_snapshot_suspends_tags_and_the_source_resumes_on_its_next_call(
    tmp_path: Path,
) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        snap = await p.take_snapshot(handle, name="step-3")
        assert snap.ref == str(snap) == "gym/step-3"
        assert (snap.atespace, snap.name) == ("gym", "step-3")
        assert snap.source == handle.sandbox_id
        assert snap.template == "default/sandbox"
        assert (snap.fidelity, snap.keeps_memory, snap.ready) == ("MEMORY", True, True)
        assert control.actors[("gym", handle.sandbox_id)].state == SUSPENDED
        assert await p.status(handle) == SandboxStatus.PAUSED
        assert (await p.exec(handle, "echo again")).stdout == "again\n"
        assert control.actors[("gym", handle.sandbox_id)].state == RUNNING
        assert [e["event"] for e in _ledger(tmp_path) if "tag" in e] == ["snapshot"]
        await p.close(handle)


async def test_a_paused_sandbox_is_snapshotted_without_waking_it(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        await p.pause(handle)
        assert control.actors[("gym", handle.sandbox_id)].state == PAUSED
        resumes = control.calls["ResumeActor"]
        router_resumes = p._injected[1].router_resumes  # type: ignore[union-attr]
        await p.take_snapshot(handle)
        assert control.calls["ResumeActor"] == resumes
        assert p._injected[1].router_resumes == router_resumes  # type: ignore[union-attr]
        assert control.actors[("gym", handle.sandbox_id)].state == SUSPENDED  # uploaded
        await p.close(handle)


async def test_a_command_in_flight_refuses_the_snapshot_and_nothing_is_taken(
    tmp_path: Path,
) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        agents = p._injected[1]
        assert isinstance(agents, FakeAgents)
        agents.holds["job"], agents.held["job"] = asyncio.Event(), asyncio.Event()
        running = asyncio.create_task(p.exec(handle, "hold job", timeout_s=30))
        await agents.held["job"].wait()
        with pytest.raises(SnapshotBusyError, match="1 call\\(s\\) in flight"):
            await p.take_snapshot(handle)
        assert control.calls["SuspendActor"] == 0
        assert control.tags == {}
        agents.holds["job"].set()
        assert (await running).return_code == 0
        snap = await p.take_snapshot(handle)  # idle now: it works
        assert snap.ready
        await p.close(handle)


async def test_snapshot_arguments_are_checked_before_anything_happens(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        with pytest.raises(ValueError, match="snapshot name must be a non-empty string"):
            await p.take_snapshot(handle, name="")
        with pytest.raises(ValueError, match="scope must be 'atespace'"):
            await p.take_snapshot(handle, scope="global")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="ttl_s must be a number of seconds > 0"):
            await p.take_snapshot(handle, ttl_s=-1)
        assert control.calls["SuspendActor"] == 0
        await p.take_snapshot(handle, name="taken")
        with pytest.raises(SnapshotError, match="a snapshot named 'taken' .* already exists"):
            await p.take_snapshot(handle, name="taken")
        assert set(control.tags) == {("gym", "taken")}  # the existing one is left alone
        events = [(e["event"], e["tag"]) for e in _ledger(tmp_path) if "tag" in e]
        assert events == [
            ("snapshot", "taken"),
            ("snapshot", "taken"),
            ("snapshot_not_made", "taken"),
        ]
        await p.close(handle)


async def test_create_tag_retried_after_a_lost_reply_takes_its_own_tag(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        real = control.create_tag

        async def lost_reply(*args: Any, **kwargs: Any) -> Any:
            tag = await real(*args, **kwargs)
            if control.calls["CreateTag"] == 1:  # it landed, but the answer is lost
                raise _error("CreateTag", grpc.StatusCode.UNAVAILABLE, "connection reset")
            return tag

        control.create_tag = lost_reply  # type: ignore[method-assign]
        snap = await p.take_snapshot(handle, name="retried")
        assert snap.ref == "gym/retried"
        assert snap.ready
        assert control.calls["CreateTag"] == 2  # the retry met ALREADY_EXISTS: its own tag
        assert set(control.tags) == {("gym", "retried")}
        await p.close(handle)


async def test_a_crashed_sandbox_cannot_be_snapshotted(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        handle = await p.create(SandboxSpec())
        control.crash("gym", handle.sandbox_id, "worker pod went away while hosting the actor")
        with pytest.raises(ActorCrashedError, match="worker pod went away"):
            await p.take_snapshot(handle)
        assert control.tags == {}
        await p.close(handle)


async def test_sandboxes_from_a_snapshot_by_reference_or_by_value(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec(workdir="/work", env={"A": "1"}))
        snap = await p.take_snapshot(source, name="base")
        assert (snap.workdir, dict(snap.env or {})) == ("/work", {"A": "1"})
        by_ref = await p.create(SandboxSpec(provider_options={"from_snapshot": "gym/base"}))
        by_value = await p.create(SandboxSpec(), snapshot=snap)
        for child in (by_ref, by_value):
            assert child.raw.snapshot == "gym/base"
            assert child.raw.template == "default/sandbox"
            assert control.actors[("gym", child.sandbox_id)].source_tag == "gym/base"
        assert (by_value.raw.workdir, dict(by_value.raw.env)) == ("/work", {"A": "1"})
        created = [e for e in _ledger(tmp_path) if e["event"] == "created"]
        assert [e.get("snapshot") for e in created] == [None, "gym/base", "gym/base"]
        with pytest.raises(SubstrateCreateError, match="name different snapshots"):
            await p.create(
                SandboxSpec(provider_options={"from_snapshot": "gym/other"}), snapshot=snap
            )
        for h in (source, by_ref, by_value):
            await p.close(h)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"from_snapshot": "no-slash"}, "expected a snapshot as 'atespace/tag'"),
        ({"from_snapshot": "gym/missing"}, "snapshot gym/missing does not exist"),
        (
            {"from_snapshot": "gym/base", "atespace": "elsewhere"},
            "can only make sandboxes in atespace gym, not elsewhere",
        ),
        (
            {"from_snapshot": "gym/base", "template": "default/other"},
            "taken under ActorTemplate default/sandbox",
        ),
    ],
)
async def test_a_snapshot_that_cannot_make_the_sandbox_is_refused_before_create(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    control = FakeControl(templates={"default/sandbox": "ready", "default/other": "ready"})
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec())
        await p.take_snapshot(source, name="base")
        creates = control.calls["CreateActor"]
        with pytest.raises(SubstrateCreateError, match=message):
            await p.create(SandboxSpec(provider_options=options))
        assert control.calls["CreateActor"] == creates
        await p.close(source)


async def test_a_snapshot_still_being_copied_is_refused(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec())
        await p.take_snapshot(source, name="base")
        control.tags[("gym", "base")].completed = False
        with pytest.raises(SubstrateCreateError, match="still being copied"):
            await p.create(SandboxSpec(), snapshot="gym/base")
        await p.close(source)


async def test_fork_makes_n_children_and_its_snapshot_goes_with_the_last(
    tmp_path: Path,
) -> None:
    control = FakeControl(workers=8)
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec())
        children = await p.fork(source, 3)
        assert len({c.sandbox_id for c in children}) == 3
        refs = {c.raw.snapshot for c in children}
        assert len(refs) == 1
        assert set(control.tags) == {tuple(next(iter(refs)).split("/"))}
        for child in children:
            assert (await p.exec(child, "echo child")).stdout == "child\n"
        assert (await p.exec(source, "echo source")).stdout == "source\n"
        for child in children[:-1]:
            await p.close(child)
        assert len(control.tags) == 1
        await p.close(children[-1])
        assert control.tags == {}
        kept = await p.fork(source, 1, name="kept", keep_snapshot=True)
        await p.close(kept[0])
        assert set(control.tags) == {("gym", "kept")}
        await p.close(source)


@pytest.mark.parametrize("n", [0, -1, True, 2.0, "3", 5000])
async def test_fork_checks_n(tmp_path: Path, n: Any) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec())
        with pytest.raises(ValueError, match="n must be a whole number of sandboxes, 1..1024"):
            await p.fork(source, n)
        assert control.tags == {}
        await p.close(source)


async def test_a_fork_that_cannot_get_all_its_children_makes_none(tmp_path: Path) -> None:
    """Room for 2 running actors. The snapshot suspends the source, so 2 children start; the
    third waits for room (RESOURCE_EXHAUSTED, as create does) until the ready deadline, and the
    fork fails whole."""
    control = FakeControl(workers=2)
    create = {"ready_timeout_s": 0.5, "retry": {"initial": 0.01, "maximum": 0.05, "deadline": 5}}
    async with _provider(control, tmp_path, create=create) as p:
        source = await p.create(SandboxSpec())
        with pytest.raises(SnapshotError, match=r"1 of the 3 sandboxes could not be created"):
            await p.fork(source, 3)
        assert [a.name for a in control.actors.values()] == [source.sandbox_id]
        assert control.tags == {}  # the fork's snapshot went with its children
        assert (await p.exec(source, "echo still")).stdout == "still\n"
        await p.close(source)


async def test_delete_snapshot_refuses_while_a_child_borrows_it(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path, pause_mode="suspend") as p:
        source = await p.create(SandboxSpec())
        snap = await p.take_snapshot(source, name="base")
        child = await p.create(SandboxSpec(), snapshot=snap)
        with pytest.raises(SnapshotInUseError) as refused:
            await p.delete_snapshot(snap)
        assert refused.value.borrowers == (f"gym/{child.sandbox_id}",)
        assert child.sandbox_id in str(refused.value)
        assert "force=True" in str(refused.value)
        assert ("gym", "base") in control.tags
        await p.pause(child)  # suspended: it holds its own snapshot now
        await p.delete_snapshot("gym/base")
        assert control.tags == {}
        await p.delete_snapshot("gym/base")  # gone already: done
        events = [e["event"] for e in _ledger(tmp_path) if "tag" in e]
        assert events == ["snapshot", "snapshot_deleted", "snapshot_deleted"]
        await p.close(child)
        await p.close(source)


async def test_delete_snapshot_with_force_strands_the_borrowers(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec())
        snap = await p.take_snapshot(source)
        child = await p.create(SandboxSpec(), snapshot=snap)
        await p.delete_snapshot(snap, force=True)
        assert control.tags == {}
        with pytest.raises(ValueError, match="must be a SandboxSnapshot or 'atespace/tag'"):
            await p.delete_snapshot("not a ref")
        await p.close(child)
        await p.close(source)


async def test_list_snapshots_lists_the_atespace(tmp_path: Path) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec())
        await p.take_snapshot(source, name="a")
        await p.take_snapshot(source, name="b", scope="published")
        found = await p.list_snapshots()
        assert [(s.ref, s.scope, s.source) for s in found] == [
            ("gym/a", "atespace", source.sandbox_id),
            ("gym/b", "published", source.sandbox_id),
        ]
        assert await p.list_snapshots(atespace="other") == []
        with pytest.raises(ValueError, match="atespace must be a DNS label"):
            await p.list_snapshots(atespace="Bad/Space")
        await p.close(source)


def test_the_capability_is_declared_the_gym_way() -> None:
    provider = SubstrateProvider(connection=CONN)
    assert isinstance(provider, SupportsSandboxSnapshot)
    assert isinstance(provider, SupportsSandboxFork)
    caps = provider.snapshot_capabilities()
    assert (caps.snapshot, caps.clone, caps.reconnect) == (True, True, True)
    assert any("memory" in c for c in caps.captures)
    assert any("in flight" in e for e in caps.excludes)
    assert provider.validate_snapshots() is None


@pytest.mark.parametrize("protocol", [SupportsSandboxSnapshot, SupportsSandboxFork])
def test_the_provider_takes_every_call_the_protocols_describe(protocol: type) -> None:
    import inspect

    for name, member in vars(protocol).items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        ours = getattr(SubstrateProvider, name)
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(member), name
        theirs = list(inspect.signature(member).parameters.values())
        mine = list(inspect.signature(ours).parameters.values())
        assert [(p.name, p.kind, p.default) for p in mine[: len(theirs)]] == [
            (p.name, p.kind, p.default) for p in theirs
        ], name
        assert all(
            p.kind == p.KEYWORD_ONLY and p.default is not p.empty for p in mine[len(theirs) :]
        )


def test_a_snapshot_reference_is_plain_data() -> None:
    snap = SandboxSnapshot("gym/base", source="gym-1", fidelity="ROOTFS", env={"A": "1"})
    again = pickle.loads(pickle.dumps(snap))
    assert again == snap
    assert str(again) == "gym/base"
    assert not again.keeps_memory
    with pytest.raises(ValueError, match="must be 'atespace/tag'"):
        SandboxSnapshot("just-a-name")


async def test_a_child_keeps_the_source_env_and_workdir_with_the_spec_on_top(
    tmp_path: Path,
) -> None:
    control = FakeControl()
    async with _provider(control, tmp_path) as p:
        source = await p.create(SandboxSpec(workdir="/w", env={"A": "1", "B": "source"}))
        snap = await p.take_snapshot(source)
        child = await p.create(SandboxSpec(env={"B": "child", "C": "3"}), snapshot=snap)
        assert child.raw.workdir == "/w"
        assert dict(child.raw.env) == {"A": "1", "B": "child", "C": "3"}
        moved = await p.create(SandboxSpec(workdir="/elsewhere"), snapshot=snap)
        assert (moved.raw.workdir, dict(moved.raw.env)) == ("/elsewhere", {"A": "1", "B": "source"})
        for h in (child, moved, source):
            await p.close(h)
