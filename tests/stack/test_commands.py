"""Our dynamic `Command` provider (gym_substrate.stack.commands), called as the engine calls it.

It stands in for pulumi-command's `local.Command` (real: pulumi-command provider/pkg/provider/
local/command.go): create runs `create`, a changed input runs `update` or else `create` again,
a changed trigger replaces, destroy runs `delete`; stdout and stderr are outputs. The real
engine runs it in tests/stack/test_kind_live.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gym_substrate.stack import commands
from gym_substrate.stack.commands import StepError, _CommandProvider


def _props(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "step",
        "create": "echo made",
        "update": None,
        "delete": None,
        "triggers": [],
        "dir": None,
        "environment": {},
        "connection": None,
        "timeout": 30.0,
    }
    return base | kw


def test_create_records_stdout_and_stderr_and_runs_in_dir(tmp_path: Path) -> None:
    provider = _CommandProvider()
    result = provider.create(
        _props(
            create="pwd; echo progress >&2; echo $GS_X",
            dir=str(tmp_path),
            environment={"GS_X": "v"},
        )
    )
    assert result.outs is not None
    assert result.outs["stdout"] == f"{tmp_path}\nv\n"
    assert result.outs["stderr"] == "progress\n"
    assert result.id.startswith("step-")


def test_a_failing_step_names_itself_the_phase_and_quotes_its_output() -> None:
    with pytest.raises(StepError) as info:
        _CommandProvider().create(
            _props(name="kind-create", create="echo half; echo 'no docker' >&2; exit 4")
        )
    message = str(info.value)
    assert message.startswith("step 'kind-create' (create) exited 4\n")
    assert "--- stderr (tail) ---\nno docker\n" in message
    assert message.endswith("--- stdout (tail) ---\nhalf")


def test_only_the_tail_of_a_long_output_is_quoted() -> None:
    with pytest.raises(StepError) as info:
        _CommandProvider().create(
            _props(create="for i in $(seq 1 3000); do echo line-$i >&2; done; exit 1")
        )
    message = str(info.value)
    assert "line-3000" in message
    assert "line-1\n" not in message
    assert len(message) < commands.TAIL + 200


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][0] not in "ZX"
    except OSError:
        return False


def test_a_timeout_kills_the_step_and_what_it_started(tmp_path: Path) -> None:
    """At its timeout (scaled down to 0.2 s) the step's whole session is killed: the background
    job it started never gets to leave its marker (event-driven: its pid is watched, no sleep
    for the marker's time)."""
    marker, sub = tmp_path / "late", tmp_path / "sub.pid"
    script = f"(sleep 2; touch {marker}) & echo $! > {sub}; echo started; sleep 30"
    with pytest.raises(StepError, match=r"^step 'step' \(create\) timed out after 0.2 s"):
        _CommandProvider().create(_props(create=script, timeout=0.2))
    pid = int(sub.read_text())
    deadline = time.monotonic() + 5  # a job that was not killed leaves its marker within 2 s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid)
    assert not marker.exists(), "a job the step started outlived the step's timeout"


def test_diff_updates_on_a_script_change_and_replaces_on_a_trigger() -> None:
    provider = _CommandProvider()
    old = _props(triggers=["a"]) | {"stdout": "made\n", "stderr": ""}
    same = provider.diff("id", old, _props(triggers=["a"]))
    assert same.changes is False
    script = provider.diff("id", old, _props(create="echo other", triggers=["a"]))
    assert (script.changes, script.replaces) == (True, [])
    trigger = provider.diff("id", old, _props(triggers=["b"]))
    assert (trigger.changes, trigger.replaces) == (True, ["triggers"])


def test_update_runs_the_update_script_else_create(tmp_path: Path) -> None:
    provider = _CommandProvider()
    old = _props()
    with_update = provider.update("id", old, _props(update="echo updated"))
    assert with_update.outs is not None
    assert with_update.outs["stdout"] == "updated\n"
    without = provider.update("id", old, _props(create="echo again"))
    assert without.outs is not None
    assert without.outs["stdout"] == "again\n"


def test_delete_runs_the_delete_script_and_its_failure_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "log"
    provider = _CommandProvider()
    provider.delete("id", _props(delete=f"echo gone >> {log}"))
    assert log.read_text() == "gone\n"
    provider.delete("id", _props())  # no delete script: nothing to do
    with pytest.raises(StepError, match=r"^step 'step' \(delete\) exited 2"):
        provider.delete("id", _props(delete="exit 2"))


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("ssh-ed25519", "a host key is '<type> <base64>'"),
        ("hello AAAA", "a host key is '<type> <base64>'"),
        ("ssh-ed25519 not*base64", "the host key's second field is not base64"),
    ],
)
def test_a_bad_host_key_is_rejected_when_the_program_runs(key: str, problem: str) -> None:
    with pytest.raises(ValueError, match=f"^{problem}"):
        commands.Connection(host="h", user="u", private_key="k", host_key=key)


def test_a_bad_connection_is_rejected() -> None:
    with pytest.raises(ValueError, match="^ssh port must be 1-65535, got 0$"):
        commands.Connection(host="h", user="u", private_key="k", port=0)
    with pytest.raises(ValueError, match="^ssh host must be a host name or address"):
        commands.Connection(host="a b", user="u", private_key="k")
