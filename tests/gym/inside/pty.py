"""Gym 0.7.0's own terminal code against our provider: `python -m nemo_gym.sandbox.shell` driven
through a real PTY (as a user at a terminal would), `AsyncSandbox.pty.exec` and a live
`pty.create()` session, and `exec(preserve_background_services=True)` across pause/resume."""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time

from common import CONFIG, Steps, check, provider_config

steps = Steps()
IMAGE = "gym-substrate/shell-test"


def _shell_config() -> str:
    """configs/substrate.yaml with `IMAGE` mapped to the backend's template (shell.py always
    passes an image, and our provider rejects unmapped ones)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(CONFIG)
    cfg.sandbox.substrate.create.image_templates = {IMAGE: os.environ["SUBSTRATE_TEMPLATE"]}
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="shell-")
    os.close(fd)
    OmegaConf.save(cfg, path)
    return path


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """A child process on a PTY of ours, read with a deadline."""

    def __init__(self, argv: list[str], rows: int, cols: int) -> None:
        self.master, slave = os.openpty()
        _set_size(slave, rows, cols)
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
        )
        os.close(slave)
        self.seen = b""

    def expect(self, pattern: bytes, timeout: float = 120) -> re.Match[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.seen)
            if match:
                return match
            left = deadline - time.monotonic()
            check(left > 0, f"{pattern!r} not seen within {timeout} s; got {self.seen[-3000:]!r}")
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                check(bool(chunk) or self.proc.poll() is None, f"EOF; got {self.seen[-3000:]!r}")
                self.seen += chunk

    def type(self, text: bytes) -> None:
        os.write(self.master, text)

    def resize(self, rows: int, cols: int) -> None:
        _set_size(self.master, rows, cols)
        self.proc.send_signal(signal.SIGWINCH)  # shell.py resizes the remote terminal on it

    def finish(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:
                    break
        return self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))


def interactive_shell() -> str:
    """What `python -m nemo_gym.sandbox.shell` does for a user: a remote shell in raw mode,
    the local size at start, SIGWINCH forwarded, and the remote exit status as its own."""
    config = _shell_config()
    term = Terminal(
        [sys.executable, "-m", "nemo_gym.sandbox.shell", "--config", config, "--image", IMAGE],
        rows=33,
        cols=97,
    )
    started = time.monotonic()
    try:
        term.expect(b"Sandbox ready")
        ready_s = time.monotonic() - started
        # Type only once the remote prompt shows: until shell.py has made this terminal raw
        # (tty.setraw flushes pending input), typed bytes would be lost, as at a real terminal.
        term.expect(rb"(?s)Sandbox ready.*?[#$] ")
        term.type(b"stty size; echo marker-$((6*7)); id -u; tty\n")
        term.expect(rb"marker-42")
        check(b"33 97" in term.seen, f"the start size did not reach the sandbox: {term.seen!r}")
        term.resize(41, 123)
        time.sleep(1.0)  # the resize is a request of its own, made by shell.py's handler
        term.type(b"stty size\n")
        term.expect(rb"41 123")
        term.type(b"sleep 30\n")
        time.sleep(1.0)
        term.type(b"\x03")  # raw mode locally: Ctrl-C travels to the remote line discipline
        term.type(b"echo interrupted=$?\n")
        term.expect(rb"interrupted=130")
        term.type(b"exit 5\n")
        code = term.finish()
    finally:
        if term.proc.poll() is None:  # Ctrl-C of shell.py itself: it stops its sandbox
            term.proc.send_signal(signal.SIGINT)
            try:
                term.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                term.proc.kill()
        os.unlink(config)
    check(code == 5, f"shell.py exited {code}, want the remote shell's 5; {term.seen[-2000:]!r}")
    return f"ready after {ready_s:.1f} s, size, resize, Ctrl-C and exit status passed through"


async def pty_api() -> str:
    """`AsyncSandbox.pty`: a one-shot `pty.exec`, then a live default shell session."""
    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec

    box = AsyncSandbox(provider_config("sandbox", CONFIG))
    await box.start(SandboxSpec(workdir="/tmp", env={"GYM_PTY": "yes"}))
    try:
        r = await box.pty.exec("stty size; echo $GYM_PTY; exit 3", rows=20, cols=70)
        check((r.return_code, r.error_type) == (3, None), repr(r))
        check(r.stdout == "20 70\r\nyes\r\n", repr(r.stdout))
        session = await box.pty.create(user="nobody")
        check(session.mode == "pty", repr(session.mode))
        r = await box.pty.exec("id -u; cd /; x=kept")
        check("65534" in (r.stdout or ""), f"not the asked user: {r!r}")
        r = await box.pty.exec("echo $(pwd) $x")
        check("/ kept" in (r.stdout or ""), f"the session lost its state: {r!r}")
        await session.resize(50, 150)
        # Gym runs it with stdin from /dev/null; stdout is the terminal (gVisor has no /dev/tty).
        r = await box.pty.exec("stty size <&1")
        check("50 150" in (r.stdout or ""), repr(r))
        await session.write(b"exit 9\n")
        check(await session.wait_exit(timeout_s=30) == 9, "exit status")
        await session.close()
    finally:
        await box.stop()
    return "pty.exec, session reuse, user, resize, exit status"


async def background_services() -> str:
    """Services started with preserve_background_services keep running after the command and
    across pause/resume, writing to the stdout they inherited."""
    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec

    box = AsyncSandbox(provider_config("sandbox", CONFIG))
    await box.start(SandboxSpec(workdir="/tmp/gym-services"))
    try:
        r = await box.exec(
            "mkdir -p /tmp/gym-services; "
            "(while :; do echo tick; date >> /tmp/gym-services/ticks; sleep 0.2; done) & "
            "echo started",
            preserve_background_services=True,
        )
        check(r.return_code == 0, repr(r))

        async def ticks() -> int:
            out = await box.exec("wc -l < /tmp/gym-services/ticks")
            return int((out.stdout or "0").strip() or 0)

        await asyncio.sleep(1.5)
        first = await ticks()
        await asyncio.sleep(1.0)
        second = await ticks()
        check(second > first, f"the service stopped after its command: {first} -> {second}")
        await box.pause()
        await box.resume()
        third = await ticks()
        await asyncio.sleep(1.0)
        fourth = await ticks()
        check(fourth > third, f"the service did not survive pause/resume: {third} -> {fourth}")
    finally:
        await box.stop()
    return f"ticks {first}, {second}; after pause/resume {third}, {fourth}"


async def main() -> None:
    await asyncio.to_thread(steps.run, "interactive_shell", interactive_shell)
    await steps.arun("pty_api", pty_api)
    await steps.arun("background_services", background_services)


if __name__ == "__main__":
    asyncio.run(main())
    steps.finish()
