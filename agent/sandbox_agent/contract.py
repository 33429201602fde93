"""Contract v1 as data: the header, limits, job states and every message both sides rely on.

Each request and reply body is declared once, here, as a TypedDict whose fields carry their
limits, patterns, defaults and descriptions in `typing.Annotated` (the markers of `_fields`).
The agent derives from these declarations everything else (`_wire`): the validation of request
bodies and its 400 messages, the replies it builds, and the schemas of the OpenAPI document.
The provider imports this module for the same types and limits; it needs nothing beyond the
standard library (and `_fields`), so the provider never pulls in the agent's server.
`agent/contract.md` is the prose.
"""

from typing import Annotated, Final, Literal, Required, TypedDict, get_args

from ._fields import (
    ABSOLUTE_PATTERN,
    ContentEncoding,
    Default,
    DigitsAtMost,
    Doc,
    Example,
    FirstNotEmpty,
    MinLength,
    NoNul,
    Pattern,
    Range,
)

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
    "MESSAGES",
    "ErrorBody",
    "ErrorCode",
    "ErrorDetail",
    "ExecRequest",
    "FileStat",
    "Job",
    "JobState",
    "MiB",
    "PtyInputReply",
    "PtyMode",
    "PtyOutput",
    "PtyRequest",
    "PtyResize",
    "PtySession",
    "PtySignal",
    "PtySignalName",
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
PtySignalName = Literal[
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
]
PTY_SIGNALS: Final[tuple[PtySignalName, ...]] = get_args(PtySignalName)

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


# Field types several messages share.
JobId = Annotated[str, Pattern("^[A-Za-z0-9._-]{1,128}$")]
Command = Annotated[str, MinLength(1), NoNul()]
Argv = Annotated[list[Annotated[str, NoNul()]], MinLength(1), FirstNotEmpty()]
AbsolutePath = Annotated[
    str, Pattern(ABSOLUTE_PATTERN, "an absolute path (starting with /)"), NoNul()
]
EnvName = Annotated[str, MinLength(1), Pattern("^[^=\\x00]*$", "not empty, without '=' or NUL")]
Environment = dict[EnvName, Annotated[str, NoNul()]]
UserName = Annotated[str, MinLength(1), NoNul(), DigitsAtMost(MAX_UID, "a uid")]
Uid = Annotated[int, Range(minimum=0, maximum=MAX_UID)]
TerminalSize = Annotated[int, Range(minimum=1, maximum=MAX_TERMINAL_SIZE)]
Count = Annotated[int, Range(minimum=0)]


class ExecRequest(TypedDict, total=False):
    """`POST /v1/exec` body. Only `command` is required."""

    id: Annotated[
        JobId | None,
        Doc(
            "Idempotency key; the same id with the same body never starts a second process, "
            "with a different body it is a 409 id_conflict."
        ),
    ]
    command: Required[
        Annotated[
            Command | Argv,
            Doc(
                "A string runs as [shell, -c, command]; a list is the argv (its first item, the "
                "program, not empty). No NUL characters."
            ),
            Example("echo hi"),
        ]
    ]
    shell: Annotated[str | None, MinLength(1), NoNul(), Default("/bin/sh")]
    cwd: AbsolutePath | None
    env: Annotated[
        Environment | None,
        Default({}),
        Doc("Added to the agent's environment; names are not empty and hold no = or NUL."),
    ]
    timeout_s: Annotated[
        float | None,
        Range(exclusive_minimum=0, maximum=MAX_TIMEOUT_S),
        Doc("Seconds; null for no timeout."),
    ]
    stdin: str | None
    user: Annotated[
        UserName | Uid | None,
        Doc(
            "A uid 0..4294967294 (an integer, or a string of ASCII digits), or the name of a "
            "user in the sandbox's passwd; anything else is a 400."
        ),
    ]
    max_output_bytes: Annotated[
        int | None,
        Range(minimum=0, maximum=MAX_OUTPUT_BYTES),
        Default(DEFAULT_MAX_OUTPUT_BYTES),
        Doc("Per stream; beyond it the head and the tail are kept."),
    ]
    background_services: Annotated[
        bool | None,
        Default(False),
        Doc(
            "true: processes the command leaves running (services) may keep its stdout and "
            "stderr; the job still finishes when the command exits, and the agent goes on "
            "reading and discarding their output, so they never get SIGPIPE."
        ),
    ]


class Job(TypedDict):
    """A job as `POST /v1/exec`, `GET /v1/exec/{id}` and `DELETE` return it."""

    id: JobId
    state: JobState
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    started_at: Annotated[float, Doc("Unix time in seconds.")]
    duration_ms: Annotated[float, Range(minimum=0)]
    error: str | None


PtyMode = Literal["pty", "pipe"]
PtyState = Literal["running", "exited", "killed", "failed"]
PTY_STATES: Final[tuple[PtyState, ...]] = ("running", "exited", "killed", "failed")


class PtyRequest(TypedDict, total=False):
    """`POST /v1/pty` body. Every field is optional: no `command` is an interactive shell."""

    id: Annotated[
        JobId | None,
        Doc(
            "Idempotency key, as for exec: the same id with the same body returns the existing "
            "session, with a different body it is a 409 id_conflict."
        ),
    ]
    command: Annotated[
        Command | Argv | None,
        Doc(
            "A string runs as [shell, -c, command]; a list is the argv; null (the default) is "
            "an interactive shell: `shell`, else bash if it is on PATH, else /bin/sh."
        ),
        Example("bash"),
    ]
    shell: Annotated[str | None, MinLength(1), NoNul()]
    cwd: AbsolutePath | None
    env: Annotated[
        Environment | None,
        Default({}),
        Doc(
            "Added to the agent's environment; a terminal also gets TERM=xterm-256color unless "
            "this sets TERM."
        ),
    ]
    user: Annotated[
        UserName | Uid | None,
        Doc("As for exec: a uid or a user name of the sandbox's passwd."),
    ]
    rows: Annotated[
        int | None, Range(minimum=1, maximum=MAX_TERMINAL_SIZE), Default(24), Example(24)
    ]
    cols: Annotated[
        int | None, Range(minimum=1, maximum=MAX_TERMINAL_SIZE), Default(80), Example(80)
    ]
    pty: Annotated[
        bool,
        Default(True),
        Doc(
            "true: a terminal (all output on stdout); false: pipes, stdout and stderr apart, "
            "rows and cols unused."
        ),
    ]


class PtySession(TypedDict):
    """A session as `POST /v1/pty`, `GET`, `DELETE /v1/pty/{id}` and resize/signal return it."""

    id: JobId
    mode: PtyMode
    state: PtyState
    exit_code: int | None
    signal: int | None
    error: Annotated[str | None, Doc("Why the process could not start (state failed).")]
    rows: TerminalSize
    cols: TerminalSize
    started_at: Annotated[float, Doc("Unix time in seconds.")]
    duration_ms: Annotated[float, Range(minimum=0)]
    stdout_offset: Annotated[
        Count, Doc("Bytes of output produced so far (the terminal's in pty mode).")
    ]
    stderr_offset: Count
    input_offset: Annotated[
        Count, Doc("Bytes of input received so far: where the next chunk starts.")
    ]
    input_pending: Annotated[
        int,
        Range(minimum=0, maximum=MAX_PTY_INPUT_BYTES),
        Doc("Received bytes the program has not read yet."),
    ]


class PtyOutput(TypedDict):
    """`GET /v1/pty/{id}/output`: `data` (base64) starts at byte `offset` of the stream."""

    id: str
    stream: Literal["stdout", "stderr"]
    offset: Annotated[Count, Doc("Of data's first byte.")]
    next_offset: Annotated[Count, Doc("Where the next read starts.")]
    skipped: Annotated[
        Count,
        Doc(
            "Bytes between the requested offset and `offset` that are no longer kept: each "
            f"stream keeps its last {PTY_BUFFER_BYTES} bytes, and drops only bytes a read has "
            "moved past (or all of them on DELETE)."
        ),
    ]
    data: Annotated[
        str,
        ContentEncoding("base64"),
        Doc(f"At most max_bytes ({MAX_PTY_READ_BYTES} by default) bytes."),
    ]
    eof: Annotated[bool, Doc("The session has ended and this is the end of the stream.")]
    state: PtyState
    exit_code: int | None
    signal: int | None


class PtyInputReply(TypedDict):
    """`POST /v1/pty/{id}/input`: bytes accepted so far, and how many the program has not read."""

    id: str
    input_offset: Count
    input_pending: Annotated[int, Range(minimum=0, maximum=MAX_PTY_INPUT_BYTES)]


class PtyResize(TypedDict):
    """`POST /v1/pty/{id}/resize` body: the terminal's new size, both fields required."""

    rows: Annotated[TerminalSize, Example(40)]
    cols: Annotated[TerminalSize, Example(120)]


class PtySignal(TypedDict):
    """`POST /v1/pty/{id}/signal` body."""

    signal: Annotated[PtySignalName, Example("SIGINT")]


class Readiness(TypedDict):
    """`GET /readyz`."""

    status: Literal["ok"]
    agent_version: str
    actor_id: str | None
    boot_id: Annotated[str, Pattern("^[0-9a-f]{32}$")]
    uptime_s: Annotated[float, Range(minimum=0)]


class FileStat(TypedDict):
    """`GET /v1/stat`."""

    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: Count
    mode: Annotated[Count, Doc("Permission bits.")]
    mtime: float


class UploadReply(TypedDict):
    """`PUT /v1/files`: `sha256` is set once the upload is final."""

    path: str
    size: Count
    sha256: Annotated[
        Annotated[str, Pattern("^[0-9a-f]{64}$")] | None,
        Doc("Of the whole file when final=true, else null."),
    ]


class ErrorDetail(TypedDict):
    code: ErrorCode
    message: Annotated[str, MinLength(1)]


class ErrorBody(TypedDict):
    """Every error the agent sends: `{"error": {"code", "message"}}`."""

    error: ErrorDetail


# Every message on the wire, in the order the OpenAPI document lists their schemas.
MESSAGES: Final = (
    ErrorBody,
    Readiness,
    ExecRequest,
    Job,
    UploadReply,
    FileStat,
    PtyRequest,
    PtySession,
    PtyOutput,
    PtyInputReply,
    PtyResize,
    PtySignal,
)
