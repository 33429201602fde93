"""The machine-readable contract (OpenAPI 3.1), kept as code so the binary needs no data files.

`agent/openapi.json` in the repository is this document rendered with
`python -m sandbox_agent._openapi > agent/openapi.json`; a test checks that the file, the
document served at GET /v1/openapi.json and the server's routes agree, and the contract tests
validate every JSON response against the schemas below.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from . import __version__
from .contract import (
    ACTOR_ID_HEADER,
    DEFAULT_MAX_OUTPUT_BYTES,
    ERROR_CODES,
    JOB_STATES,
    MAX_FILE_OFFSET,
    MAX_OUTPUT_BYTES,
    MAX_PTY_INPUT_BYTES,
    MAX_PTY_READ_BYTES,
    MAX_PTY_SESSIONS,
    MAX_TERMINAL_SIZE,
    MAX_TIMEOUT_S,
    MAX_UID,
    MAX_WAIT_S,
    PTY_BUFFER_BYTES,
    PTY_SIGNALS,
    PTY_STATES,
)

__all__ = ["openapi_document"]


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _err(description: str) -> dict[str, Any]:
    return _json("Error", description)


def _no_body(description: str) -> dict[str, Any]:
    return {"description": description}


# Patterns are written for ECMA-262, Python's re and Rust's regex alike: `\x00` for NUL, and
# `[0-9]` for digits (`\d` means every Unicode digit in Python).
_NO_NUL = "^[^\\x00]*$"
_ABSOLUTE = "^/[^\\x00]*$"
# A file path: absolute, no NUL, and its last segment names something (not "", "." or ".."),
# so that it cannot normalise to "/" or to a parent directory.
_FILE_PATH = "^/([^\\x00]*/)?([^/\\x00]*[^./\\x00][^/\\x00]*|[.]{3,})$"

# Answers any operation can give: the HTTP parser refuses the request (400), a token is missing
# (401), the headers arrive too slowly (408), the actor id differs (409).
_COMMON_ERRORS = {
    "400": _err("Malformed HTTP (the request line or a header over 8190 bytes, and so on)."),
    "401": _err("Missing or wrong bearer token (only when the agent has a token)."),
    "408": _err("`request_timeout`: the request's headers or body did not arrive in time."),
    "409": _err("`actor_mismatch`: X-Sandbox-Actor-Id differs from this sandbox's actor id."),
}
# HEAD answers carry no body.
_HEAD_ERRORS = {status: _no_body(resp["description"]) for status, resp in _COMMON_ERRORS.items()}

_FILE_PATH_PARAM = {
    "name": "path",
    "in": "query",
    "required": True,
    "description": "Absolute path of a file inside the sandbox (not ending in /, . or ..).",
    "schema": {"type": "string", "pattern": _FILE_PATH},
}

_STAT_PATH_PARAM = {
    "name": "path",
    "in": "query",
    "required": True,
    "description": "Absolute path inside the sandbox.",
    "schema": {"type": "string", "pattern": _ABSOLUTE},
}

_WAIT_PARAM = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": "Seconds to wait for the job to finish, as a JSON number (0 to 8, default 0).",
    "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": 0},
}

_PTY_WAIT_PARAM = {
    **_WAIT_PARAM,
    "description": "Seconds to wait for the session to end, as a JSON number (0 to 8, default 0).",
}

_ACTOR_PARAM = {
    "name": ACTOR_ID_HEADER,
    "in": "header",
    "required": False,
    "description": "The actor id the caller expects; a different known id gives 409.",
    "schema": {"type": "string"},
}

_RANGE_PARAM = {
    "name": "Range",
    "in": "header",
    "required": False,
    "description": "A single range: bytes=a-b, bytes=a- or bytes=-n (positions at most "
    f"{MAX_FILE_OFFSET}, END not before START).",
    "schema": {
        "type": "string",
        "pattern": "^[Bb][Yy][Tt][Ee][Ss]=([0-9]{1,18}-[0-9]{0,18}|-[0-9]{1,18})$",
    },
}

_SCHEMAS: dict[str, Any] = {
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
            "cwd": {"type": ["string", "null"], "pattern": _ABSOLUTE},
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
            "cwd": {"type": ["string", "null"], "pattern": _ABSOLUTE},
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


# Links for stateful testing (and for readers): where a response's values are used next.
_JOB_LINKS = {
    "GetJob": {"operationId": "execGet", "parameters": {"job_id": "$response.body#/id"}},
    "KillJob": {"operationId": "execKill", "parameters": {"job_id": "$response.body#/id"}},
}
_FILE_LINKS = {
    "GetFile": {"operationId": "fileGet", "parameters": {"path": "$response.body#/path"}},
    "HeadFile": {"operationId": "fileHead", "parameters": {"path": "$response.body#/path"}},
    "StatFile": {"operationId": "stat", "parameters": {"path": "$response.body#/path"}},
}


_PTY_LINKS = {
    name: {"operationId": op, "parameters": {"session_id": "$response.body#/id"}}
    for name, op in (
        ("GetSession", "ptyGet"),
        ("ReadOutput", "ptyOutput"),
        ("WriteInput", "ptyInput"),
        ("Resize", "ptyResize"),
        ("Signal", "ptySignal"),
        ("CloseSession", "ptyClose"),
    )
}


def _with_links(response: dict[str, Any], links: dict[str, Any]) -> dict[str, Any]:
    return {**response, "links": links}


def _file_get(operation_id: str, head: bool) -> dict[str, Any]:
    """GET and HEAD /v1/files: one handler, HEAD without the bodies."""

    def answer(description: str, schema: str | None) -> dict[str, Any]:
        if head:
            return _no_body(description)
        if schema is None:
            octets: dict[str, Any] = {"application/octet-stream": {"schema": {}}}
            return {"description": description, "content": octets}
        return _json(schema, description)

    return {
        "operationId": operation_id,
        "parameters": [_FILE_PATH_PARAM, _RANGE_PARAM, _ACTOR_PARAM],
        "responses": {
            "200": answer("The whole file, with Content-Length.", None),
            "206": answer("The requested range, with Content-Range.", None),
            **(_HEAD_ERRORS if head else _COMMON_ERRORS),
            "400": answer(
                "A directory or another non-file, a malformed Range, or `name_too_long`, "
                "`too_many_links`.",
                "Error",
            ),
            "403": answer("`permission_denied`.", "Error"),
            "404": answer("No such file.", "Error"),
            "416": answer("The range starts past the end of the file.", "Error"),
        },
    }


def openapi_document() -> dict[str, Any]:
    """The contract v1 document served at GET /v1/openapi.json."""
    job_id_param = {
        "name": "job_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    session_id_param = {
        "name": "session_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sandbox-agent",
            "version": __version__,
            "description": "Contract v1 of the in-sandbox agent. Every error body is "
            '{"error": {"code", "message"}}. With a token configured, every request '
            "except GET /readyz needs Authorization: Bearer <token>.",
        },
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "security": [],
                    "parameters": [_ACTOR_PARAM],
                    "responses": {
                        "200": _json("Ready", "The agent serves; identity read now."),
                        **{k: v for k, v in _COMMON_ERRORS.items() if k != "401"},
                    },
                }
            },
            "/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "parameters": [_ACTOR_PARAM],
                    "responses": {
                        "200": {
                            "description": "This document.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_COMMON_ERRORS,
                    },
                }
            },
            "/v1/exec": {
                "post": {
                    "operationId": "execStart",
                    "parameters": [_WAIT_PARAM, _ACTOR_PARAM],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("ExecRequest")}},
                    },
                    "responses": {
                        "200": _with_links(
                            _json("Job", "The job finished within `wait`."), _JOB_LINKS
                        ),
                        "202": _with_links(_json("Job", "The job is still running."), _JOB_LINKS),
                        **_COMMON_ERRORS,
                        "400": _err(
                            "Malformed JSON, a wrong field, an unknown user, a bad `wait`."
                        ),
                        "409": _err("`id_conflict` or `actor_mismatch`."),
                        "413": _err("The JSON body is larger than 16 MiB."),
                        "429": _err("`too_many_jobs`: too many jobs running at once."),
                        "503": _err("`shutting_down`: the agent is stopping."),
                    },
                }
            },
            "/v1/exec/{job_id}": {
                "get": {
                    "operationId": "execGet",
                    "parameters": [job_id_param, _WAIT_PARAM, _ACTOR_PARAM],
                    "responses": {
                        "200": _json("Job", "The job, after waiting up to `wait` seconds."),
                        **_COMMON_ERRORS,
                        "400": _err("A bad `wait`."),
                        "404": _err("Unknown job id."),
                    },
                },
                "delete": {
                    "operationId": "execKill",
                    "parameters": [job_id_param, _ACTOR_PARAM],
                    "responses": {
                        "200": _json(
                            "Job",
                            "The job after its process group was killed (SIGTERM, SIGKILL "
                            "after 2 s); a finished job is returned unchanged.",
                        ),
                        **_COMMON_ERRORS,
                        "404": _err("Unknown job id."),
                    },
                },
            },
            "/v1/files": {
                "put": {
                    "operationId": "filePut",
                    "parameters": [
                        _FILE_PATH_PARAM,
                        {
                            "name": "offset",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": 0,
                                "maximum": MAX_FILE_OFFSET,
                                "default": 0,
                            },
                            "description": "Where this chunk goes; 0 starts the upload afresh.",
                        },
                        {
                            "name": "final",
                            "in": "query",
                            "schema": {"type": "boolean", "default": True},
                            "description": "true: fsync and atomically rename into place "
                            "(true, false, 1 or 0).",
                        },
                        {
                            "name": "mode",
                            "in": "query",
                            "schema": {
                                "type": "string",
                                "pattern": "^(0o)?[0-7]{1,4}$",
                                "default": "0644",
                            },
                            "description": "Permission bits, applied when the file is final.",
                        },
                        _ACTOR_PARAM,
                    ],
                    "requestBody": {
                        "required": False,
                        "content": {"application/octet-stream": {"schema": {}}},
                        "description": "Raw bytes, at most 64 MiB per request; none is an "
                        "empty chunk.",
                    },
                    "responses": {
                        "200": _with_links(
                            _json("UploadResult", "The chunk (or the whole file) is stored."),
                            _FILE_LINKS,
                        ),
                        **_COMMON_ERRORS,
                        "400": _err(
                            "A directory, a parent that is not one, a bad parameter, or "
                            "`name_too_long`, `too_many_links`."
                        ),
                        "403": _err("`permission_denied` or `read_only`."),
                        "409": _err(
                            "`offset_mismatch`, `actor_mismatch`, or `busy` (the target is a "
                            "mount point or a running program)."
                        ),
                        "413": _err(
                            "`too_large`: the body exceeds 64 MiB, or the file the largest "
                            "the file system holds."
                        ),
                        "507": _err(
                            "`no_space`: the file system is full or over quota; the bytes "
                            "received so far are kept, so the upload can resume."
                        ),
                    },
                },
                "get": _file_get("fileGet", head=False),
                "head": _file_get("fileHead", head=True),
            },
            "/v1/pty": {
                "post": {
                    "operationId": "ptyCreate",
                    "parameters": [_ACTOR_PARAM],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("PtyRequest")}},
                    },
                    "responses": {
                        "200": _with_links(
                            _json(
                                "PtySession",
                                "The session, running (or failed: the process could not "
                                "start, `error` says why).",
                            ),
                            _PTY_LINKS,
                        ),
                        **_COMMON_ERRORS,
                        "400": _err("Malformed JSON, a wrong field, an unknown user."),
                        "409": _err("`id_conflict` or `actor_mismatch`."),
                        "413": _err("The JSON body is larger than 16 MiB."),
                        "429": _err(
                            f"`too_many_sessions`: {MAX_PTY_SESSIONS} sessions are running."
                        ),
                        "503": _err("`shutting_down`: the agent is stopping."),
                    },
                }
            },
            "/v1/pty/{session_id}": {
                "get": {
                    "operationId": "ptyGet",
                    "parameters": [session_id_param, _PTY_WAIT_PARAM, _ACTOR_PARAM],
                    "responses": {
                        "200": _json("PtySession", "The session, after waiting up to `wait`."),
                        **_COMMON_ERRORS,
                        "400": _err("A bad `wait`."),
                        "404": _err("Unknown session id."),
                    },
                },
                "delete": {
                    "operationId": "ptyClose",
                    "parameters": [session_id_param, _ACTOR_PARAM],
                    "responses": {
                        "200": _json(
                            "PtySession",
                            "The session after its process group got SIGHUP and SIGTERM "
                            "(SIGKILL after 2 s), its buffers dropped; an ended session is "
                            "returned unchanged.",
                        ),
                        **_COMMON_ERRORS,
                        "404": _err("Unknown session id."),
                    },
                },
            },
            "/v1/pty/{session_id}/output": {
                "get": {
                    "operationId": "ptyOutput",
                    "parameters": [
                        session_id_param,
                        {
                            "name": "stream",
                            "in": "query",
                            "schema": {"enum": ["stdout", "stderr"], "default": "stdout"},
                            "description": "stderr is separate only in pipe mode.",
                        },
                        {
                            "name": "offset",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": 0,
                                "maximum": MAX_FILE_OFFSET,
                                "default": 0,
                            },
                            "description": "The first byte wanted; bytes before it may be "
                            "dropped from now on.",
                        },
                        {
                            "name": "max_bytes",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": MAX_PTY_READ_BYTES,
                                "default": MAX_PTY_READ_BYTES,
                            },
                        },
                        {
                            **_PTY_WAIT_PARAM,
                            "description": "Seconds to wait for a byte at `offset` (0 to 8, "
                            "default 0).",
                        },
                        _ACTOR_PARAM,
                    ],
                    "responses": {
                        "200": _json(
                            "PtyOutput",
                            "The bytes from `offset` (none if nothing came within `wait`).",
                        ),
                        **_COMMON_ERRORS,
                        "400": _err("A bad parameter."),
                        "404": _err("Unknown session id."),
                        "409": _err(
                            "`offset_mismatch` (past the bytes produced so far) or "
                            "`actor_mismatch`."
                        ),
                    },
                }
            },
            "/v1/pty/{session_id}/input": {
                "post": {
                    "operationId": "ptyInput",
                    "parameters": [
                        session_id_param,
                        {
                            "name": "offset",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_FILE_OFFSET},
                            "description": "Where the body starts in the session's input; "
                            "bytes already received are skipped. Omitted: appended as is.",
                        },
                        _ACTOR_PARAM,
                    ],
                    "requestBody": {
                        "required": False,
                        "content": {"application/octet-stream": {"schema": {}}},
                        "description": f"Raw bytes, at most {MAX_PTY_INPUT_BYTES}.",
                    },
                    "responses": {
                        "200": _json("PtyInputResult", "Received; the program reads them."),
                        **_COMMON_ERRORS,
                        "400": _err("A bad `offset`."),
                        "404": _err("Unknown session id."),
                        "409": _err(
                            "`offset_mismatch` (past the input received so far), `busy` "
                            f"(over {MAX_PTY_INPUT_BYTES} bytes not read by the program yet), "
                            "`session_ended` or `actor_mismatch`."
                        ),
                        "413": _err(f"`too_large`: a body over {MAX_PTY_INPUT_BYTES} bytes."),
                    },
                }
            },
            "/v1/pty/{session_id}/resize": {
                "post": {
                    "operationId": "ptyResize",
                    "parameters": [session_id_param, _ACTOR_PARAM],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("PtyResize")}},
                    },
                    "responses": {
                        "200": _json("PtySession", "Resized (the foreground job gets SIGWINCH)."),
                        **_COMMON_ERRORS,
                        "400": _err("Malformed JSON or a size out of range."),
                        "404": _err("Unknown session id."),
                        "409": _err("`session_ended` or `actor_mismatch`."),
                        "413": _err("The JSON body is larger than 16 MiB."),
                    },
                }
            },
            "/v1/pty/{session_id}/signal": {
                "post": {
                    "operationId": "ptySignal",
                    "parameters": [session_id_param, _ACTOR_PARAM],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("PtySignal")}},
                    },
                    "responses": {
                        "200": _json("PtySession", "Sent to the session's process group."),
                        **_COMMON_ERRORS,
                        "400": _err("Malformed JSON or an unknown signal name."),
                        "404": _err("Unknown session id."),
                        "409": _err("`session_ended` or `actor_mismatch`."),
                        "413": _err("The JSON body is larger than 16 MiB."),
                    },
                }
            },
            "/v1/stat": {
                "get": {
                    "operationId": "stat",
                    "parameters": [_STAT_PATH_PARAM, _ACTOR_PARAM],
                    "responses": {
                        "200": _json("Stat", "What is at the path (symlinks not followed)."),
                        **_COMMON_ERRORS,
                        "400": _err("`name_too_long` or `too_many_links`."),
                        "403": _err("`permission_denied`."),
                        "404": _err("Nothing at the path."),
                    },
                }
            },
        },
    }


if __name__ == "__main__":
    json.dump(openapi_document(), sys.stdout, indent=2)
    sys.stdout.write("\n")
