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
    "MAX_PTY_INPUT_BYTES",
    "MAX_PTY_READ_BYTES",
    "MAX_PTY_SESSIONS",
    "MAX_TERMINAL_SIZE",
    "PTY_BUFFER_BYTES",
    "PTY_RETAINED_ENDED",
    "PTY_SIGNALS",
    "PTY_STATES",
    "ErrorBody",
    "ErrorCode",
    "ExecRequest",
    "FileStat",
    "Job",
    "JobState",
    "MiB",
    "PtyInputReply",
    "PtyMode",
    "PtyOutput",
    "PtyRequest",
    "PtySession",
    "PtyState",
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

# PTY sessions (`/v1/pty`): at most MAX_PTY_SESSIONS run at once; each output stream keeps the
# last PTY_BUFFER_BYTES (and a program stops being read, so it blocks on its next write, once
# that many bytes are unread); one input request carries at most MAX_PTY_INPUT_BYTES, and at
# most that many may wait for the program to read them; one output read returns at most
# MAX_PTY_READ_BYTES; ended sessions stay readable until more than PTY_RETAINED_ENDED have ended.
MAX_PTY_SESSIONS: Final = 64
PTY_BUFFER_BYTES: Final = 1 * MiB
MAX_PTY_INPUT_BYTES: Final = 1 * MiB
MAX_PTY_READ_BYTES: Final = 1 * MiB
PTY_RETAINED_ENDED: Final = 64
# rows and cols are unsigned shorts in the kernel's struct winsize; 0 means "unknown" there.
MAX_TERMINAL_SIZE: Final = 65535
# The signals POST /v1/pty/{id}/signal delivers, by name.
PTY_SIGNALS: Final = (
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGKILL",
    "SIGTERM",
    "SIGUSR1",
    "SIGUSR2",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGWINCH",
)

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
    "too_many_sessions",
    "session_ended",
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
    background_services: bool | None


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


PtyMode = Literal["pty", "pipe"]
PtyState = Literal["running", "exited", "killed", "failed"]
PTY_STATES: Final[tuple[PtyState, ...]] = ("running", "exited", "killed", "failed")


class PtyRequest(TypedDict, total=False):
    """`POST /v1/pty` body. Every field is optional: no `command` is an interactive shell."""

    id: str | None
    command: str | list[str] | None
    shell: str | None
    cwd: str | None
    env: dict[str, str]
    user: str | int | None
    rows: int
    cols: int
    pty: bool


class PtySession(TypedDict):
    """A session as `POST /v1/pty`, `GET`, `DELETE /v1/pty/{id}` and resize/signal return it."""

    id: str
    mode: PtyMode
    state: PtyState
    exit_code: int | None
    signal: int | None
    error: str | None
    rows: int
    cols: int
    started_at: float
    duration_ms: float
    stdout_offset: int
    stderr_offset: int
    input_offset: int
    input_pending: int


class PtyOutput(TypedDict):
    """`GET /v1/pty/{id}/output`: `data` (base64) starts at byte `offset` of the stream."""

    id: str
    stream: Literal["stdout", "stderr"]
    offset: int
    next_offset: int
    skipped: int
    data: str
    eof: bool
    state: PtyState
    exit_code: int | None
    signal: int | None


class PtyInputReply(TypedDict):
    """`POST /v1/pty/{id}/input`: bytes accepted so far, and how many the program has not read."""

    id: str
    input_offset: int
    input_pending: int


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
