"""The exec and PTY request bodies: parsed and validated once, before anything runs.

Every field is checked here with a message that names the field and the accepted values, so a
handler (and `JobManager` / `PtyManager`) only ever sees a frozen, valid spec. The specs are
frozen dataclasses because their equality is what "the same body" means for idempotent retries.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from ._errors import ApiError
from ._numbers import parse_decimal
from .contract import (
    DEFAULT_MAX_OUTPUT_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_TERMINAL_SIZE,
    MAX_TIMEOUT_S,
    MAX_UID,
)

__all__ = [
    "ExecSpec",
    "PtySpec",
    "bad_request",
    "check_fields",
    "json_integer",
    "parse_command",
    "parse_cwd",
    "parse_env",
    "parse_exec_request",
    "parse_id",
    "parse_pty_request",
    "parse_shell",
    "parse_user",
    "terminal_size",
]

ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}\Z")
_EXEC_KEYS = (
    "id",
    "command",
    "shell",
    "cwd",
    "env",
    "timeout_s",
    "stdin",
    "user",
    "max_output_bytes",
    "background_services",
)
_PTY_KEYS = ("id", "command", "shell", "cwd", "env", "user", "rows", "cols", "pty")


def bad_request(message: str) -> ApiError:
    """A 400 `bad_request` with `message` (which names the field and what it accepts)."""
    return ApiError(400, "bad_request", message)


def _check_text(value: str, what: str) -> None:
    if "\x00" in value:
        raise bad_request(f"{what} must not contain NUL characters")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise bad_request(f"{what} must be valid Unicode (no lone surrogates)") from None


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


def json_integer(value: Any) -> int | None:
    """A JSON integer as JSON Schema counts them (`1e3` and `1000.0` are 1000), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def parse_user(raw: Any) -> str | int | None:
    """A uid 0..MAX_UID (a JSON integer or ASCII digits), a user name, or None.

    Only ASCII digits make a uid: `"١٢"` is a name (and unknown), and 4294967295 is refused
    because setuid() reads (uid_t)-1 as "leave unchanged", which would run the command as root.
    """
    if raw is None:
        return None
    uid_range = f"a uid must be 0..{MAX_UID}"
    number = json_integer(raw)
    if number is not None:
        if not 0 <= number <= MAX_UID:
            raise bad_request(f"user {str(raw)[:24]} is out of range: {uid_range}")
        return number
    if not isinstance(raw, str) or not raw:
        raise bad_request(f"user must be a user name, a uid ({uid_range}), or null")
    _check_text(raw, "user")
    if raw.isascii() and raw.isdigit():
        uid = parse_decimal(raw, MAX_UID)
        if uid is None:
            raise bad_request(f"user {raw[:24]!r} is out of range: {uid_range}")
        return uid
    return raw


def parse_command(raw: Any) -> str | tuple[str, ...]:
    """`command`: a non-empty string (run by the shell) or a non-empty argv list."""
    if isinstance(raw, str):
        if not raw:
            raise bad_request("command must not be empty")
        _check_text(raw, "command")
        return raw
    if isinstance(raw, list):
        if not raw or not all(isinstance(a, str) for a in raw):
            raise bad_request("command as a list must be a non-empty list of strings (argv)")
        if not raw[0]:
            raise bad_request("command[0] (the program) must not be empty")
        for arg in raw:
            _check_text(arg, "command arguments")
        return tuple(raw)
    raise bad_request("command must be a string (run by the shell) or a list of strings (argv)")


def parse_shell(raw: Any) -> str | None:
    """`shell`: a non-empty string, or None when absent or null."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise bad_request('shell must be a non-empty string such as "/bin/bash"')
    _check_text(raw, "shell")
    return raw


def parse_cwd(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.startswith("/"):
        raise bad_request("cwd must be an absolute path (starting with /) or null")
    _check_text(raw, "cwd")
    return raw


def parse_env(raw: Any) -> tuple[tuple[str, str], ...]:
    """`env` as sorted (name, value) pairs: names not empty, without `=` or NUL."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise bad_request("env must be an object mapping variable names to string values")
    for name, value in raw.items():
        if not name or "=" in name or "\x00" in name:
            raise bad_request(f"env name {name!r} is invalid: non-empty, without '=' or NUL")
        if not isinstance(value, str):
            raise bad_request(f"env value for {name!r} must be a string")
        _check_text(value, f"env value for {name!r}")
    return tuple(sorted(raw.items()))


def parse_id(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not ID_RE.match(raw):
        raise bad_request("id must be a string matching [A-Za-z0-9._-]{1,128}, or omitted")
    return raw


def check_fields(body: Any, allowed: tuple[str, ...], example: str) -> dict[str, Any]:
    """The body as a dict with only `allowed` keys, else a 400 that lists them."""
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object such as {example}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; allowed fields: {list(allowed)}")
    return body


def parse_exec_request(body: Any) -> tuple[str | None, ExecSpec]:
    """Validate a POST /v1/exec body; returns (client id or None, spec) or raises 400."""
    body = check_fields(body, _EXEC_KEYS, '{"command": "echo hi"}')
    job_id = parse_id(body.get("id"))
    if "command" not in body:
        msg = "command is required: a string (run by the shell) or a list of strings (argv)"
        raise bad_request(msg)
    command = parse_command(body["command"])
    shell = parse_shell(body.get("shell")) or "/bin/sh"
    cwd = parse_cwd(body.get("cwd"))
    env = parse_env(body.get("env"))

    timeout = body.get("timeout_s")
    timeout_s: float | None = None
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise bad_request("timeout_s must be a number of seconds > 0, or null for no timeout")
        timeout_s = float(timeout)
        if not math.isfinite(timeout_s) or not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise bad_request(
                f"timeout_s must be a number of seconds > 0 and at most {MAX_TIMEOUT_S} (1e8), "
                "or null for no timeout"
            )

    stdin = body.get("stdin")
    if stdin is not None:
        if not isinstance(stdin, str):
            msg = "stdin must be a string (sent to the command's standard input) or null"
            raise bad_request(msg)
        try:
            stdin.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request("stdin must be valid Unicode (no lone surrogates)") from None

    user = parse_user(body.get("user"))

    raw_max = body.get("max_output_bytes")
    max_out = DEFAULT_MAX_OUTPUT_BYTES if raw_max is None else json_integer(raw_max)
    if max_out is None:
        raise bad_request("max_output_bytes must be an integer number of bytes per stream")
    if not 0 <= max_out <= MAX_OUTPUT_BYTES:
        raise bad_request(f"max_output_bytes must be between 0 and {MAX_OUTPUT_BYTES} (64 MiB)")

    services = body.get("background_services")
    if services is None:
        services = False
    elif not isinstance(services, bool):
        raise bad_request("background_services must be true, false or null")

    spec = ExecSpec(
        command=command,
        shell=shell,
        cwd=cwd,
        env=env,
        timeout_s=timeout_s,
        stdin=stdin,
        user=user,
        max_output_bytes=max_out,
        background_services=services,
    )
    return job_id, spec


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


def terminal_size(raw: Any, name: str, default: int | None) -> int:
    """rows or cols: an integer 1..65535; `default` when absent (None: required)."""
    if raw is None and default is not None:
        return default
    value = json_integer(raw)
    if value is None or not 1 <= value <= MAX_TERMINAL_SIZE:
        raise bad_request(f"{name} must be an integer 1..{MAX_TERMINAL_SIZE}, got {str(raw)[:24]}")
    return value


def parse_pty_request(body: Any) -> tuple[str | None, PtySpec]:
    """Validate a POST /v1/pty body; returns (client id or None, spec) or raises 400."""
    body = check_fields(body, _PTY_KEYS, '{"command": "bash", "rows": 24, "cols": 80}')
    raw_pty = body.get("pty", True)
    if not isinstance(raw_pty, bool):
        raise bad_request("pty must be true (a terminal) or false (pipes: stdout and stderr apart)")
    command = body.get("command")
    spec = PtySpec(
        command=None if command is None else parse_command(command),
        shell=parse_shell(body.get("shell")),
        cwd=parse_cwd(body.get("cwd")),
        env=parse_env(body.get("env")),
        user=parse_user(body.get("user")),
        rows=terminal_size(body.get("rows"), "rows", 24),
        cols=terminal_size(body.get("cols"), "cols", 80),
        pty=raw_pty,
    )
    return parse_id(body.get("id")), spec
