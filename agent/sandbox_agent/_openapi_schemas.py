"""The JSON Schemas of contract v1's bodies (OpenAPI 3.1 components), kept as code.

`_openapi` puts them under `components/schemas` of the document served at GET /v1/openapi.json;
the contract tests validate every JSON response against them.
"""

from __future__ import annotations

from typing import Any

from .contract import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ERROR_CODES,
    JOB_STATES,
    MAX_OUTPUT_BYTES,
    MAX_PTY_INPUT_BYTES,
    MAX_PTY_READ_BYTES,
    MAX_TERMINAL_SIZE,
    MAX_TIMEOUT_S,
    MAX_UID,
    PTY_BUFFER_BYTES,
    PTY_SIGNALS,
    PTY_STATES,
)

__all__ = ["ABSOLUTE_PATTERN", "FILE_PATH_PATTERN", "SCHEMAS"]

# `[0-9]` for digits (`\d` means every Unicode digit in Python).
_NO_NUL = "^[^\\x00]*$"
ABSOLUTE_PATTERN = "^/[^\\x00]*$"
# A file path: absolute, no NUL, and its last segment names something (not "", "." or ".."),
# so that it cannot normalise to "/" or to a parent directory.
FILE_PATH_PATTERN = "^/([^\\x00]*/)?([^/\\x00]*[^./\\x00][^/\\x00]*|[.]{3,})$"
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "additionalProperties": False,
                "properties": {
                    "code": {"type": "string", "enum": list(ERROR_CODES)},
                    "message": {"type": "string", "minLength": 1},
                },
            }
        },
    },
    "Ready": {
        "type": "object",
        "required": ["status", "agent_version", "actor_id", "boot_id", "uptime_s"],
        "additionalProperties": False,
        "properties": {
            "status": {"const": "ok"},
            "agent_version": {"type": "string"},
            "actor_id": {"type": ["string", "null"]},
            "boot_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
            "uptime_s": {"type": "number", "minimum": 0},
        },
    },
    "ExecRequest": {
        "type": "object",
        "required": ["command"],
        "additionalProperties": False,
        "properties": {
            "id": {
                "type": ["string", "null"],
                "pattern": "^[A-Za-z0-9._-]{1,128}$",
                "description": "Idempotency key; the same id with the same body never starts "
                "a second process, with a different body it is a 409 id_conflict.",
            },
            "command": {
                "oneOf": [
                    {"type": "string", "minLength": 1, "pattern": _NO_NUL},
                    {
                        "type": "array",
                        "minItems": 1,
                        "prefixItems": [{"type": "string", "minLength": 1, "pattern": _NO_NUL}],
                        "items": {"type": "string", "pattern": _NO_NUL},
                    },
                ],
                "description": "A string runs as [shell, -c, command]; a list is the argv "
                "(its first item, the program, not empty). No NUL characters.",
            },
            "shell": {
                "type": ["string", "null"],
                "minLength": 1,
                "pattern": _NO_NUL,
                "default": "/bin/sh",
            },
            "cwd": {"type": ["string", "null"], "pattern": ABSOLUTE_PATTERN},
            "env": {
                "type": ["object", "null"],
                "propertyNames": {"minLength": 1, "pattern": "^[^=\\x00]*$"},
                "additionalProperties": {"type": "string", "pattern": _NO_NUL},
                "description": "Added to the agent's environment; names are not empty and "
                "hold no = or NUL.",
            },
            "timeout_s": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "maximum": MAX_TIMEOUT_S,
                "description": "Seconds; null for no timeout.",
            },
            "stdin": {"type": ["string", "null"]},
            "user": {
                "oneOf": [
                    {"type": "string", "minLength": 1, "pattern": _NO_NUL},
                    {"type": "integer", "minimum": 0, "maximum": MAX_UID},
                    {"type": "null"},
                ],
                "description": "A uid 0..4294967294 (an integer, or a string of ASCII digits), "
                "or the name of a user in the sandbox's passwd; anything else is a 400.",
            },
            "max_output_bytes": {
                "type": ["integer", "null"],
                "minimum": 0,
                "maximum": MAX_OUTPUT_BYTES,
                "default": DEFAULT_MAX_OUTPUT_BYTES,
                "description": "Per stream; beyond it the head and the tail are kept.",
            },
            "background_services": {
                "type": ["boolean", "null"],
                "default": False,
                "description": "true: processes the command leaves running (services) may "
                "keep its stdout and stderr; the job still finishes when the command exits, "
                "and the agent goes on reading and discarding their output, so they never "
                "get SIGPIPE.",
            },
        },
    },
    "Job": {
        "type": "object",
        "required": [
            "id",
            "state",
            "exit_code",
            "signal",
            "stdout",
            "stderr",
            "stdout_truncated",
            "stderr_truncated",
            "started_at",
            "duration_ms",
            "error",
        ],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$"},
            "state": {"enum": list(JOB_STATES)},
            "exit_code": {"type": ["integer", "null"]},
            "signal": {"type": ["integer", "null"]},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "started_at": {"type": "number", "description": "Unix time in seconds."},
            "duration_ms": {"type": "number", "minimum": 0},
            "error": {"type": ["string", "null"]},
        },
    },
    "UploadResult": {
        "type": "object",
        "required": ["path", "size", "sha256"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "size": {"type": "integer", "minimum": 0},
            "sha256": {
                "type": ["string", "null"],
                "pattern": "^[0-9a-f]{64}$",
                "description": "Of the whole file when final=true, else null.",
            },
        },
    },
    "Stat": {
        "type": "object",
        "required": ["path", "type", "size", "mode", "mtime"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "type": {"enum": ["file", "dir", "symlink", "other"]},
            "size": {"type": "integer", "minimum": 0},
            "mode": {"type": "integer", "minimum": 0, "description": "Permission bits."},
            "mtime": {"type": "number"},
        },
    },
    "PtyRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "id": {
                "type": ["string", "null"],
                "pattern": "^[A-Za-z0-9._-]{1,128}$",
                "description": "Idempotency key, as for exec: the same id with the same body "
                "returns the existing session, with a different body it is a 409 id_conflict.",
            },
            "command": {
                "oneOf": [
                    {"type": "string", "minLength": 1, "pattern": _NO_NUL},
                    {
                        "type": "array",
                        "minItems": 1,
                        "prefixItems": [{"type": "string", "minLength": 1, "pattern": _NO_NUL}],
                        "items": {"type": "string", "pattern": _NO_NUL},
                    },
                    {"type": "null"},
                ],
                "description": "A string runs as [shell, -c, command]; a list is the argv; "
                "null (the default) is an interactive shell: `shell`, else bash if it is on "
                "PATH, else /bin/sh.",
            },
            "shell": {"type": ["string", "null"], "minLength": 1, "pattern": _NO_NUL},
            "cwd": {"type": ["string", "null"], "pattern": ABSOLUTE_PATTERN},
            "env": {
                "type": ["object", "null"],
                "propertyNames": {"minLength": 1, "pattern": "^[^=\\x00]*$"},
                "additionalProperties": {"type": "string", "pattern": _NO_NUL},
                "description": "Added to the agent's environment; a terminal also gets "
                "TERM=xterm-256color unless this sets TERM.",
            },
            "user": {
                "oneOf": [
                    {"type": "string", "minLength": 1, "pattern": _NO_NUL},
                    {"type": "integer", "minimum": 0, "maximum": MAX_UID},
                    {"type": "null"},
                ],
                "description": "As for exec: a uid or a user name of the sandbox's passwd.",
            },
            "rows": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": MAX_TERMINAL_SIZE,
                "default": 24,
            },
            "cols": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": MAX_TERMINAL_SIZE,
                "default": 80,
            },
            "pty": {
                "type": "boolean",
                "default": True,
                "description": "true: a terminal (all output on stdout); false: pipes, stdout "
                "and stderr apart, rows and cols unused.",
            },
        },
    },
    "PtySession": {
        "type": "object",
        "required": [
            "id",
            "mode",
            "state",
            "exit_code",
            "signal",
            "error",
            "rows",
            "cols",
            "started_at",
            "duration_ms",
            "stdout_offset",
            "stderr_offset",
            "input_offset",
            "input_pending",
        ],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$"},
            "mode": {"enum": ["pty", "pipe"]},
            "state": {"enum": list(PTY_STATES)},
            "exit_code": {"type": ["integer", "null"]},
            "signal": {"type": ["integer", "null"]},
            "error": {
                "type": ["string", "null"],
                "description": "Why the process could not start (state failed).",
            },
            "rows": {"type": "integer", "minimum": 1, "maximum": MAX_TERMINAL_SIZE},
            "cols": {"type": "integer", "minimum": 1, "maximum": MAX_TERMINAL_SIZE},
            "started_at": {"type": "number", "description": "Unix time in seconds."},
            "duration_ms": {"type": "number", "minimum": 0},
            "stdout_offset": {
                "type": "integer",
                "minimum": 0,
                "description": "Bytes of output produced so far (the terminal's in pty mode).",
            },
            "stderr_offset": {"type": "integer", "minimum": 0},
            "input_offset": {
                "type": "integer",
                "minimum": 0,
                "description": "Bytes of input received so far: where the next chunk starts.",
            },
            "input_pending": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_PTY_INPUT_BYTES,
                "description": "Received bytes the program has not read yet.",
            },
        },
    },
    "PtyOutput": {
        "type": "object",
        "required": [
            "id",
            "stream",
            "offset",
            "next_offset",
            "skipped",
            "data",
            "eof",
            "state",
            "exit_code",
            "signal",
        ],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string"},
            "stream": {"enum": ["stdout", "stderr"]},
            "offset": {"type": "integer", "minimum": 0, "description": "Of data's first byte."},
            "next_offset": {
                "type": "integer",
                "minimum": 0,
                "description": "Where the next read starts.",
            },
            "skipped": {
                "type": "integer",
                "minimum": 0,
                "description": "Bytes between the requested offset and `offset` that are no "
                f"longer kept: each stream keeps its last {PTY_BUFFER_BYTES} bytes, and drops "
                "only bytes a read has moved past (or all of them on DELETE).",
            },
            "data": {
                "type": "string",
                "contentEncoding": "base64",
                "description": f"At most max_bytes ({MAX_PTY_READ_BYTES} by default) bytes.",
            },
            "eof": {
                "type": "boolean",
                "description": "The session has ended and this is the end of the stream.",
            },
            "state": {"enum": list(PTY_STATES)},
            "exit_code": {"type": ["integer", "null"]},
            "signal": {"type": ["integer", "null"]},
        },
    },
    "PtyInputResult": {
        "type": "object",
        "required": ["id", "input_offset", "input_pending"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string"},
            "input_offset": {"type": "integer", "minimum": 0},
            "input_pending": {"type": "integer", "minimum": 0, "maximum": MAX_PTY_INPUT_BYTES},
        },
    },
    "PtyResize": {
        "type": "object",
        "required": ["rows", "cols"],
        "additionalProperties": False,
        "properties": {
            "rows": {"type": "integer", "minimum": 1, "maximum": MAX_TERMINAL_SIZE},
            "cols": {"type": "integer", "minimum": 1, "maximum": MAX_TERMINAL_SIZE},
        },
    },
    "PtySignal": {
        "type": "object",
        "required": ["signal"],
        "additionalProperties": False,
        "properties": {"signal": {"enum": list(PTY_SIGNALS)}},
    },
}
