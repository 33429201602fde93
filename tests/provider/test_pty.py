"""PTY sessions and background services through the provider, the router and the local backend.

What Gym 0.7.0 asks (nemo_gym/sandbox/providers/base.py): `SupportsSandboxPty.create_pty`
returns a `SandboxPtySession` (read/read_stderr/write/resize/send_signal/wait_exit/close),
`SupportsSandboxPtyAttach.attach_pty` re-attaches by id, `AsyncSandbox.pause()` detaches open
sessions (nemo_gym/sandbox/api.py), and `SupportsSandboxBackgroundServices.
exec_with_background_services` keeps the services a command starts. What Substrate imposes:
the router forwards HTTP/1.1 only and cuts every request at 10 s (real:
cmd/atenet/internal/router/xds.go), and an actor's worker may go away between requests (a 503,
then ResumeActor: real: cmd/atenet/internal/router/extproc.go).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gym_substrate.nemo._capabilities import NETWORKING, PORT_FORWARDING, SHARED_STORAGE
from gym_substrate.nemo.types import SandboxPtyError, SandboxPtySpec, SandboxSpec

from .conftest import Stack


async def _read_until(session: object, needle: bytes, within_s: float = 20) -> bytes:
    seen = b""
    deadline = time.monotonic() + within_s
    while needle not in seen:
        chunk = await session.read(timeout_s=max(0.1, deadline - time.monotonic()))  # type: ignore[attr-defined]
        assert chunk, f"the session ended before {needle!r}; got {seen!r}"
        seen += chunk
    return seen


async def _drain(session: object) -> bytes:
    out = b""
    async for chunk in session:  # type: ignore[attr-defined]
        out += chunk
    return out


async def test_terminal_session_end_to_end(stack: Stack, tmp_path: Path) -> None:
    provider = stack.provider()
    work = str(tmp_path / "w")
    handle = await provider.create(SandboxSpec(workdir=work, env={"K": "v"}))
    session = await provider.create_pty(handle, SandboxPtySpec(rows=30, cols=100))
    assert session.mode == "pty"
    assert not session.closed
    await session.write(b"echo K=$K; pwd; stty size\n")
    out = await _read_until(session, b"30 100")
    assert b"K=v" in out, "the sandbox's env reaches the terminal"
    assert work.encode() in out, "and its workdir is the shell's cwd"
    await session.resize(40, 120)
    await session.write(b"stty size\n")
    await _read_until(session, b"40 120")
    await session.write(b"sleep 30\n")
    await asyncio.sleep(0.3)
    await session.write(b"\x03echo status=$?\n")  # Ctrl-C: the PTY is the controlling terminal
    await _read_until(session, b"status=130")
    await session.write(b"exit 4\n")
    await _drain(session)
    assert await session.wait_exit(timeout_s=10) == 4
    assert session.closed, "an ended session reports closed, as Gym's facade expects"
    assert await session.read() == b""
    assert await session.read_stderr() == b"", "pty mode: stderr is the terminal"
    await session.close()
    await session.close()
    await provider.close(handle)
    await provider.aclose()


async def test_command_session_as_a_user_and_pipe_mode(stack: Stack) -> None:
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    async with await provider.create_pty(
        handle,
        SandboxPtySpec(command="read x; id -u; echo err:$x >&2; exit 3", user="nobody", pty=False),
    ) as session:
        assert session.mode == "pipe"
        await session.write(b"abc\n")
        assert await _drain(session) == b"65534\n", "never root when a user was asked"
        assert await session.read_stderr() == b"err:abc\n"
        assert await session.read_stderr() == b""
        assert await session.wait_exit() == 3
    assert session.closed
    killed = await provider.create_pty(handle, SandboxPtySpec(command="echo up; exec sleep 30"))
    await _read_until(killed, b"up")
    await killed.send_signal("SIGKILL")
    assert await killed.wait_exit(timeout_s=10) == 128 + 9
    await provider.close(handle)
    await provider.aclose()


async def test_lost_responses_neither_lose_nor_double_a_byte(stack: Stack) -> None:
    """A reset after the agent answered: the read is asked again from the same offset, the
    write resent with its offset (the agent skips what it has)."""
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    session = await provider.create_pty(handle, SandboxPtySpec(command="cat", pty=False))
    stack.http_proxy.inject("reset_after", method="POST", path_prefix="/v1/pty/", times=2)
    await session.write(b"abc")
    await session.write(b"def\n")
    stack.http_proxy.inject("reset_after", method="GET", path_prefix="/v1/pty/", times=2)
    assert await _read_until(session, b"\n") == b"abcdef\n"
    assert stack.http_proxy.requests("POST", f"/v1/pty/{session.session_id}/input") >= 4
    await session.close()
    await provider.close(handle)
    await provider.aclose()


@pytest.mark.slow
async def test_a_read_outlasts_the_router_cut_by_polling(stack: Stack) -> None:
    """Output that comes after 12 s still arrives: no request is held past the router's 10 s."""
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    session = await provider.create_pty(handle, SandboxPtySpec(command="sleep 12; echo late"))
    started = time.monotonic()
    assert await session.read() == b"late\r\n"
    assert 11.5 < time.monotonic() - started < 20
    assert await session.read() == b""
    quiet = await provider.create_pty(handle, SandboxPtySpec(command="sleep 30"))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await quiet.read(timeout_s=0.5)
    assert time.monotonic() - started < 5
    await quiet.close()
    await session.close()
    await provider.close(handle)
    await provider.aclose()


async def test_pause_detaches_sessions_and_they_reattach_after_resume(stack: Stack) -> None:
    """pause() keeps the processes (SIGSTOP on the process runtime, a checkpoint with gVisor):
    the session's shell is still there after resume, with its state."""
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    session = await provider.create_pty(handle, SandboxPtySpec(command="cat"))
    await session.write(b"one\n")
    await _read_until(session, b"one\r\none\r\n")
    await provider.pause(handle)
    assert session.detached
    with pytest.raises(SandboxPtyError, match="detached"):
        await session.read(timeout_s=0.1)
    with pytest.raises(SandboxPtyError, match="detached"):
        await session.write(b"x")
    await provider.resume(handle)
    await session.reattach()
    await session.write(b"two\n")
    assert b"two\r\ntwo\r\n" in await _read_until(session, b"two\r\ntwo\r\n")
    # Another handle of another process reattaches by id and replays from the start.
    other = stack.provider()
    handle2 = await other.connect(await provider.serialize_handle(handle))
    replay = await other.attach_pty(handle2, session.session_id, since=0)
    assert (await _read_until(replay, b"two\r\ntwo\r\n")).startswith(b"one\r\none\r\n")
    await replay.close()  # attached: only let go
    await session.write(b"three\n")
    await _read_until(session, b"three\r\nthree\r\n")
    await session.close()  # created here: ended
    with pytest.raises(SandboxPtyError, match="closed"):
        await session.read()
    await provider.close(handle)
    await provider.aclose()
    await other.aclose()


async def test_attach_takeover_and_unknown_sessions(stack: Stack) -> None:
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    first = await provider.create_pty(handle, SandboxPtySpec(command="cat"))
    with pytest.raises(SandboxPtyError, match="already attached"):
        await provider.attach_pty(handle, first.session_id, takeover=False)
    second = await provider.attach_pty(handle, first.session_id)
    with pytest.raises(SandboxPtyError, match="taken over"):
        await first.read(timeout_s=0.1)
    await second.write(b"hi\n")
    await _read_until(second, b"hi\r\nhi\r\n")
    with pytest.raises(SandboxPtyError, match="is gone"):
        await provider.attach_pty(handle, "gp-no-such-session")
    with pytest.raises(ValueError, match="past the"):
        await provider.attach_pty(handle, first.session_id, since=10**9)
    await provider.close(handle)
    await provider.aclose()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (SandboxPtySpec(rows=0), "rows must be between 1 and 65535"),
        (SandboxPtySpec(cols=70000), "cols must be between 1 and 65535"),
        (SandboxPtySpec(rows="24"), "rows must be an integer"),  # type: ignore[arg-type]
        (SandboxPtySpec(command=""), "command must be a non-empty string"),
        (SandboxPtySpec(user=True), "user must be a user name"),
        (SandboxPtySpec(env={"A=B": "x"}), "env name 'A=B' is invalid"),
        (SandboxPtySpec(user="no-such-user-xyz"), "unknown user"),
    ],
)
async def test_bad_pty_specs_are_value_errors(
    stack: Stack, spec: SandboxPtySpec, fragment: str
) -> None:
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    with pytest.raises(ValueError, match=fragment):
        await provider.create_pty(handle, spec)
    await provider.close(handle)
    await provider.aclose()


async def test_bad_session_calls_say_why(stack: Stack, tmp_path: Path) -> None:
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    with pytest.raises(SandboxPtyError, match="does not exist"):
        await provider.create_pty(handle, SandboxPtySpec(cwd=str(tmp_path / "nope")))
    session = await provider.create_pty(handle, SandboxPtySpec(command="sleep 30"))
    with pytest.raises(ValueError, match="signal must be one of"):
        await session.send_signal("SIGFOO")
    with pytest.raises(ValueError, match="rows must be between"):
        await session.resize(0, 80)
    with pytest.raises(TypeError, match="takes bytes"):
        await session.write("text")  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        await session.wait_exit(timeout_s=0.2)
    await session.send_signal("SIGTERM")
    assert await session.wait_exit(timeout_s=10) == 128 + 15
    with pytest.raises(SandboxPtyError, match="has ended"):
        await session.write(b"late")
    await provider.close(handle)
    await provider.aclose()


async def test_gym_shaped_detached_run(stack: Stack) -> None:
    """`run_detached` (what Gym's `pty.exec(detach=True)` calls) in a live shell."""
    provider = stack.provider()
    handle = await provider.create(SandboxSpec())
    session = await provider.create_pty(handle, SandboxPtySpec())
    output, code = await session.run_detached("cd /; echo in $(pwd); (exit 6)", poll_interval_s=1)
    assert (output, code) == (b"in /\r\n", 6)
    output, code = await session.run_detached("pwd")
    assert (output, code) == (b"/\r\n", 0), "the shell keeps its state between runs"
    await session.close()
    await provider.close(handle)
    await provider.aclose()


async def test_background_services_outlive_the_command_and_a_pause(
    stack: Stack, tmp_path: Path
) -> None:
    """The service below writes to its inherited stdout every 0.1 s: a plain exec's pipe is
    closed when the command ends and the service dies of SIGPIPE; with background services it
    keeps running, stops while the sandbox is paused (its memory kept) and goes on after."""
    provider = stack.provider()
    handle = await provider.create(SandboxSpec(workdir=str(tmp_path / "w")))
    service = "(while :; do echo tick; date +%s%N >> {f}; sleep 0.1; done) & echo started"
    r = await provider.exec_with_background_services(handle, service.format(f="svc"))
    assert r.return_code == 0
    assert "started\n" in (r.stdout or ""), "the output of the command's first 0.1 s"
    r = await provider.exec(handle, service.format(f="plain"))
    assert r.return_code == 0

    async def ticks(name: str) -> int:
        out = await provider.exec(handle, f"wc -l < {name}")
        return int(out.stdout or "0")

    await asyncio.sleep(1.0)
    before, plain = await ticks("svc"), await ticks("plain")
    await asyncio.sleep(0.5)
    assert await ticks("svc") > before, "the service runs after its command ended"
    assert await ticks("plain") == plain, "without it, the service died of SIGPIPE"
    await provider.pause(handle)
    await asyncio.sleep(0.5)
    await provider.resume(handle)
    paused_at = await ticks("svc")
    await asyncio.sleep(0.5)
    assert await ticks("svc") > paused_at, "and it survives pause and resume"
    timed = await provider.exec_with_background_services(handle, "sleep 30", timeout_s=0.5)
    assert (timed.return_code, timed.error_type) == (125, "timeout")
    await provider.close(handle)
    await provider.aclose()


async def test_compose_capabilities_say_why_or_check(stack: Stack) -> None:
    provider = stack.provider()
    with pytest.raises(NotImplementedError, match="port 80") as net:
        provider.validate_networking()
    assert str(net.value) == NETWORKING
    with pytest.raises(NotImplementedError) as fwd:
        provider.validate_port_forwarding()
    assert str(fwd.value) == PORT_FORWARDING
    with pytest.raises(NotImplementedError) as vol:
        provider.shared_volume_options("p/v", "/data")
    assert str(vol.value) == SHARED_STORAGE
    with pytest.raises(NotImplementedError, match="CAP_SYS_ADMIN cannot be granted"):
        provider.validate_runtime_requirements(cap_add=("SYS_ADMIN",), shm_size=None)
    with pytest.raises(ValueError, match="shm_size must be a positive"):
        provider.validate_runtime_requirements(cap_add=(), shm_size=0)
    assert provider.validate_runtime_requirements(cap_add=("CAP_KILL",), shm_size=1 << 20) is None
    handle = await provider.create(SandboxSpec())
    await provider.configure_runtime(handle, cap_add=("KILL",), shm_size=1 << 20)
    with pytest.raises(RuntimeError, match="/dev/shm has"):
        await provider.configure_runtime(handle, cap_add=(), shm_size=1 << 50)
    with pytest.raises(NotImplementedError):
        await provider.network_address(handle)
    await provider.close(handle)
    await provider.aclose()
