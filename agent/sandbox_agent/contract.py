"""Contract v1 as data: the header, limits, job states and body shapes both sides rely on.

The agent enforces these values and the provider speaks them, so they live here once, with no
import beyond the standard library: the provider imports this module without pulling in the
agent's server (aiohttp handlers, the job table). `agent/contract.md` is the prose; a test checks
that the OpenAPI document agrees with the states and limits named here.
"""

from __future__ import annotations

from typing import Final, Literal, TypedDict, get_args

__all__ = [
    "ACTOR_ID_HEADER",
    "BODY_TIMEOUT_S",
    "CONTRACT_VERSION",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "ERROR_CODES",
    "FINISHED_STATES",
    "HEADER_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "JOB_STATES",
    "MAX_FILE_OFFSET",
    "MAX_JSON_BYTES",
    "MAX_OUTPUT_BYTES",
    "MAX_TIMEOUT_S",
    "MAX_UID",
    "MAX_UPLOAD_BYTES",
    "MAX_WAIT_S",
    "ErrorBody",
    "ErrorCode",
    "ExecRequest",
    "FileStat",
    "Job",
    "JobState",
    "MiB",
    "Readiness",
    "UploadReply",
]

CONTRACT_VERSION: Final = 1
MiB: Final = 1024 * 1024

# Every request that carries this header is refused (409 actor_mismatch) by an agent whose actor
# id differs: a request routed to a reused IP after a resume never runs in the wrong sandbox.
ACTOR_ID_HEADER: Final = "X-Sandbox-Actor-Id"

MAX_WAIT_S: Final = 8.0  # long-poll cap, under the router's 10 s cut
MAX_TIMEOUT_S: Final = 100_000_000  # 1e8 s: JSON has no Infinity, so "no limit" is capped
DEFAULT_MAX_OUTPUT_BYTES: Final = 16 * MiB  # per stream
MAX_OUTPUT_BYTES: Final = 64 * MiB
MAX_UPLOAD_BYTES: Final = 64 * MiB  # per PUT chunk
MAX_JSON_BYTES: Final = 16 * MiB
# Connection limits: a request's line and headers must arrive within HEADER_TIMEOUT_S of their
# first byte, its body within BODY_TIMEOUT_S of the headers (else 408 request_timeout), and an
# idle keep-alive connection is closed after IDLE_TIMEOUT_S (a client's pool must expire idle
# connections sooner).
HEADER_TIMEOUT_S: Final = 10.0
BODY_TIMEOUT_S: Final = 60.0
IDLE_TIMEOUT_S: Final = 60.0
# `user` as a uid: 4294967295 is (uid_t)-1, which setuid() reads as "leave unchanged" (root).
MAX_UID: Final = 4_294_967_294
# `offset` and `Range` positions: the largest off_t.
MAX_FILE_OFFSET: Final = 2**63 - 1

# The `code` of every error body. contract.md says when each is sent; a test checks that the
# OpenAPI document lists exactly these.
ErrorCode = Literal[
    "bad_request",
    "name_too_long",
    "too_many_links",
    "unauthorized",
    "permission_denied",
    "read_only",
    "not_found",
    "method_not_allowed",
    "request_timeout",
    "id_conflict",
    "actor_mismatch",
    "offset_mismatch",
    "busy",
    "too_large",
    "range_not_satisfiable",
    "too_many_jobs",
    "internal",
    "no_space",
    "shutting_down",
]
ERROR_CODES: Final[tuple[ErrorCode, ...]] = get_args(ErrorCode)

JobState = Literal["running", "exited", "timeout", "killed", "failed"]
JOB_STATES: Final[tuple[JobState, ...]] = ("running", "exited", "timeout", "killed", "failed")
FINISHED_STATES: Final = frozenset(JOB_STATES) - {"running"}


class ExecRequest(TypedDict, total=False):
    """`POST /v1/exec` body. Only `command` is required."""

    id: str | None
    command: str | list[str]
    shell: str
    cwd: str | None
    env: dict[str, str]
    timeout_s: float | None
    stdin: str | None
    user: str | int | None
    max_output_bytes: int


class Job(TypedDict, total=False):
    """A job as `POST /v1/exec`, `GET /v1/exec/{id}` and `DELETE` return it."""

    id: str
    state: JobState
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    started_at: float
    duration_ms: float
    error: str | None


class Readiness(TypedDict):
    """`GET /readyz`."""

    status: str
    agent_version: str
    actor_id: str | None
    boot_id: str
    uptime_s: float


class FileStat(TypedDict):
    """`GET /v1/stat`."""

    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float


class UploadReply(TypedDict):
    """`PUT /v1/files`: `sha256` is set once the upload is final."""

    path: str
    size: int
    sha256: str | None


class ErrorDetail(TypedDict):
    code: ErrorCode
    message: str


class ErrorBody(TypedDict):
    """Every error the agent sends: `{"error": {"code", "message"}}`."""

    error: ErrorDetail
