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
from .contract import ACTOR_ID_HEADER, ERROR_CODES, JOB_STATES, MAX_OUTPUT_BYTES

__all__ = ["openapi_document"]


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _err(description: str) -> dict[str, Any]:
    return _json("Error", description)


_COMMON_ERRORS = {
    "401": _err("Missing or wrong bearer token (only when the agent has a token)."),
    "409": _err("`actor_mismatch`: X-Sandbox-Actor-Id differs from this sandbox's actor id."),
}

_PATH_PARAM = {
    "name": "path",
    "in": "query",
    "required": True,
    "description": "Absolute path inside the sandbox.",
    "schema": {"type": "string", "pattern": "^/"},
}

_WAIT_PARAM = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": "Seconds to wait for the job to finish (0 to 8, default 0).",
    "schema": {"type": "number", "minimum": 0, "maximum": 8, "default": 0},
}

_ACTOR_PARAM = {
    "name": ACTOR_ID_HEADER,
    "in": "header",
    "required": False,
    "description": "The actor id the caller expects; a different known id gives 409.",
    "schema": {"type": "string"},
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
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                ],
                "description": "A string runs as [shell, -c, command]; a list is the argv.",
            },
            "shell": {"type": ["string", "null"], "default": "/bin/sh"},
            "cwd": {"type": ["string", "null"], "pattern": "^/"},
            "env": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "string"},
                "description": "Added to the agent's environment.",
            },
            "timeout_s": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "maximum": 100_000_000,
                "description": "Seconds; null for no timeout.",
            },
            "stdin": {"type": ["string", "null"]},
            "user": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "integer", "minimum": 0},
                    {"type": "null"},
                ],
                "description": "User name or numeric uid to run as; an unknown name is a 400.",
            },
            "max_output_bytes": {
                "type": ["integer", "null"],
                "minimum": 0,
                "maximum": MAX_OUTPUT_BYTES,
                "default": 16 * 1024 * 1024,
                "description": "Per stream; beyond it the head and the tail are kept.",
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
}


def openapi_document() -> dict[str, Any]:
    """The contract v1 document served at GET /v1/openapi.json."""
    job_id_param = {
        "name": "job_id",
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
                        "409": _COMMON_ERRORS["409"],
                    },
                }
            },
            "/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
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
                        "200": _json("Job", "The job finished within `wait`."),
                        "202": _json("Job", "The job is still running."),
                        "400": _err("Malformed JSON, a wrong field, an unknown user."),
                        **_COMMON_ERRORS,
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
                        "400": _err("A bad `wait`."),
                        "404": _err("Unknown job id."),
                        **_COMMON_ERRORS,
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
                        "404": _err("Unknown job id."),
                        **_COMMON_ERRORS,
                    },
                },
            },
            "/v1/files": {
                "put": {
                    "operationId": "filePut",
                    "parameters": [
                        _PATH_PARAM,
                        {
                            "name": "offset",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 0, "default": 0},
                            "description": "Where this chunk goes; 0 starts the upload afresh.",
                        },
                        {
                            "name": "final",
                            "in": "query",
                            "schema": {"type": "boolean", "default": True},
                            "description": "true: fsync and atomically rename into place.",
                        },
                        {
                            "name": "mode",
                            "in": "query",
                            "schema": {
                                "type": "string",
                                "pattern": "^(0o)?[0-7]{1,4}$",
                                "default": "0644",
                            },
                        },
                        _ACTOR_PARAM,
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/octet-stream": {"schema": {}}},
                        "description": "Raw bytes, at most 64 MiB per request.",
                    },
                    "responses": {
                        "200": _json("UploadResult", "The chunk (or the whole file) is stored."),
                        "400": _err("Relative path, a directory, a bad parameter."),
                        **_COMMON_ERRORS,
                        "403": _err("`permission_denied`."),
                        "409": _err("`offset_mismatch` or `actor_mismatch`."),
                        "413": _err("`too_large`: the body exceeds 64 MiB."),
                    },
                },
                "get": {
                    "operationId": "fileGet",
                    "parameters": [
                        _PATH_PARAM,
                        {
                            "name": "Range",
                            "in": "header",
                            "schema": {"type": "string"},
                            "description": "A single range: bytes=a-b, bytes=a- or bytes=-n.",
                        },
                        _ACTOR_PARAM,
                    ],
                    "responses": {
                        "200": {
                            "description": "The whole file, with Content-Length.",
                            "content": {"application/octet-stream": {"schema": {}}},
                        },
                        "206": {
                            "description": "The requested range, with Content-Range.",
                            "content": {"application/octet-stream": {"schema": {}}},
                        },
                        "400": _err("Relative path, a directory, a malformed Range."),
                        "404": _err("No such file."),
                        "416": _err("The range starts past the end of the file."),
                        **_COMMON_ERRORS,
                    },
                },
                "head": {
                    "operationId": "fileHead",
                    "parameters": [_PATH_PARAM, _ACTOR_PARAM],
                    "responses": {
                        "200": {"description": "Headers only; Content-Length is the size."},
                        "400": {"description": "Relative path or a directory."},
                        "404": {"description": "No such file."},
                    },
                },
            },
            "/v1/stat": {
                "get": {
                    "operationId": "stat",
                    "parameters": [_PATH_PARAM, _ACTOR_PARAM],
                    "responses": {
                        "200": _json("Stat", "What is at the path (symlinks not followed)."),
                        "400": _err("Relative path."),
                        "404": _err("Nothing at the path."),
                        **_COMMON_ERRORS,
                    },
                }
            },
        },
    }


if __name__ == "__main__":
    json.dump(openapi_document(), sys.stdout, indent=2)
    sys.stdout.write("\n")
