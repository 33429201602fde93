"""The JSON request bodies, validated against their declarations before anything runs.

`_wire.validate` checks every field of a body against its declaration in `contract.py` (the
400 message names the field and what it accepts); this module only turns the validated body into
the frozen spec a handler (and `JobManager` / `PtyManager`) works with. The specs are frozen
dataclasses because their equality is what "the same body" means for idempotent retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._errors import ApiError
from ._wire import WireError, validate
from .contract import ExecRequest, PtyRequest, PtyResize, PtySignal, PtySignalName

__all__ = [
    "ExecSpec",
    "PtySpec",
    "bad_request",
    "parse_body",
    "parse_exec_request",
    "parse_pty_request",
    "parse_resize",
    "parse_signal",
]


def bad_request(message: str) -> ApiError:
    """A 400 `bad_request` with `message` (which names the field and what it accepts)."""
    return ApiError(400, "bad_request", message)


def parse_body(decl: type, body: Any) -> dict[str, Any]:
    """`body` validated against the declaration `decl`, else a 400 that says why."""
    try:
        return validate(decl, body)
    except WireError as exc:
        raise bad_request(str(exc)) from None


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """A validated exec request; equality is what "the same body" means for idempotency."""

    command: str | tuple[str, ...]
    shell: str
    cwd: str | None
    env: tuple[tuple[str, str], ...]
    timeout_s: float | None
    stdin: str | None
    user: str | int | None
    max_output_bytes: int
    background_services: bool = False

    @property
    def argv(self) -> list[str]:
        if isinstance(self.command, str):
            return [self.shell, "-c", self.command]
        return list(self.command)


def _command(value: str | list[str] | None) -> str | tuple[str, ...] | None:
    return tuple(value) if isinstance(value, list) else value


def _user(value: str | int | None) -> str | int | None:
    """A string of ASCII digits is a uid (the declaration bounds it); any other is a name."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value


def _env(value: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(value.items()))


def parse_exec_request(body: Any) -> tuple[str | None, ExecSpec]:
    """Validate a POST /v1/exec body; returns (client id or None, spec) or raises 400."""
    fields = parse_body(ExecRequest, body)
    timeout_s, command = fields["timeout_s"], _command(fields["command"])
    assert command is not None  # required by the declaration
    spec = ExecSpec(
        command=command,
        shell=fields["shell"],
        cwd=fields["cwd"],
        env=_env(fields["env"]),
        timeout_s=None if timeout_s is None else float(timeout_s),
        stdin=fields["stdin"],
        user=_user(fields["user"]),
        max_output_bytes=fields["max_output_bytes"],
        background_services=fields["background_services"],
    )
    return fields["id"], spec


@dataclass(frozen=True, slots=True)
class PtySpec:
    """A validated `POST /v1/pty` body; equality is what "the same body" means for retries."""

    command: str | tuple[str, ...] | None
    shell: str | None
    cwd: str | None
    env: tuple[tuple[str, str], ...]
    user: str | int | None
    rows: int
    cols: int
    pty: bool


def parse_pty_request(body: Any) -> tuple[str | None, PtySpec]:
    """Validate a POST /v1/pty body; returns (client id or None, spec) or raises 400."""
    fields = parse_body(PtyRequest, body)
    spec = PtySpec(
        command=_command(fields["command"]),
        shell=fields["shell"],
        cwd=fields["cwd"],
        env=_env(fields["env"]),
        user=_user(fields["user"]),
        rows=fields["rows"],
        cols=fields["cols"],
        pty=fields["pty"],
    )
    return fields["id"], spec


def parse_resize(body: Any) -> tuple[int, int]:
    """(rows, cols) of a POST /v1/pty/{id}/resize body, or raises 400."""
    fields = parse_body(PtyResize, body)
    return fields["rows"], fields["cols"]


def parse_signal(body: Any) -> PtySignalName:
    """The signal name of a POST /v1/pty/{id}/signal body, or raises 400."""
    name: PtySignalName = parse_body(PtySignal, body)["signal"]
    return name
