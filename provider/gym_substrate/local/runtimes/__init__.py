"""Sandbox runtimes for the local backend, and the factory that picks one.

``base`` is the contract (``SandboxRuntime``) and imports no runtime; ``process`` and ``gvisor``
implement it and import only ``base``. This factory is the one place that knows both: it imports
``process.ProcessRuntime`` and ``gvisor.GvisorRuntime`` (constructed as ``X(config:
RuntimeConfig)``) and ``gvisor.gvisor_problem() -> str | None`` (None when runsc works here)
lazily, only for the runtime asked for, so nothing here pulls in the gVisor helpers at import.
"""

from __future__ import annotations

from gym_substrate.local.runtimes.base import RuntimeConfig, RuntimeFailure, SandboxRuntime
from gym_substrate.local.runtimes.pause_tiers import (
    DEFAULT_PAUSE_TIER,
    PAUSE_TIER_ENV,
    PAUSE_TIERS,
    resolve_pause_tier,
)

__all__ = [
    "DEFAULT_PAUSE_TIER",
    "PAUSE_TIERS",
    "PAUSE_TIER_ENV",
    "RUNTIME_NAMES",
    "create_runtime",
    "gvisor_problem",
    "resolve_pause_tier",
    "select_runtime",
]

RUNTIME_NAMES = ("auto", "gvisor", "process")


def gvisor_problem() -> str | None:
    """Why the gVisor runtime cannot run here, or None when it can."""
    try:
        from gym_substrate.local.runtimes import gvisor
    except ImportError as exc:  # the gvisor package is built separately
        return f"the gVisor runtime is not available in this build ({exc})"
    problem: str | None = gvisor.gvisor_problem()
    return problem


def select_runtime(requested: str) -> tuple[str, str]:
    """Resolve ``auto|gvisor|process`` to a runtime name plus a sentence saying why."""
    if requested not in RUNTIME_NAMES:
        raise ValueError(f"unknown runtime {requested!r}: use one of {', '.join(RUNTIME_NAMES)}")
    if requested == "process":
        return "process", "the process runtime was requested (--runtime process)"
    problem = gvisor_problem()
    if requested == "gvisor":
        if problem is not None:
            raise RuntimeFailure(
                f"--runtime gvisor cannot run here: {problem}; "
                "install runsc and run as root, or use --runtime process"
            )
        return "gvisor", "the gVisor runtime was requested (--runtime gvisor)"
    if problem is None:
        return "gvisor", "runsc works here, so actors run as gVisor sandboxes"
    return "process", f"gVisor is unavailable ({problem}), so actors run as plain processes"


def create_runtime(name: str, config: RuntimeConfig) -> SandboxRuntime:
    """Build a runtime by its resolved name; implementations are imported only when used."""
    if name == "process":
        from gym_substrate.local.runtimes.process import ProcessRuntime

        process_runtime: SandboxRuntime = ProcessRuntime(config)
        return process_runtime
    if name == "gvisor":
        from gym_substrate.local.runtimes.gvisor import GvisorRuntime

        runtime: SandboxRuntime = GvisorRuntime(config)
        return runtime
    raise ValueError(f"unknown runtime {name!r}: use gvisor or process")
