"""The agent's settings as one frozen value, so `create_app(config)` needs no module globals."""

from __future__ import annotations

from dataclasses import dataclass

from .contract import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_JSON_BYTES,
    MAX_PTY_SESSIONS,
    MAX_UPLOAD_BYTES,
    PTY_BUFFER_BYTES,
    PTY_RETAINED_ENDED,
    MiB,
)

__all__ = ["AgentConfig", "ACTOR_ID_FILE", "ACTOR_ID_ENV", "MiB"]

ACTOR_ID_FILE = "/run/ate/actor-id"
ACTOR_ID_ENV = "SANDBOX_AGENT_ACTOR_ID"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything `create_app` needs. Defaults are the contract's values."""

    host: str = "0.0.0.0"
    port: int = 80
    token: str | None = None
    actor_id_file: str = ACTOR_ID_FILE
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    max_json_bytes: int = MAX_JSON_BYTES
    max_running_jobs: int = 256
    job_retention_s: float = 600.0
    job_retention_count: int = 1024
    job_hard_cap: int = 16384
    kill_grace_s: float = 2.0
    max_pty_sessions: int = MAX_PTY_SESSIONS
    pty_buffer_bytes: int = PTY_BUFFER_BYTES
    pty_retained_ended: int = PTY_RETAINED_ENDED
    restore_jump_s: float = 2.0
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    # Reap every child on SIGCHLD and adopt orphans as the child subreaper. Right for the agent's
    # own process (the CLI sets it); wrong inside a process that runs other subprocesses.
    reap_orphans: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            msg = f"port must be 0..65535, got {self.port}"
            raise ValueError(msg)
        if self.token is not None and not self.token:
            msg = "token must not be empty (omit it to disable auth)"
            raise ValueError(msg)
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                msg = f"{name} must be > 0, got {getattr(self, name)}"
                raise ValueError(msg)
        for name in ("max_running_jobs", "max_pty_sessions", "pty_buffer_bytes"):
            if getattr(self, name) < 1:
                msg = f"{name} must be >= 1"
                raise ValueError(msg)
