"""The provider against the real local backend (process runtime): every method and capability."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest

from gym_substrate import (
    CloseError,
    ConfigError,
    SubstrateActor,
    SubstrateCreateError,
    TransferError,
)
from gym_substrate.nemo import _shared
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .conftest import Stack, make_stack


async def test_lifecycle_every_method(stack: Stack, tmp_path: Path) -> None:
    provider = stack.provider()
    work = str(tmp_path / "work")
    handle = await provider.create(
        SandboxSpec(workdir=work, env={"A": "1"}, files={f"{work}/f.txt": "not uploaded"})
    )
    hello = tmp_path / "hello.txt"
    hello.write_text("hello\n")
    await provider.upload_file(handle, hello, "f.txt")  # relative: under the workdir
    assert handle.provider_name == "substrate"
    assert isinstance(handle.raw, SubstrateActor)
    assert handle.raw.status == "RUNNING"

    r = await provider.exec(handle, "cat f.txt; echo $A $B; pwd", env={"B": "2"})
    assert (r.return_code, r.stdout, r.error_type) == (0, f"hello\n1 2\n{work}\n", None)
    r = await provider.exec(handle, "pwd", cwd="/")
    assert r.stdout == "/\n"
    r = await provider.exec(handle, "echo bad >&2; exit 7")
    assert (r.return_code, r.stderr, r.error_type) == (7, "bad\n", None)
    r = await provider.exec(handle, "sleep 20", timeout_s=0.5)
    assert (r.return_code, r.error_type) == (125, "timeout")

    src = tmp_path / "src.bin"
    data = os.urandom(3 * 1024 * 1024 + 17)
    src.write_bytes(data)
    os.chmod(src, 0o755)
    await provider.upload_file(handle, src, f"{work}/up.bin")
    r = await provider.exec(handle, "stat -c %a up.bin")
    assert r.stdout == "755\n"
    dst = tmp_path / "out" / "down.bin"
    await provider.download_file(handle, f"{work}/up.bin", dst)
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert [p.name for p in dst.parent.iterdir()] == ["down.bin"]

    assert await provider.status(handle) == SandboxStatus.RUNNING
    ep = await provider.endpoint(handle, 80)
    assert ep.endpoint == stack.http_proxy.url + "/"
    assert ep.headers == {"ate-target-actor": f"gym/{handle.sandbox_id}"}
    with pytest.raises(ValueError, match="only to port 80"):
        await provider.endpoint(handle, 8080)

    old_raw = handle.raw
    await provider.pause(handle)
    assert await provider.status(handle) == SandboxStatus.PAUSED
    assert handle.raw.status == "PAUSED"
    await provider.resume(handle)
    assert handle.raw is not old_raw
    assert handle.raw.status == "RUNNING"
    r = await provider.exec(handle, "cat f.txt")
    assert r.stdout == "hello\n"

    await provider.close(handle)
    await provider.close(handle)
    assert await provider.status(handle) == SandboxStatus.STOPPED
    assert await stack.actors() == []
    ledger = [json.loads(x)["event"] for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert ledger == ["created", "deleted"]
    await provider.aclose()
    await provider.aclose()


async def test_connect_from_descriptor_and_exec_transparently_resumes(stack: Stack) -> None:
    a, b = stack.provider(), stack.provider()
    handle = await a.create(SandboxSpec(env={"X": "y"}))
    await a.pause(handle)
    desc = json.loads(json.dumps(await a.serialize_handle(handle)))
    other = await b.connect({**desc, "ports": [80]})
    assert await b.status(other) == SandboxStatus.PAUSED
    r = await b.exec(other, "echo $X")  # parked: resumed over gRPC first
    assert (r.return_code, r.stdout) == (0, "y\n")
    assert await b.status(other) == SandboxStatus.RUNNING
    await b.close(other)
    await a.close(handle)  # already gone: NOT_FOUND is success
    with pytest.raises(ValueError, match="unknown descriptor key"):
        await b.connect({"sandbox_id": "x", "bogus": 1})
    for bad, message in [
        ({"env": ["A=1"]}, "descriptor 'env' must map names to string values"),
        ({"env": {"A": 1}}, "descriptor 'env' must map names to string values"),
        ({"workdir": "rel"}, "descriptor 'workdir' must be an absolute path or null"),
        ({"atespace": 5}, "descriptor 'atespace' must be a string"),
    ]:
        with pytest.raises(ValueError, match=message):
            await b.connect({**desc, **bad})
    await a.aclose()
    await b.aclose()


async def test_create_rejects_bad_specs_before_allocating(stack: Stack) -> None:
    p = stack.provider(create={"image_templates": {"python:3.12": "local/sandbox"}})
    for spec, message in [
        (SandboxSpec(image="ubuntu:24.04"), "configured images: python:3.12"),
        (SandboxSpec(entrypoint=["/bin/x"]), "entrypoint is not supported"),
        (SandboxSpec(ports=[8080]), "forwards only to port 80"),
        (
            SandboxSpec(provider_options={"nope": 1}),
            "Expected keys: atespace, from_snapshot, resource_requests, snapshot_id, template",
        ),
        (
            SandboxSpec(provider_options={"template": "missing/tmpl"}),
            r"^ActorTemplate missing/tmpl \(provider_options.template\) does not exist",
        ),
        (SandboxSpec(provider_options={"template": "local_sandbox"}), "two DNS labels"),
    ]:
        with pytest.raises(SubstrateCreateError, match=message):
            await p.create(spec)
    assert stack.grpc_proxy.calls["CreateActor"] == 0
    assert stack.grpc_proxy.calls["ResumeActor"] == 0
    handle = await p.create(SandboxSpec(image="python:3.12"))
    await p.close(handle)
    assert await stack.actors() == []
    await p.aclose()


async def test_channel_and_pool_shared_per_loop_and_released(stack: Stack) -> None:
    before = _shared.shared_count()
    providers = [stack.provider() for _ in range(3)]
    handles = await asyncio.gather(*(p.create(SandboxSpec()) for p in providers))
    assert _shared.shared_count() == before + 1
    assert len({id(p._lease.resources) for p in providers}) == 1
    for p, h in zip(providers, handles, strict=True):
        await p.close(h)
        await p.aclose()
    assert _shared.shared_count() == before


async def test_failed_download_leaves_no_partial_target(stack: Stack, tmp_path: Path) -> None:
    p = stack.provider(create={"ready_timeout_s": 1})
    handle = await p.create(SandboxSpec())
    target = tmp_path / "d" / "t.bin"
    with pytest.raises(TransferError, match="no such file"):
        await p.download_file(handle, str(tmp_path / "missing"), target)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(1024 * 1024))
    await p.upload_file(handle, src, str(tmp_path / "remote.bin"))
    stack.http_proxy.inject("reset_before", method="GET", path_prefix="/v1/files", times=1000)
    with pytest.raises(TransferError):
        await p.download_file(handle, str(tmp_path / "remote.bin"), target)
    assert list(target.parent.iterdir()) == []
    stack.http_proxy.faults.clear()
    await p.close(handle)
    await p.aclose()


async def test_idle_policy_lets_16_rollouts_share_4_workers(tmp_path: Path) -> None:
    async with make_stack(tmp_path, workers=4) as stack:
        provider = stack.provider(
            create={
                "ready_timeout_s": 60,
                "retry": {"initial": 0.02, "maximum": 0.2, "deadline": 60},
            },
            lifecycle={"idle_policy": "suspend", "idle_after_s": 0.1},
        )

        async def rollout(i: int) -> list[str]:
            h = await provider.create(SandboxSpec())
            outs = []
            for turn in range(3):
                r = await provider.exec(h, f"echo {i}-{turn} >> turns; cat turns | wc -l")
                assert r.return_code == 0, r
                outs.append(r.stdout.strip())
                await asyncio.sleep(0.4)  # the "model" thinks; the actor gets parked
            await provider.close(h)
            return outs

        results = await asyncio.wait_for(asyncio.gather(*(rollout(i) for i in range(16))), 200)
        assert results == [["1", "2", "3"]] * 16  # state survived every park/resume
        assert stack.grpc_proxy.calls["SuspendActor"] >= 16
        assert await stack.actors() == []
        await provider.aclose()


async def test_metrics_endpoint_serves_counters(stack: Stack) -> None:
    import aiohttp

    from gym_substrate.nemo._metrics import serve_metrics

    p = stack.provider(metrics={"port": 0})
    h = await p.create(SandboxSpec())
    await p.exec(h, "true")
    port = serve_metrics("127.0.0.1", 0)
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    assert "gym_substrate_execs_total" in text
    assert "gym_substrate_exec_seconds_bucket" in text
    await p.close(h)
    await p.aclose()


async def test_metrics_port_in_use_is_a_config_error(stack: Stack) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = stack.provider(metrics={"host": "127.0.0.1", "port": port})
        with pytest.raises(
            ConfigError, match=f"metrics.port: cannot serve metrics on 127.0.0.1:{port}"
        ):
            await p.create(SandboxSpec())
    await p.aclose()
    assert await stack.actors() == []


async def test_pause_mode_suspend_and_idle_policy_pause(stack: Stack) -> None:
    p = stack.provider(pause_mode="suspend")
    h = await p.create(SandboxSpec())
    await p.pause(h)
    assert h.raw.status == "SUSPENDED"
    assert await p.status(h) == SandboxStatus.PAUSED
    await p.resume(h)
    assert await p.status(h) == SandboxStatus.RUNNING
    await p.close(h)
    await p.aclose()

    idle = stack.provider(lifecycle={"idle_policy": "pause", "idle_after_s": 0.1})
    h = await idle.create(SandboxSpec())
    assert (await idle.exec(h, "echo 1 > n; cat n")).stdout == "1\n"
    for _ in range(100):  # parked in the background; status() itself never wakes it
        if await idle.status(h) == SandboxStatus.PAUSED:
            break
        await asyncio.sleep(0.05)
    assert await idle.status(h) == SandboxStatus.PAUSED
    assert stack.grpc_proxy.calls["PauseActor"] == 1
    assert (await idle.exec(h, "cat n")).stdout == "1\n"  # resumed transparently
    await idle.close(h)
    assert await stack.actors() == []
    await idle.aclose()


async def test_exec_user_env_and_bad_user(stack: Stack) -> None:
    p = stack.provider()
    h = await p.create(SandboxSpec(env={"A": "spec", "B": "spec"}))
    r = await p.exec(h, "id -u; echo $A $B", user=0, env={"B": "call"})
    assert (r.return_code, r.stdout) == (0, "0\nspec call\n")
    r = await p.exec(h, "true", user="no-such-user-xyz")
    assert (r.return_code, r.error_type) == (125, "sandbox")
    assert r.stderr is not None
    assert "no-such-user-xyz" in r.stderr
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds"):
        await p.exec(h, "true", timeout_s=float("nan"))
    for huge in (1e9, float("inf")):  # "no practical limit": capped to what the agent accepts
        r = await p.exec(h, "echo ok", timeout_s=huge)
        assert (r.return_code, r.stdout, r.error_type) == (0, "ok\n", None)
    await p.close(h)
    await p.aclose()


async def test_blank_command_is_a_no_op_not_a_sandbox_failure(stack: Stack) -> None:
    p = stack.provider()
    h = await p.create(SandboxSpec())
    for blank in ("", "  \n"):
        r = await p.exec(h, blank)
        assert (r.return_code, r.error_type, r.stdout, r.stderr) == (0, None, "", "")
    # An argv list (outside Gym's `str` protocol) still reaches the agent as argv.
    r = await p.exec(h, ["echo", "a  b"])  # type: ignore[arg-type]
    assert (r.return_code, r.stdout) == (0, "a  b\n")
    await p.close(h)
    await p.aclose()


async def test_exec_concurrency_limit_bounds_jobs_in_flight(stack: Stack, tmp_path: Path) -> None:
    p = stack.provider(exec={"concurrency": 2})
    h = await p.create(SandboxSpec())
    log = "/tmp/overlap.log"  # inside the sandbox: its /tmp is its own
    cmd = f"echo start >> {log}; sleep 0.2; echo end >> {log}"
    results = await asyncio.gather(*(p.exec(h, cmd) for _ in range(6)))
    assert [r.return_code for r in results] == [0] * 6
    await p.download_file(h, log, tmp_path / "overlap.log")
    depth, deepest = 0, 0
    for line in (tmp_path / "overlap.log").read_text().split():
        depth += 1 if line == "start" else -1
        deepest = max(deepest, depth)
    assert deepest == 2
    await p.close(h)
    await p.aclose()


async def test_bearer_token_is_sent_on_every_rpc_and_reread(stack: Stack, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    p = stack.provider(connection={"token": {"file": str(token)}})
    h = await p.create(SandboxSpec())
    assert stack.grpc_proxy.metadata["CreateActor"]["authorization"] == "Bearer first"
    token.write_text("second")
    await p.status(h)
    assert stack.grpc_proxy.metadata["GetActor"]["authorization"] == "Bearer second"
    await p.close(h)
    await p.aclose()


async def test_unreadable_token_file_is_a_provider_error(stack: Stack, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    p = stack.provider(connection={"token": {"file": str(token)}})
    h = await p.create(SandboxSpec())
    token.unlink()
    with pytest.raises(CloseError, match=r"cannot read the bearer token.*No such file"):
        await p.close(h)
    ledger = await asyncio.to_thread(Path(stack.kwargs()["lifecycle"]["ledger"]).read_text)
    assert '"close_failed"' in ledger
    with pytest.raises(SubstrateCreateError, match="cannot read the bearer token"):
        await p.create(SandboxSpec(provider_options={"atespace": "other"}))
    token.write_text("t")
    await p.close(h)
    assert await stack.actors() == []
    await p.aclose()


async def test_concurrent_transfers_on_one_handle_and_empty_files(
    stack: Stack, tmp_path: Path
) -> None:
    p = stack.provider(exec={"transfer_chunk_bytes": 64 * 1024})
    h = await p.create(SandboxSpec())
    remote = tmp_path / "remote"
    sources = []
    for i in range(6):
        src = tmp_path / f"s{i}.bin"
        src.write_bytes(os.urandom(i * 100_000))  # 0 bytes .. 500 kB, several chunks each
        sources.append(src)
    await asyncio.gather(*(p.upload_file(h, s, str(remote / s.name)) for s in sources))
    await asyncio.gather(
        *(p.download_file(h, str(remote / s.name), tmp_path / "back" / s.name) for s in sources)
    )
    for s in sources:
        assert (tmp_path / "back" / s.name).read_bytes() == s.read_bytes()
    await p.close(h)
    await p.aclose()


async def test_close_forgets_the_sandbox_and_stays_idempotent(stack: Stack) -> None:
    p = stack.provider()
    handles = [await p.create(SandboxSpec()) for _ in range(3)]
    for h in handles:
        await p.close(h)
    assert p._actors == {}  # no per-sandbox state outlives close()
    calls = dict(stack.grpc_proxy.calls)
    await p.close(handles[0])  # again: nothing to do, no RPC
    assert dict(stack.grpc_proxy.calls) == calls
    r = await p.exec(handles[0], "true")
    assert (r.return_code, r.error_type) == (125, "sandbox")
    assert r.stderr is not None
    assert "was closed" in r.stderr
    assert p._actors == {}
    assert await stack.actors() == []
    await p.aclose()


async def test_exec_timeout_counts_from_submission_not_from_queueing(stack: Stack) -> None:
    p = stack.provider(exec={"concurrency": 1, "timeout_margin_s": 0})
    h = await p.create(SandboxSpec())
    slow = asyncio.ensure_future(p.exec(h, "sleep 2; echo slow"))
    await asyncio.sleep(0.1)  # `slow` holds the only slot
    quick = await p.exec(h, "echo quick", timeout_s=1.5)
    assert (quick.return_code, quick.stdout, quick.error_type) == (0, "quick\n", None)
    assert (await slow).stdout == "slow\n"
    await p.close(h)
    await p.aclose()


async def test_ledger_is_written_off_the_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from gym_substrate.nemo.ledger import Ledger

    threads: list[threading.Thread] = []
    append = Ledger.append

    def spy(self: Ledger, event: str, **fields: object) -> None:
        threads.append(threading.current_thread())
        append(self, event, **fields)

    monkeypatch.setattr(Ledger, "append", spy)
    p = stack.provider()
    h = await p.create(SandboxSpec())
    await p.close(h)
    assert len(threads) == 2  # created, deleted
    assert threading.current_thread() not in threads
    await p.aclose()
