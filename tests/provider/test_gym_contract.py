"""Behaviour real NeMo Gym 0.7.0 relies on, each found by running our provider under it.

Each test names the Gym code that depends on it (paths inside the nemo-gym 0.7.0 wheel). They run
against the real local backend (process runtime); the same calls through Gym's own facades and
servers run in tests/gym/.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gym_substrate import SubstrateCreateError
from gym_substrate.nemo import _create, _shared
from gym_substrate.nemo.types import SandboxSpec

from .conftest import Stack


async def test_connect_by_id_alone_keeps_the_sandboxs_env_and_workdir(
    stack: Stack, tmp_path: Path
) -> None:
    """`responses_api_agents/terminus_2_sandboxed_agent/app.py` reattaches with
    `AsyncSandbox.connect({"sandbox_id": id})`: the env the resources server set must reach the
    agent's commands, and they must run in the workdir."""
    work = str(tmp_path / "w")
    creator, agent = stack.provider(), stack.provider()
    handle = await creator.create(SandboxSpec(workdir=work, env={"TASK": "t1"}))
    again = await agent.connect({"sandbox_id": handle.sandbox_id})
    result = await agent.exec(again, "echo $TASK; pwd")
    assert (result.return_code, result.stdout) == (0, f"t1\n{work}\n")
    assert (await agent.serialize_handle(again))["env"] == {"TASK": "t1"}
    # A full descriptor is believed as it is: no read from the sandbox is needed.
    full = await agent.connect(await creator.serialize_handle(handle))
    assert (await agent.exec(full, "echo $TASK")).stdout == "t1\n"
    await agent.close(again)
    await creator.aclose()
    await agent.aclose()


async def test_create_leaves_spec_files_to_the_facade(stack: Stack, tmp_path: Path) -> None:
    """`nemo_gym/sandbox/api.py` `AsyncSandbox.start()` uploads `spec.files` after `create()`;
    a provider that uploads them as well sends every file twice."""
    p = stack.provider()
    handle = await p.create(SandboxSpec(workdir=str(tmp_path), files={"a.txt": "x"}))
    assert stack.http_proxy.requests("PUT", "/v1/files") == 0
    result = await p.exec(handle, "test -e a.txt; echo $?")
    assert result.stdout == "1\n"
    await p.close(handle)
    await p.aclose()


async def test_truncated_output_is_said_in_stderr_and_the_log(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    p = stack.provider(exec={"max_output_bytes": 1024})
    handle = await p.create(SandboxSpec())
    with caplog.at_level(logging.WARNING, logger="gym_substrate.provider"):
        result = await p.exec(handle, "head -c 5000 /dev/zero | tr '\\0' a")
    assert result.return_code == 0
    assert result.stdout is not None
    assert "bytes truncated" in result.stdout
    assert len(result.stdout) < 1200
    assert result.stderr is not None
    assert "stdout truncated at the output limit" in result.stderr
    assert "raise exec.max_output_bytes" in caplog.text
    await p.close(handle)
    await p.aclose()


async def test_a_timeout_says_so_in_stderr(stack: Stack, tmp_path: Path) -> None:
    """Gym's docker, local and openshell providers put "timed out after N s" in stderr, and
    agents show the model stdout + stderr."""
    p = stack.provider()
    handle = await p.create(SandboxSpec(workdir=str(tmp_path)))
    result = await p.exec(handle, "echo started; sleep 20", timeout_s=0.5)
    assert (result.return_code, result.error_type) == (125, "timeout")
    assert result.stderr is not None
    assert "command timed out after 0.5 s" in result.stderr
    # timeout_s <= 0, as Gym's local provider: a timeout result, and nothing runs.
    for limit in (0, -1):
        result = await p.exec(handle, "touch ran", timeout_s=limit)
        assert (result.return_code, result.error_type) == (125, "timeout")
    assert (await p.exec(handle, "test -e ran; echo $?")).stdout == "1\n"  # in the workdir
    await p.close(handle)
    await p.aclose()


async def test_relative_paths_are_taken_from_the_workdir(stack: Stack, tmp_path: Path) -> None:
    """Gym's local provider resolves relative upload and download paths under the workspace;
    our `cwd` does the same instead of raising a ValueError the facade does not expect."""
    work = tmp_path / "w"
    p = stack.provider()
    handle = await p.create(SandboxSpec(workdir=str(work)))
    src = tmp_path / "src.txt"
    src.write_text("data\n")
    await p.upload_file(handle, src, "sub/in.txt")
    assert (await p.exec(handle, f"cat {work}/sub/in.txt")).stdout == "data\n"
    assert (await p.exec(handle, "pwd", cwd="sub")).stdout == f"{work}/sub\n"
    await p.download_file(handle, "sub/in.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "data\n"
    await p.close(handle)
    await p.aclose()


async def test_resource_requests_of_gyms_stock_configs_are_accepted_with_one_warning(
    stack: Stack, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resources_servers/terminal_bench_2_1/configs/terminal_bench_2_1.yaml` (and 13 more
    stock configs) set `provider_options.resource_requests`, an OpenSandbox option."""
    monkeypatch.setattr(_create, "_warned", set())
    p = stack.provider()
    spec = SandboxSpec(provider_options={"resource_requests": {"cpu": 2, "memory": "4Gi"}})
    with caplog.at_level(logging.WARNING, logger="gym_substrate.provider"):
        handles = [await p.create(spec) for _ in range(3)]
    assert caplog.text.count("provider_options.resource_requests is ignored") == 1
    for handle in handles:
        await p.close(handle)
    with pytest.raises(SubstrateCreateError, match="resource_requests must be a mapping"):
        await p.create(SandboxSpec(provider_options={"resource_requests": "big"}))
    await p.aclose()


async def test_a_failed_create_gives_the_shared_connections_back(stack: Stack) -> None:
    """`AsyncSandbox.start()` does not call `aclose()` after a failed `create()`, so the
    provider must not keep the HTTP pool open ("Unclosed client session" at exit)."""
    before = _shared.shared_count()
    p = stack.provider(create={"template": "local/missing"})
    with pytest.raises(SubstrateCreateError):
        await p.create(SandboxSpec())
    assert p._lease.resources is None
    assert _shared.shared_count() == before
