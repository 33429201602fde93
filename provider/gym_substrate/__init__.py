"""gym-substrate: Agent Substrate as the sandbox backend for NeMo Gym and Gymnasium.

The public API is flat: `from gym_substrate import SubstrateProvider, ConnectionConfig, ...`. The
provider lives in `gym_substrate.nemo`. Names are resolved on first access (PEP 562), so `import
gym_substrate` (e.g. by the CLI) pulls in neither grpc nor aiohttp; each exported class gets
`__module__ = "gym_substrate"` so reprs show the public path.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_substrate.nemo.config import (
        ConnectionConfig,
        CreateConfig,
        ExecConfig,
        LifecycleConfig,
        MetricsConfig,
        ProviderOptions,
        RetryConfig,
        TLSConfig,
        TokenConfig,
    )
    from gym_substrate.nemo.errors import (
        ActorCrashedError,
        ActorMismatchError,
        ActorNotFoundError,
        ActorUnavailableError,
        AgentError,
        AgentResponseError,
        AgentTransportError,
        AlreadyExistsError,
        CloseError,
        ConfigError,
        ControlPlaneError,
        NoFreeWorkersError,
        ProviderClosedError,
        RetryError,
        RouterError,
        SnapshotBusyError,
        SnapshotError,
        SnapshotInUseError,
        SubstrateCreateError,
        SubstrateCreateVerificationError,
        SubstrateError,
        TransferError,
        TransientControlPlaneError,
        UnsupportedServerError,
    )
    from gym_substrate.nemo.provider import (
        SANDBOX_RUNTIME_RETURN_CODE,
        SubstrateActor,
        SubstrateProvider,
    )
    from gym_substrate.nemo.snapshot import (
        SandboxSnapshot,
        SnapshotCapabilities,
        SupportsSandboxFork,
        SupportsSandboxSnapshot,
    )

__version__ = "0.1.0"

__all__ = [
    "SANDBOX_RUNTIME_RETURN_CODE",
    "ActorCrashedError",
    "ActorMismatchError",
    "ActorNotFoundError",
    "ActorUnavailableError",
    "AgentError",
    "AgentResponseError",
    "AgentTransportError",
    "AlreadyExistsError",
    "CloseError",
    "ConfigError",
    "ConnectionConfig",
    "ControlPlaneError",
    "CreateConfig",
    "ExecConfig",
    "LifecycleConfig",
    "MetricsConfig",
    "NoFreeWorkersError",
    "ProviderClosedError",
    "ProviderOptions",
    "RetryConfig",
    "RetryError",
    "RouterError",
    "SandboxSnapshot",
    "SnapshotBusyError",
    "SnapshotCapabilities",
    "SnapshotError",
    "SnapshotInUseError",
    "SubstrateActor",
    "SubstrateCreateError",
    "SubstrateCreateVerificationError",
    "SubstrateError",
    "SubstrateProvider",
    "SupportsSandboxFork",
    "SupportsSandboxSnapshot",
    "TLSConfig",
    "TokenConfig",
    "TransferError",
    "TransientControlPlaneError",
    "UnsupportedServerError",
    "__version__",
]

_EXPORTS: dict[str, str] = {}
for _module, _names in {
    "gym_substrate.nemo.config": (
        "ConnectionConfig",
        "CreateConfig",
        "ExecConfig",
        "LifecycleConfig",
        "MetricsConfig",
        "ProviderOptions",
        "RetryConfig",
        "TLSConfig",
        "TokenConfig",
    ),
    "gym_substrate.nemo.errors": (
        "ActorCrashedError",
        "ActorMismatchError",
        "ActorNotFoundError",
        "ActorUnavailableError",
        "AgentError",
        "AgentResponseError",
        "AgentTransportError",
        "AlreadyExistsError",
        "CloseError",
        "ConfigError",
        "ControlPlaneError",
        "NoFreeWorkersError",
        "ProviderClosedError",
        "RetryError",
        "RouterError",
        "SnapshotBusyError",
        "SnapshotError",
        "SnapshotInUseError",
        "SubstrateCreateError",
        "SubstrateCreateVerificationError",
        "SubstrateError",
        "TransferError",
        "TransientControlPlaneError",
        "UnsupportedServerError",
    ),
    "gym_substrate.nemo.snapshot": (
        "SandboxSnapshot",
        "SnapshotCapabilities",
        "SupportsSandboxFork",
        "SupportsSandboxSnapshot",
    ),
    "gym_substrate.nemo.provider": (
        "SANDBOX_RUNTIME_RETURN_CODE",
        "SubstrateActor",
        "SubstrateProvider",
    ),
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gym_substrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if isinstance(value, type):
        value.__module__ = "gym_substrate"
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
