"""`SandboxEnv`'s constructor arguments, checked at once, and the env's one lifecycle state.

Every argument is refused with the parameter's name and what it takes before anything starts;
`EnvOptions` is what the env keeps. The lifecycle is one `Phase` (idle, running, ended, closed)
rather than flags that can disagree, and a call out of turn raises Gymnasium's own errors
(`ResetNeeded`, `ClosedEnvironmentError`), which are also `RuntimeError`s for callers written
against the earlier errors.
"""

from __future__ import annotations

import copy
import enum
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gymnasium import error as gym_error

from gym_substrate.envs._runtime import SandboxProviderLike
from gym_substrate.envs.rewards import RewardFn, TerminationFn

__all__ = [
    "PROVIDER_NAME",
    "EnvClosedError",
    "EnvOptions",
    "EpisodeNotRunningError",
    "Phase",
    "check_options",
]

PROVIDER_NAME: Final = "substrate"
MIN_OBS_LENGTH: Final = 64


class EpisodeNotRunningError(gym_error.ResetNeeded, RuntimeError):
    """step() or snapshot() with no episode in progress: call reset() first."""


class EnvClosedError(gym_error.ClosedEnvironmentError, RuntimeError):
    """The env was closed; create a new one."""


class Phase(enum.Enum):
    IDLE = "idle"  # built, or between episodes before the first reset
    RUNNING = "running"  # an episode in its sandbox
    ENDED = "ended"  # terminated or truncated: its sandbox released
    CLOSED = "closed"


@dataclass(frozen=True)
class EnvOptions:
    """The checked arguments (`provider_config` is None when a provider instance was given)."""

    reward_fn: RewardFn
    termination_fn: TerminationFn
    provider_config: dict[str, Any] | None
    provider_instance: SandboxProviderLike | None
    image: str | None
    template: str | None
    max_episode_steps: int
    step_timeout_s: float
    max_obs_length: int
    cwd: str | None
    exec_env: dict[str, str] | None
    shell: list[str] | None
    render_mode: str | None


def _check_number(name: str, value: Any, *, integer: bool, minimum: float) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise TypeError(f"SandboxEnv({name}=...) must be {kind}, got {value!r}")
    if not math.isfinite(float(value)) or float(value) < minimum:
        raise ValueError(f"SandboxEnv({name}=...) must be >= {minimum:g}, got {value!r}")


def _shell_argv(shell: Any) -> list[str] | None:
    if shell is None:
        return None
    if isinstance(shell, str):
        argv = shlex.split(shell)
        if len(argv) == 1:
            argv.append("-c")
    elif isinstance(shell, Sequence) and all(isinstance(a, str) for a in shell):
        argv = list(shell)
    else:
        raise TypeError(
            "SandboxEnv(shell=...) must be a program such as 'bash', a command prefix such as "
            f"'bash -lc', or a list such as ['bash', '-lc'], got {shell!r}"
        )
    if not argv or not all(argv):
        raise ValueError(f"SandboxEnv(shell=...) must not be empty, got {shell!r}")
    return argv


def _provider_config(provider: Mapping[Any, Any]) -> dict[str, Any]:
    keys = list(provider)
    if keys != [PROVIDER_NAME]:
        raise ValueError(
            "SandboxEnv(provider=...) as a mapping must have exactly one key, "
            f"{PROVIDER_NAME!r}, holding the provider config (as in a NeMo Gym `sandbox:` block), "
            f"got keys {keys!r}"
        )
    config = provider[PROVIDER_NAME]
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TypeError(
            f"SandboxEnv(provider={{{PROVIDER_NAME!r}: ...}}) must map to the provider config "
            f"(a mapping), got {type(config).__name__}"
        )
    bad = [k for k in config if not isinstance(k, str)]
    if bad:
        raise TypeError(f"provider config keys must be strings, got {bad!r}")
    return copy.deepcopy(dict(config))


def _provider(provider: Any) -> tuple[dict[str, Any] | None, SandboxProviderLike | None]:
    if isinstance(provider, Mapping):
        return _provider_config(provider), None
    if all(callable(getattr(provider, m, None)) for m in ("create", "exec", "close")):
        return None, provider
    raise TypeError(
        "SandboxEnv(provider=...) must be a mapping {'substrate': {...provider config...}} "
        f"or a sandbox provider instance (with create/exec/close), got {type(provider)!r}"
    )


def _exec_env(env: Any) -> dict[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise TypeError("SandboxEnv(env=...) must map variable names to string values")
    return dict(env)


def check_options(args: Mapping[str, Any], render_modes: Sequence[str]) -> EnvOptions:
    """``args``: SandboxEnv's keyword arguments by name; every one checked, or TypeError /
    ValueError naming it."""
    reward_fn, termination_fn = args["reward_fn"], args["termination_fn"]
    if not isinstance(reward_fn, RewardFn):
        raise TypeError(f"reward_fn must be a RewardFn instance, got {type(reward_fn)!r}")
    if not isinstance(termination_fn, TerminationFn):
        raise TypeError(
            f"termination_fn must be a TerminationFn instance, got {type(termination_fn)!r}"
        )
    config, instance = _provider(args["provider"])
    for name in ("image", "template", "cwd"):
        value = args[name]
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"SandboxEnv({name}=...) must be a non-empty string or None")
    template = args["template"]
    if template is not None and template.count("/") != 1:
        raise ValueError(f"SandboxEnv(template=...) must be 'namespace/name', got {template!r}")
    _check_number("max_episode_steps", args["max_episode_steps"], integer=True, minimum=1)
    _check_number("step_timeout_s", args["step_timeout_s"], integer=False, minimum=0.001)
    _check_number("max_obs_length", args["max_obs_length"], integer=True, minimum=MIN_OBS_LENGTH)
    render_mode = args["render_mode"]
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(
            f"SandboxEnv(render_mode=...) must be None or one of {list(render_modes)}, "
            f"got {render_mode!r}"
        )
    return EnvOptions(
        reward_fn=reward_fn,
        termination_fn=termination_fn,
        provider_config=config,
        provider_instance=instance,
        image=args["image"],
        template=template,
        max_episode_steps=int(args["max_episode_steps"]),
        step_timeout_s=float(args["step_timeout_s"]),
        max_obs_length=int(args["max_obs_length"]),
        cwd=args["cwd"],
        exec_env=_exec_env(args["env"]),
        shell=_shell_argv(args["shell"]),
        render_mode=render_mode,
    )
