"""The machine-readable contract (OpenAPI 3.1), kept as code so the binary needs no data files.

`agent/openapi.json` in the repository is this document rendered with
`python -m sandbox_agent._openapi > agent/openapi.json`; a test checks that the file, the
document served at GET /v1/openapi.json and the server's routes agree, and the contract tests
validate every JSON response against the schemas. Nothing is written here by hand: the schemas
are the declarations of `contract.py` (`_wire.schema`), and the paths, parameters, bodies and
answers are the endpoint table of `endpoints.py`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from . import __version__
from ._wire import schema
from .contract import ACTOR_ID_HEADER, MESSAGES, ErrorBody
from .endpoints import (
    COMMON_ERRORS,
    ENDPOINTS,
    AnyObject,
    Body,
    Bytes,
    Endpoint,
    Param,
)

__all__ = ["openapi_document"]

_ACTOR_PARAM = {
    "name": ACTOR_ID_HEADER,
    "in": "header",
    "required": False,
    "description": "The actor id the caller expects; a different known id gives 409.",
    "schema": {"type": "string"},
}


def _content(shape: type) -> dict[str, Any]:
    if shape is Bytes:
        return {"application/octet-stream": {"schema": {}}}
    if shape is AnyObject:
        return {"application/json": {"schema": {"type": "object"}}}
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape.__name__}"}}}


def _answer(description: str, shape: type, head: bool) -> dict[str, Any]:
    """An answer; HEAD answers carry the status and headers only."""
    if head:
        return {"description": description}
    return {"description": description, "content": _content(shape)}


def _param(param: Param) -> dict[str, Any]:
    out: dict[str, Any] = {"name": param.name, "in": param.where, "required": param.required}
    if param.doc is not None:
        out["description"] = param.doc
    spec = param.kind.schema()
    if param.default is not None:
        spec["default"] = param.kind.shown(param.default)
    out["schema"] = spec
    return out


def _request_body(body: Body) -> dict[str, Any]:
    out: dict[str, Any] = {"required": body.required, "content": _content(body.shape)}
    if body.doc is not None:
        out["description"] = body.doc
    return out


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    """One endpoint of the table as an OpenAPI operation."""
    head = endpoint.method == "HEAD"
    segments = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in endpoint.path_params
    ]
    out: dict[str, Any] = {"operationId": endpoint.name}
    if endpoint.public:
        out["security"] = []
    out["parameters"] = [*segments, *map(_param, endpoint.params), _ACTOR_PARAM]
    if endpoint.body is not None:
        out["requestBody"] = _request_body(endpoint.body)
    links = {
        link.name: {
            "operationId": link.operation,
            "parameters": {link.parameter: f"$response.body#/{link.field}"},
        }
        for link in endpoint.links
    }
    responses: dict[str, Any] = {}
    for answer in endpoint.answers:
        responses[str(answer.status)] = _answer(answer.doc, answer.shape, head)
        if links:
            responses[str(answer.status)]["links"] = links
    for status, description in COMMON_ERRORS:
        if not (endpoint.public and status == 401):
            responses[str(status)] = _answer(description, ErrorBody, head)
    for status, description in endpoint.errors:
        responses[str(status)] = _answer(description, ErrorBody, head)
    out["responses"] = responses
    return out


def openapi_document() -> dict[str, Any]:
    """The contract v1 document served at GET /v1/openapi.json."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
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
        "paths": paths,
    }


if __name__ == "__main__":
    json.dump(openapi_document(), sys.stdout, indent=2)
    sys.stdout.write("\n")
