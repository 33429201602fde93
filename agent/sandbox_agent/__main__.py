"""Command line entry point: `sandbox-agent` / `python -m sandbox_agent`.

Only argparse and the agent's own modules are imported before the socket is bound, because the
time from process start to the first answered /readyz is part of every cold actor start.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import signal
import sys
import threading

from . import __version__

__all__ = ["main", "serve"]

log = logging.getLogger("sandbox_agent")


def _default_port() -> int:
    raw = os.environ.get("SANDBOX_AGENT_PORT")
    if raw is None or raw == "":
        return 80
    if not raw.isdecimal() or not 0 <= int(raw) <= 65535:
        sys.exit(f"sandbox-agent: SANDBOX_AGENT_PORT must be a port number 0..65535, got {raw!r}")
    return int(raw)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-agent",
        description="HTTP agent that runs commands and moves files inside a sandbox (contract v1).",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="TCP port (default 80, or env SANDBOX_AGENT_PORT); 0 picks a free port",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        help="file holding the bearer token every request except GET /readyz must carry "
        "(default: env SANDBOX_AGENT_TOKEN; no token disables auth)",
    )
    parser.add_argument(
        "--actor-id-file",
        default=None,
        help="file holding this sandbox's actor id, read on every request that needs it "
        "(default /run/ate/actor-id; env SANDBOX_AGENT_ACTOR_ID is the fallback)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level on stderr (debug adds command text)",
    )
    parser.add_argument("--version", action="version", version=f"sandbox-agent {__version__}")
    return parser


def _read_token(parser: argparse.ArgumentParser, token_file: str | None) -> str | None:
    if token_file is None:
        return os.environ.get("SANDBOX_AGENT_TOKEN") or None
    try:
        with open(token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        parser.error(f"cannot read --token-file {token_file}: {exc.strerror}")
    if not token:
        parser.error(f"--token-file {token_file} is empty; put the token in it")
    return token


def _import_asyncio_without_tls() -> None:
    """Import asyncio with the ssl module hidden from it.

    The agent serves plain HTTP/1.1 only (Substrate's router talks HTTP/1.1 to port 80), yet
    asyncio imports ssl, which maps OpenSSL's TLS library: megabytes on every cold start of
    every actor. asyncio treats a missing ssl module as "no TLS"; ssl stays importable after.
    """
    if "asyncio" in sys.modules:
        return
    saved = sys.modules.get("ssl")
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import asyncio  # noqa: F401
    finally:
        if saved is None:
            del sys.modules["ssl"]
        else:
            sys.modules["ssl"] = saved


async def serve(config: object) -> None:
    """Serve until SIGTERM/SIGINT, then kill running jobs and exit."""
    import asyncio

    from ._config import AgentConfig
    from ._serving import AgentServer
    from .app import create_app

    assert isinstance(config, AgentConfig)
    server = AgentServer(create_app(config), config)
    try:
        host, port = await server.start(config.host, config.port)
    except OSError as exc:
        await server.close()
        log.error("cannot listen on %s:%d: %s", config.host, config.port, exc.strerror or exc)
        raise SystemExit(1) from None
    log.info("sandbox-agent %s listening on http://%s:%d", __version__, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("signal received: killing running jobs and exiting")
    finally:
        await server.close()


def _clean_environment() -> None:
    """Undo what the static build's layers put into the environment, before any job inherits it.

    The launcher (agent/build/launcher.c) sets TMPDIR for the self-extracting layers and leaves
    its payload file behind; PyInstaller points LD_LIBRARY_PATH at its bundled libraries, which
    would break programs from the image. Commands must see the environment the agent was given.
    """
    env = os.environ
    payload = env.pop("SANDBOX_AGENT_LAUNCHER_PAYLOAD", None)
    if payload is not None:
        with contextlib.suppress(OSError):
            os.unlink(payload)
        orig_tmpdir = env.pop("SANDBOX_AGENT_TMPDIR_ORIG", None)
        if orig_tmpdir is None:
            env.pop("TMPDIR", None)
        else:
            env["TMPDIR"] = orig_tmpdir
    if getattr(sys, "frozen", False):
        for name in list(env):
            if name.startswith(("_MEI", "_PYI", "STATICX_")):
                del env[name]
        orig = env.pop("LD_LIBRARY_PATH_ORIG", None)
        if orig is None:
            env.pop("LD_LIBRARY_PATH", None)
        else:
            env["LD_LIBRARY_PATH"] = orig


class _BackgroundStderr(logging.Handler):
    """Format log records in the caller, write them to stderr from a thread, in batches.

    Writing to stderr can block when whoever reads it (a container runtime's log pipe) falls
    behind, so the event loop never writes itself. Unlike logging's QueueHandler, a record is
    formatted once and a busy agent wakes the writer once per batch, not once per line: the
    access log line costs the loop about 15 microseconds.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lines: collections.deque[str] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sandbox-agent-log", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record))
        except Exception:
            self.handleError(record)
            return
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            self._write_pending()

    def _write_pending(self) -> None:
        batch = []
        while self._lines:
            batch.append(self._lines.popleft())
        if batch:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write("\n".join(batch) + "\n")
                sys.stderr.flush()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=2)
        self._write_pending()
        super().close()


def _setup_logging(level: int) -> logging.Handler:
    handler = _BackgroundStderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.setLevel(level)
    root.addHandler(handler)
    return handler


# Signals a launcher may leave ignored (nohup: HUP; a shell's `&`: INT and QUIT). SIG_IGN survives
# exec, so every job and terminal session would inherit it: a hang-up would not end a session's
# foreground job. The agent stays deaf to them through a handler instead, which exec resets.
_INHERITED_IGNORES = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)


def _untangle_ignored_signals() -> None:
    """Keep ignoring what the launcher ignored, without passing SIG_IGN on to the sandbox."""
    for sig in _INHERITED_IGNORES:
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, _ignore)


def _ignore(signum: int, frame: object) -> None:
    """The agent's own stand-in for SIG_IGN (see `_untangle_ignored_signals`)."""


def main(argv: list[str] | None = None) -> None:
    _untangle_ignored_signals()
    _clean_environment()
    parser = _parser()
    args = parser.parse_args(argv)
    port = args.port if args.port is not None else _default_port()
    token = _read_token(parser, args.token_file)
    log_handler = _setup_logging(getattr(logging, args.log_level.upper()))
    from ._config import ACTOR_ID_FILE, AgentConfig

    try:
        config = AgentConfig(
            host=args.host,
            port=port,
            token=token,
            actor_id_file=args.actor_id_file or ACTOR_ID_FILE,
            reap_orphans=True,
        )
    except ValueError as exc:
        parser.error(str(exc))
    _import_asyncio_without_tls()
    import asyncio

    try:
        asyncio.run(serve(config))
    finally:
        log_handler.close()


if __name__ == "__main__":
    main()
