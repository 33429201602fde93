"""`local up --daemon` that fails says why with the lines of this start only.

`backend.log` collects every start in a state folder; the error of a failed start used to quote
the file's last 3000 characters, so a second failed start showed the first one's traceback
again, and an error fixed long ago could read as the reason of a new one (issue 24).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from gym_substrate.cli.local import local


def _cli(*args: str) -> Any:
    return CliRunner().invoke(local, list(args))


def test_a_failed_daemon_start_quotes_only_its_own_log_lines(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "backend.log").write_text("Traceback: STALE failure of an earlier start\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["up", "--daemon", "--runtime", "process", "--rootfs", "host", "--workers", "1"]
        args += ["--api-port", str(port), "--state-dir", str(state)]
        first = _cli(*args)
        second = _cli(*args)
    for result in (first, second):
        assert result.exit_code != 0, result.output
        assert "exited during start-up" in result.output
        assert "STALE" not in result.output
    reason = f"cannot listen on 127.0.0.1:{port} for the API"
    assert second.output.count(reason) == 1, second.output
    # the log itself keeps every start, each under its own header
    log = (state / "backend.log").read_text()
    assert "STALE" in log
    assert log.count(reason) == 2
    assert log.count("--- gym-substrate local up --daemon,") == 2
