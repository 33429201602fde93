"""Contract v1's endpoints as data: method, path, query parameters and their ranges, bodies.

Each endpoint is declared once, in `ENDPOINTS`. Everything else is derived from the table:

- the agent registers its routes from it and parses every query parameter with it (`_routes`;
  a value out of range is a 400 whose message names the parameter and what it accepts);
- `_openapi` writes the document's paths, parameters, bodies and answers from it;
- the provider's client (`gym_substrate.nemo.agent_client`) builds each request from it (method,
  path, the names and the text of its query parameters) and checks each reply against it
  (`Endpoint.check_reply`: a status it does not declare, or a body missing a declared field or
  holding a wrong value, is refused with the endpoint and the field named).

The bodies are the messages of `contract.py`. Like `contract.py`, this module needs nothing beyond
the standard library, so the provider imports it without the agent's server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ._params import (
    AbsolutePath,
    Choice,
    Digits,
    Flag,
    Octal,
    Param,
    QueryError,
    Seconds,
    Text,
)
from ._wire import WireError, conforms
from .contract import (
    MAX_FILE_OFFSET,
    MAX_PTY_INPUT_BYTES,
    MAX_PTY_READ_BYTES,
    MAX_PTY_SESSIONS,
    MAX_WAIT_S,
    ExecRequest,
    FileStat,
    Job,
    PtyInputReply,
    PtyOutput,
    PtyRequest,
    PtyResize,
    PtySession,
    PtySignal,
    Readiness,
    UploadReply,
)

__all__ = [
    "COMMON_ERRORS",
    "ENDPOINTS",
    "EXEC_GET",
    "EXEC_KILL",
    "EXEC_START",
    "FILE_GET",
    "FILE_HEAD",
    "FILE_PUT",
    "OPENAPI",
    "PTY_CLOSE",
    "PTY_CREATE",
    "PTY_GET",
    "PTY_INPUT",
    "PTY_OUTPUT",
    "PTY_RESIZE",
    "PTY_SIGNAL",
    "READYZ",
    "STAT",
    "AbsolutePath",
    "Answer",
    "AnyObject",
    "Body",
    "Bytes",
    "Choice",
    "Digits",
    "Endpoint",
    "Flag",
    "Link",
    "Octal",
    "Param",
    "QueryError",
    "ReplyError",
    "Seconds",
    "Text",
]


class ReplyError(ValueError):
    """A reply that breaks its endpoint's declaration; the message names the endpoint and field."""


class Bytes:
    """A body of raw bytes (`application/octet-stream`)."""


class AnyObject:
    """A JSON object of no declared shape (the OpenAPI document)."""


@dataclass(frozen=True, slots=True)
class Body:
    """A request body: a message of `contract.py` as JSON, or `Bytes`."""

    shape: type
    required: bool = True
    doc: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """A success status and its body: a message of `contract.py`, `Bytes` or `AnyObject`."""

    status: int
    shape: type
    doc: str


@dataclass(frozen=True, slots=True)
class Link:
    """Where a reply's value is used next: `field` of the reply as `parameter` of `operation`."""

    name: str
    operation: str
    parameter: str
    field: str


_SEGMENT = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One operation: `name` is its OpenAPI operationId."""

    name: str
    method: str
    path: str
    answers: tuple[Answer, ...]
    errors: tuple[tuple[int, str], ...] = ()  # its own error answers, each an ErrorBody
    params: tuple[Param, ...] = ()
    body: Body | None = None
    public: bool = False  # no bearer token needed
    links: tuple[Link, ...] = ()

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(_SEGMENT.findall(self.path))

    @property
    def query_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.where == "query")

    @property
    def reply(self) -> type:
        """The shape of its success answers (one per endpoint)."""
        return self.answers[0].shape

    @property
    def what(self) -> str:
        return f"{self.method} {self.path}"

    def url(self, **segments: str) -> str:
        """The path with its `{segment}`s filled in (each must be given)."""
        if set(segments) != set(self.path_params):
            raise TypeError(f"{self.what} takes path segments {self.path_params}, got {segments}")
        return _SEGMENT.sub(lambda m: segments[m.group(1)], self.path)

    def query(self, values: Mapping[str, Any]) -> dict[str, str]:
        """The query string a client sends for `values`; an undeclared name is a `TypeError`."""
        declared = {p.name: p for p in self.query_params}
        unknown = sorted(set(values) - set(declared))
        if unknown:
            raise TypeError(f"{self.what} declares no query parameter(s) {unknown}")
        return {name: declared[name].text(value) for name, value in values.items()}

    def parse_query(self, raw: Mapping[str, str]) -> dict[str, Any]:
        """Every declared query parameter's value, in declaration order, or `QueryError`."""
        return {p.name: p.parse(raw.get(p.name)) for p in self.query_params}

    def check_reply(self, status: int, body: bytes) -> Any:
        """A success answer's parsed body, checked against its declaration, or `ReplyError`.

        Fields the declaration does not name are let through: a newer agent may add some.
        `Bytes` answers are returned as they are.
        """
        statuses = [a.status for a in self.answers]
        if status not in statuses:
            raise ReplyError(f"{self.what} answered {status}; the contract says {statuses}")
        shape = self.reply
        if shape is Bytes:
            return body
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ReplyError(f"{self.what} answered {status} with no JSON: {exc}") from None
        if shape is AnyObject:
            if not isinstance(value, dict):
                raise ReplyError(f"{self.what} answered {status} with no JSON object")
            return value
        try:
            conforms(shape, value, "the reply")
        except WireError as exc:
            msg = f"{self.what} answered {status} with a {shape.__name__} that breaks the contract"
            raise ReplyError(f"{msg}: {exc}") from None
        return value


# ----- the parameters several endpoints share

_WAIT = Param(
    "wait",
    Seconds(MAX_WAIT_S),
    default=0.0,
    doc="Seconds to wait for the job to finish, as a JSON number (0 to 8, default 0).",
)
_PTY_WAIT = Param(
    "wait",
    Seconds(MAX_WAIT_S),
    default=0.0,
    doc="Seconds to wait for the session to end, as a JSON number (0 to 8, default 0).",
)
_FILE_PATH = Param(
    "path",
    AbsolutePath(file=True),
    required=True,
    doc="Absolute path of a file inside the sandbox (not ending in /, . or ..).",
    example="/tmp/data.bin",
)
_RANGE = Param(
    "Range",
    Text("^[Bb][Yy][Tt][Ee][Ss]=([0-9]{1,18}-[0-9]{0,18}|-[0-9]{1,18})$"),
    doc="A single range: bytes=a-b, bytes=a- or bytes=-n (positions at most "
    f"{MAX_FILE_OFFSET}, END not before START).",
    where="header",
)
_OFFSET = Digits(0, MAX_FILE_OFFSET)

# Answers any endpoint can give: the HTTP parser refuses the request (400), a token is missing
# (401), the headers arrive too slowly (408), the actor id differs (409).
COMMON_ERRORS: Final = (
    (400, "Malformed HTTP (the request line or a header over 8190 bytes, and so on)."),
    (401, "Missing or wrong bearer token (only when the agent has a token)."),
    (408, "`request_timeout`: the request's headers or body did not arrive in time."),
    (409, "`actor_mismatch`: X-Sandbox-Actor-Id differs from this sandbox's actor id."),
)
_JSON_TOO_LARGE = (413, "The JSON body is larger than 16 MiB.")


def _links(parameter: str, field: str, *pairs: tuple[str, str]) -> tuple[Link, ...]:
    return tuple(Link(name, op, parameter, field) for name, op in pairs)


_JOB_LINKS = _links("job_id", "id", ("GetJob", "execGet"), ("KillJob", "execKill"))
_FILE_LINKS = _links(
    "path", "path", ("GetFile", "fileGet"), ("HeadFile", "fileHead"), ("StatFile", "stat")
)
_PTY_LINKS = _links(
    "session_id",
    "id",
    ("GetSession", "ptyGet"),
    ("ReadOutput", "ptyOutput"),
    ("WriteInput", "ptyInput"),
    ("Resize", "ptyResize"),
    ("Signal", "ptySignal"),
    ("CloseSession", "ptyClose"),
)

# ----- the table

READYZ: Final = Endpoint(
    "readyz",
    "GET",
    "/readyz",
    (Answer(200, Readiness, "The agent serves; identity read now."),),
    public=True,
)
OPENAPI: Final = Endpoint(
    "openapi", "GET", "/v1/openapi.json", (Answer(200, AnyObject, "This document."),)
)
EXEC_START: Final = Endpoint(
    "execStart",
    "POST",
    "/v1/exec",
    (
        Answer(200, Job, "The job finished within `wait`."),
        Answer(202, Job, "The job is still running."),
    ),
    (
        (400, "Malformed JSON, a wrong field, an unknown user, a bad `wait`."),
        (409, "`id_conflict` or `actor_mismatch`."),
        _JSON_TOO_LARGE,
        (429, "`too_many_jobs`: too many jobs running at once."),
        (503, "`shutting_down`: the agent is stopping."),
    ),
    params=(_WAIT,),
    body=Body(ExecRequest),
    links=_JOB_LINKS,
)
EXEC_GET: Final = Endpoint(
    "execGet",
    "GET",
    "/v1/exec/{job_id}",
    (Answer(200, Job, "The job, after waiting up to `wait` seconds."),),
    ((400, "A bad `wait`."), (404, "Unknown job id.")),
    params=(_WAIT,),
)
EXEC_KILL: Final = Endpoint(
    "execKill",
    "DELETE",
    "/v1/exec/{job_id}",
    (
        Answer(
            200,
            Job,
            "The job after its process group was killed (SIGTERM, SIGKILL after 2 s); a "
            "finished job is returned unchanged.",
        ),
    ),
    ((404, "Unknown job id."),),
)
FILE_PUT: Final = Endpoint(
    "filePut",
    "PUT",
    "/v1/files",
    (Answer(200, UploadReply, "The chunk (or the whole file) is stored."),),
    (
        (
            400,
            "A directory, a parent that is not one, a bad parameter, or `name_too_long`, "
            "`too_many_links`.",
        ),
        (403, "`permission_denied` or `read_only`."),
        (
            409,
            "`offset_mismatch`, `actor_mismatch`, or `busy` (the target is a mount point or a "
            "running program).",
        ),
        (
            413,
            "`too_large`: the body exceeds 64 MiB, or the file the largest the file system holds.",
        ),
        (
            507,
            "`no_space`: the file system is full or over quota; the bytes received so far are "
            "kept, so the upload can resume.",
        ),
    ),
    params=(
        _FILE_PATH,
        Param(
            "offset",
            _OFFSET,
            default=0,
            doc="Where this chunk goes; 0 starts the upload afresh.",
        ),
        Param(
            "final",
            Flag(),
            default=True,
            doc="true: fsync and atomically rename into place (true, false, 1 or 0).",
        ),
        Param(
            "mode",
            Octal(),
            default=0o644,
            doc="Permission bits, applied when the file is final.",
        ),
    ),
    body=Body(
        Bytes,
        required=False,
        doc="Raw bytes, at most 64 MiB per request; none is an empty chunk.",
    ),
    links=_FILE_LINKS,
)
FILE_GET: Final = Endpoint(
    "fileGet",
    "GET",
    "/v1/files",
    (
        Answer(200, Bytes, "The whole file, with Content-Length."),
        Answer(206, Bytes, "The requested range, with Content-Range."),
    ),
    (
        (
            400,
            "A directory or another non-file, a malformed Range, or `name_too_long`, "
            "`too_many_links`.",
        ),
        (403, "`permission_denied`."),
        (404, "No such file."),
        (416, "The range starts past the end of the file."),
    ),
    params=(_FILE_PATH, _RANGE),
)
# HEAD answers carry the status and headers of GET's, without a body.
FILE_HEAD: Final = Endpoint(
    "fileHead", "HEAD", FILE_GET.path, FILE_GET.answers, FILE_GET.errors, FILE_GET.params
)
STAT: Final = Endpoint(
    "stat",
    "GET",
    "/v1/stat",
    (Answer(200, FileStat, "What is at the path (symlinks not followed)."),),
    (
        (400, "`name_too_long` or `too_many_links`."),
        (403, "`permission_denied`."),
        (404, "Nothing at the path."),
    ),
    params=(
        Param(
            "path",
            AbsolutePath(file=False),
            required=True,
            doc="Absolute path inside the sandbox.",
            example="/tmp/data.bin",
        ),
    ),
)
PTY_CREATE: Final = Endpoint(
    "ptyCreate",
    "POST",
    "/v1/pty",
    (
        Answer(
            200,
            PtySession,
            "The session, running (or failed: the process could not start, `error` says why).",
        ),
    ),
    (
        (400, "Malformed JSON, a wrong field, an unknown user."),
        (409, "`id_conflict` or `actor_mismatch`."),
        _JSON_TOO_LARGE,
        (429, f"`too_many_sessions`: {MAX_PTY_SESSIONS} sessions are running."),
        (503, "`shutting_down`: the agent is stopping."),
    ),
    body=Body(PtyRequest),
    links=_PTY_LINKS,
)
PTY_GET: Final = Endpoint(
    "ptyGet",
    "GET",
    "/v1/pty/{session_id}",
    (Answer(200, PtySession, "The session, after waiting up to `wait`."),),
    ((400, "A bad `wait`."), (404, "Unknown session id.")),
    params=(_PTY_WAIT,),
)
PTY_CLOSE: Final = Endpoint(
    "ptyClose",
    "DELETE",
    "/v1/pty/{session_id}",
    (
        Answer(
            200,
            PtySession,
            "The session after its process group got SIGHUP and SIGTERM (SIGKILL after 2 s), "
            "its buffers dropped; an ended session is returned unchanged.",
        ),
    ),
    ((404, "Unknown session id."),),
)
PTY_OUTPUT: Final = Endpoint(
    "ptyOutput",
    "GET",
    "/v1/pty/{session_id}/output",
    (Answer(200, PtyOutput, "The bytes from `offset` (none if nothing came within `wait`)."),),
    (
        (400, "A bad parameter."),
        (404, "Unknown session id."),
        (409, "`offset_mismatch` (past the bytes produced so far) or `actor_mismatch`."),
    ),
    params=(
        Param(
            "stream",
            Choice(("stdout", "stderr")),
            default="stdout",
            doc="stderr is separate only in pipe mode.",
        ),
        Param(
            "offset",
            _OFFSET,
            default=0,
            doc="The first byte wanted; bytes before it may be dropped from now on.",
        ),
        Param("max_bytes", Digits(1, MAX_PTY_READ_BYTES), default=MAX_PTY_READ_BYTES),
        Param(
            "wait",
            Seconds(MAX_WAIT_S),
            default=0.0,
            doc="Seconds to wait for a byte at `offset` (0 to 8, default 0).",
        ),
    ),
)
PTY_INPUT: Final = Endpoint(
    "ptyInput",
    "POST",
    "/v1/pty/{session_id}/input",
    (Answer(200, PtyInputReply, "Received; the program reads them."),),
    (
        (400, "A bad `offset`."),
        (404, "Unknown session id."),
        (
            409,
            "`offset_mismatch` (past the input received so far), `busy` (over "
            f"{MAX_PTY_INPUT_BYTES} bytes not read by the program yet), `session_ended` or "
            "`actor_mismatch`.",
        ),
        (413, f"`too_large`: a body over {MAX_PTY_INPUT_BYTES} bytes."),
    ),
    params=(
        Param(
            "offset",
            _OFFSET,
            doc="Where the body starts in the session's input; bytes already received are "
            "skipped. Omitted: appended as is.",
        ),
    ),
    body=Body(Bytes, required=False, doc=f"Raw bytes, at most {MAX_PTY_INPUT_BYTES}."),
)
PTY_RESIZE: Final = Endpoint(
    "ptyResize",
    "POST",
    "/v1/pty/{session_id}/resize",
    (Answer(200, PtySession, "Resized (the foreground job gets SIGWINCH)."),),
    (
        (400, "Malformed JSON or a size out of range."),
        (404, "Unknown session id."),
        (409, "`session_ended` or `actor_mismatch`."),
        _JSON_TOO_LARGE,
    ),
    body=Body(PtyResize),
)
PTY_SIGNAL: Final = Endpoint(
    "ptySignal",
    "POST",
    "/v1/pty/{session_id}/signal",
    (Answer(200, PtySession, "Sent to the session's process group."),),
    (
        (400, "Malformed JSON or an unknown signal name."),
        (404, "Unknown session id."),
        (409, "`session_ended` or `actor_mismatch`."),
        _JSON_TOO_LARGE,
    ),
    body=Body(PtySignal),
)

# Every endpoint, in the order the OpenAPI document lists them. Every GET path also answers HEAD
# (the server's rule, _routes.py); only /v1/files declares it, where it means something.
ENDPOINTS: Final = (
    READYZ,
    OPENAPI,
    EXEC_START,
    EXEC_GET,
    EXEC_KILL,
    FILE_PUT,
    FILE_GET,
    FILE_HEAD,
    PTY_CREATE,
    PTY_GET,
    PTY_CLOSE,
    PTY_OUTPUT,
    PTY_INPUT,
    PTY_RESIZE,
    PTY_SIGNAL,
    STAT,
)
