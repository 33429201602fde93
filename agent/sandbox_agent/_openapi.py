"""The machine-readable contract (OpenAPI 3.1), kept as code so the binary needs no data files.

`agent/openapi.json` in the repository is this document rendered with
`python -m sandbox_agent._openapi > agent/openapi.json`; a test checks that the file, the
document served at GET /v1/openapi.json and the server's routes agree, and the contract tests
validate every JSON response against the schemas. The schemas are derived from the declarations
in `contract.py` (`_wire.schema`); only paths, parameters and responses are written here.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from . import __version__
from ._fields import ABSOLUTE_PATTERN, FILE_PATH_PATTERN
from ._wire import schema
from .contract import (
    ACTOR_ID_HEADER,
    MAX_FILE_OFFSET,
    MAX_PTY_INPUT_BYTES,
    MAX_PTY_READ_BYTES,
    MAX_PTY_SESSIONS,
    MAX_WAIT_S,
    MESSAGES,
)

__all__ = ["openapi_document"]


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _err(description: str) -> dict[str, Any]:
    return _json("ErrorBody", description)


def _no_body(description: str) -> dict[str, Any]:
    return {"description": description}


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
    "schema": {"type": "string", "pattern": FILE_PATH_PATTERN},
}

_STAT_PATH_PARAM = {
    "name": "path",
    "in": "query",
    "required": True,
    "description": "Absolute path inside the sandbox.",
    "schema": {"type": "string", "pattern": ABSOLUTE_PATTERN},
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

_JOB_ID_PARAM = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}

_SESSION_ID_PARAM = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
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
                "ErrorBody",
            ),
            "403": answer("`permission_denied`.", "ErrorBody"),
            "404": answer("No such file.", "ErrorBody"),
            "416": answer("The range starts past the end of the file.", "ErrorBody"),
        },
    }


def openapi_document() -> dict[str, Any]:
    """The contract v1 document served at GET /v1/openapi.json."""
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
            "schemas": {decl.__name__: schema(decl) for decl in MESSAGES},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            **_service_paths(),
            **_exec_paths(),
            **_file_paths(),
            **_pty_paths(),
            **_pty_output_path(),
            **_pty_control_paths(),
            **_stat_path(),
        },
    }


def _service_paths() -> dict[str, Any]:
    """GET /readyz and GET /v1/openapi.json."""
    return {
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "security": [],
                "parameters": [_ACTOR_PARAM],
                "responses": {
                    "200": _json("Readiness", "The agent serves; identity read now."),
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
    }


def _exec_paths() -> dict[str, Any]:
    """Exec jobs: start, poll, kill."""
    return {
        "/v1/exec": {
            "post": {
                "operationId": "execStart",
                "parameters": [_WAIT_PARAM, _ACTOR_PARAM],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("ExecRequest")}},
                },
                "responses": {
                    "200": _with_links(_json("Job", "The job finished within `wait`."), _JOB_LINKS),
                    "202": _with_links(_json("Job", "The job is still running."), _JOB_LINKS),
                    **_COMMON_ERRORS,
                    "400": _err("Malformed JSON, a wrong field, an unknown user, a bad `wait`."),
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
                "parameters": [_JOB_ID_PARAM, _WAIT_PARAM, _ACTOR_PARAM],
                "responses": {
                    "200": _json("Job", "The job, after waiting up to `wait` seconds."),
                    **_COMMON_ERRORS,
                    "400": _err("A bad `wait`."),
                    "404": _err("Unknown job id."),
                },
            },
            "delete": {
                "operationId": "execKill",
                "parameters": [_JOB_ID_PARAM, _ACTOR_PARAM],
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
    }


def _file_paths() -> dict[str, Any]:
    """Files: chunked upload, download (GET, HEAD)."""
    return {
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
                    "description": "Raw bytes, at most 64 MiB per request; none is an empty chunk.",
                },
                "responses": {
                    "200": _with_links(
                        _json("UploadReply", "The chunk (or the whole file) is stored."),
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
    }


def _pty_paths() -> dict[str, Any]:
    """PTY sessions: create, poll, close."""
    return {
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
                    "429": _err(f"`too_many_sessions`: {MAX_PTY_SESSIONS} sessions are running."),
                    "503": _err("`shutting_down`: the agent is stopping."),
                },
            }
        },
        "/v1/pty/{session_id}": {
            "get": {
                "operationId": "ptyGet",
                "parameters": [_SESSION_ID_PARAM, _PTY_WAIT_PARAM, _ACTOR_PARAM],
                "responses": {
                    "200": _json("PtySession", "The session, after waiting up to `wait`."),
                    **_COMMON_ERRORS,
                    "400": _err("A bad `wait`."),
                    "404": _err("Unknown session id."),
                },
            },
            "delete": {
                "operationId": "ptyClose",
                "parameters": [_SESSION_ID_PARAM, _ACTOR_PARAM],
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
    }


def _pty_output_path() -> dict[str, Any]:
    """Reading a PTY session's output by offset."""
    return {
        "/v1/pty/{session_id}/output": {
            "get": {
                "operationId": "ptyOutput",
                "parameters": [
                    _SESSION_ID_PARAM,
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
                        "`offset_mismatch` (past the bytes produced so far) or `actor_mismatch`."
                    ),
                },
            }
        },
    }


def _pty_control_paths() -> dict[str, Any]:
    """Input, resize and signals of a PTY session."""
    return {
        "/v1/pty/{session_id}/input": {
            "post": {
                "operationId": "ptyInput",
                "parameters": [
                    _SESSION_ID_PARAM,
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
                    "200": _json("PtyInputReply", "Received; the program reads them."),
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
                "parameters": [_SESSION_ID_PARAM, _ACTOR_PARAM],
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
                "parameters": [_SESSION_ID_PARAM, _ACTOR_PARAM],
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
    }


def _stat_path() -> dict[str, Any]:
    """GET /v1/stat."""
    return {
        "/v1/stat": {
            "get": {
                "operationId": "stat",
                "parameters": [_STAT_PATH_PARAM, _ACTOR_PARAM],
                "responses": {
                    "200": _json("FileStat", "What is at the path (symlinks not followed)."),
                    **_COMMON_ERRORS,
                    "400": _err("`name_too_long` or `too_many_links`."),
                    "403": _err("`permission_denied`."),
                    "404": _err("Nothing at the path."),
                },
            }
        },
    }


if __name__ == "__main__":
    json.dump(openapi_document(), sys.stdout, indent=2)
    sys.stdout.write("\n")
