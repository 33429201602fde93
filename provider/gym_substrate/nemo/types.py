"""The NeMo Gym sandbox types this package speaks: Gym's own when importable, else a mirror.

Gym's facade checks some results with `isinstance` (e.g. `SandboxEndpoint`), so when nemo-gym is
importable we must hand back *its* classes, not look-alikes. The choice is made once, at import.
`HAS_PAUSED_STATUS` tells whether the active `SandboxStatus` has `PAUSED` (nemo-gym < 0.7 lacks
it; the provider then reports parked actors as RUNNING).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "HAS_PAUSED_STATUS",
    "NEMO_GYM_TYPES",
    "ExecResult",
    "SandboxCreateError",
    "SandboxCreateVerificationError",
    "SandboxEndpoint",
    "SandboxExecResult",
    "SandboxHandle",
    "SandboxPtyError",
    "SandboxPtySpec",
    "SandboxResources",
    "SandboxSpec",
    "SandboxStatus",
]

if TYPE_CHECKING:
    from gym_substrate.nemo._compat import (
        ExecResult,
        SandboxCreateError,
        SandboxCreateVerificationError,
        SandboxEndpoint,
        SandboxExecResult,
        SandboxHandle,
        SandboxPtyError,
        SandboxPtySpec,
        SandboxResources,
        SandboxSpec,
        SandboxStatus,
    )

    NEMO_GYM_TYPES: bool
else:
    try:
        from nemo_gym.sandbox.providers.base import (
            SandboxCreateError,
            SandboxCreateVerificationError,
            SandboxExecResult,
            SandboxHandle,
            SandboxResources,
            SandboxSpec,
            SandboxStatus,
        )
    except ImportError:
        from gym_substrate.nemo._compat import (
            ExecResult,
            SandboxCreateError,
            SandboxCreateVerificationError,
            SandboxEndpoint,
            SandboxExecResult,
            SandboxHandle,
            SandboxPtyError,
            SandboxPtySpec,
            SandboxResources,
            SandboxSpec,
            SandboxStatus,
        )

        NEMO_GYM_TYPES = False
    else:
        NEMO_GYM_TYPES = True
        ExecResult = SandboxExecResult
        try:  # SandboxEndpoint appeared after v0.5.0.
            from nemo_gym.sandbox.providers.base import SandboxEndpoint
        except ImportError:
            from gym_substrate.nemo._compat import SandboxEndpoint
        try:  # so are the PTY types: callers catch Gym's own SandboxPtyError
            from nemo_gym.sandbox.providers.base import SandboxPtyError, SandboxPtySpec
        except ImportError:
            from gym_substrate.nemo._compat import SandboxPtyError, SandboxPtySpec

HAS_PAUSED_STATUS: bool = hasattr(SandboxStatus, "PAUSED")
