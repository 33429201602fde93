"""Gymnasium environments backed by gym-substrate sandboxes.

Importing this package registers `gym_substrate/Sandbox-v0` (Gymnasium >= 1.0 no longer loads
the `gymnasium.envs` entry point by itself, so `gym.make` needs this import, or the id written as
`"gym_substrate.envs:gym_substrate/Sandbox-v0"`). `register_envs` is also the entry point older
Gymnasium versions call; registering twice does nothing.
"""

from __future__ import annotations

try:
    import gymnasium  # noqa: F401 - checked first, so its absence says which extra to install
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        "gym_substrate.envs needs Gymnasium, which is in the `gym` extra: install "
        "gym-substrate[gym] (e.g. `uv add 'gym-substrate[gym]'` or `pip install "
        "'gym-substrate[gym]'`)",
        name=exc.name,
    ) from exc

from gym_substrate.envs._episode import EnvSnapshot  # noqa: E402 - after the check above
from gym_substrate.envs.env import ENV_ID, SandboxEnv, build_observation
from gym_substrate.envs.rewards import (
    ExitCodeReward,
    FileCreatedReward,
    RewardFn,
    SparseTaskReward,
    SparseTaskTermination,
    StepPenaltyReward,
    TerminationFn,
)

__all__ = [
    "ENV_ID",
    "EnvSnapshot",
    "ExitCodeReward",
    "FileCreatedReward",
    "RewardFn",
    "SandboxEnv",
    "SparseTaskReward",
    "SparseTaskTermination",
    "StepPenaltyReward",
    "TerminationFn",
    "build_observation",
    "register_envs",
]


def register_envs() -> None:
    """Register `gym_substrate/Sandbox-v0` with Gymnasium (a no-op when already registered)."""
    from gymnasium.envs.registration import register, registry

    if ENV_ID in registry:
        return
    register(
        id=ENV_ID,
        entry_point="gym_substrate.envs.env:SandboxEnv",
        # A sandbox runs real programs: the same seed and actions need not give the same
        # observations (time, randomness, the network), and `info["elapsed_ms"]` always differs.
        nondeterministic=True,
    )


register_envs()
