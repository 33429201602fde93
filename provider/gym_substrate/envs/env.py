"""`SandboxEnv`: a Gymnasium env whose actions are shell commands run in a fresh sandbox.

It keeps the API of agent-sandbox's seed env (constructor shape, reward/termination functions,
`info` keys, `env_error` on sandbox failure) and fixes what that one gets wrong: the sandbox is
released the moment an episode ends instead of at the next `reset()`; the spaces admit every
observation (any Unicode text, empty included) and long output keeps its head *and* tail around a
visible cut marker; stepping an ended episode raises instead of silently counting on; and the
async provider is driven through one event loop thread per env, created lazily so the env can be
pickled (by its constructor arguments) into `AsyncVectorEnv` workers.
"""

from __future__ import annotations

import copy
import logging
import shlex
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from gym_substrate.envs._episode import EnvSnapshot, episode_of
from gym_substrate.envs._options import (
    MIN_OBS_LENGTH,
    PROVIDER_NAME,
    EnvClosedError,
    EpisodeNotRunningError,
    Phase,
    check_options,
)
from gym_substrate.envs._runtime import Runtime, SandboxProviderLike, finalize
from gym_substrate.envs._spaces import UnicodeText, sanitize
from gym_substrate.envs.rewards import RewardFn, TerminationFn

if TYPE_CHECKING:
    from gym_substrate.nemo.snapshot import SandboxSnapshot

__all__ = [
    "ACTION_MAX_LENGTH",
    "ENV_ID",
    "MIN_OBS_LENGTH",
    "READY_OBSERVATION",
    "SandboxEnv",
    "SandboxProviderLike",
    "EnvClosedError",
    "EpisodeNotRunningError",
    "build_observation",
]

logger = logging.getLogger(__name__)

ENV_ID: Final = "gym_substrate/Sandbox-v0"
READY_OBSERVATION: Final = "Sandbox ready."
ACTION_MAX_LENGTH: Final = 16384
"""Longest command, in characters: 4 UTF-8 bytes each stays under Linux's 128 KiB argv limit."""
TIMEOUT_EXIT_CODE: Final = 124
"""Exit code reported when a command outlived `step_timeout_s` (as coreutils `timeout` does)."""


def _cut_marker(cut: int) -> str:
    return f"\n[... {cut} characters cut ...]\n"


def build_observation(stdout: str, stderr: str, max_length: int) -> str:
    """stdout, then `[stderr]` and stderr when there is any, cut to `max_length` characters.

    A cut keeps the first and the last part (a command's own banner and its final error are both
    usually what matters) around a marker that says how much is missing.
    """
    parts = [stdout] if stdout else []
    if stderr:
        parts.append("[stderr]\n" + stderr)
    text = "\n".join(parts)
    if len(text) > max_length:
        cut = len(text) - max_length
        while True:  # the marker's length depends on the number it prints; settle it
            marker = _cut_marker(cut)
            new_cut = len(text) - (max_length - len(marker))
            if new_cut == cut:
                break
            cut = new_cut
        keep = max_length - len(marker)
        head = keep - keep // 2
        tail = keep - head
        text = text[:head] + marker + (text[len(text) - tail :] if tail else "")
    return sanitize(text)


def _rebuild(cls: type[SandboxEnv], kwargs: dict[str, Any]) -> SandboxEnv:
    return cls(**kwargs)


class SandboxEnv(gym.Env[str, str]):
    """Each episode in a fresh sandbox; each action a shell command; each observation its output.

    `provider` is a NeMo Gym style mapping with one key, `{"substrate": {...provider config...}}`
    (the env builds the provider, drives it from its own event loop thread and closes it in
    `close()`; this form also pickles, which `AsyncVectorEnv` needs), or a provider instance that
    the caller owns and closes.

    A step's observation is stdout, then `[stderr]` and stderr when there is any, cut to
    `max_obs_length` around a marker (`build_observation`); `info` holds `exit_code`, `stdout`,
    `stderr` (both uncut), `elapsed_ms`, `step`, `env_error` and `error_type`. A sandbox failure
    gives `env_error=True`, `exit_code=-1` and the episode goes on; a command that outlives
    `step_timeout_s` gives exit code 124 and `error_type="timeout"`. The step that terminates or
    truncates the episode releases the sandbox before it returns.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012

    def __init__(
        self,
        reward_fn: RewardFn,
        termination_fn: TerminationFn,
        provider: Mapping[str, Any] | SandboxProviderLike,
        *,
        image: str | None = None,
        template: str | None = None,
        max_episode_steps: int = 20,
        step_timeout_s: float = 60,
        max_obs_length: int = 4096,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        shell: str | Sequence[str] | None = None,
        render_mode: str | None = None,
    ) -> None:
        arguments = dict(locals())
        del arguments["self"]
        options = check_options(arguments, self.metadata["render_modes"])
        config = options.provider_config
        self.reward_fn = options.reward_fn
        self.termination_fn = options.termination_fn
        self.image = options.image
        self.template = options.template
        self.max_episode_steps = options.max_episode_steps
        self.step_timeout_s = options.step_timeout_s
        self.max_obs_length = options.max_obs_length
        self.cwd = options.cwd
        self.exec_env = options.exec_env
        self.shell = options.shell
        self.render_mode = options.render_mode

        self.observation_space = UnicodeText(self.max_obs_length, min_length=0)
        self.action_space = UnicodeText(ACTION_MAX_LENGTH, min_length=0, allow_nul=False)

        self._init_kwargs: dict[str, Any] = {
            "reward_fn": reward_fn,
            "termination_fn": termination_fn,
            "provider": {PROVIDER_NAME: config} if config is not None else provider,
            "image": image,
            "template": template,
            "max_episode_steps": max_episode_steps,
            "step_timeout_s": step_timeout_s,
            "max_obs_length": max_obs_length,
            "cwd": cwd,
            "env": options.exec_env,
            "shell": shell,
            "render_mode": render_mode,
        }
        if config is not None:
            # Built directly (not by gym.make, which overwrites this): still describe how to make
            # another one, and say that a sandbox's steps are not reproducible from a seed.
            self.spec = EnvSpec(
                id=ENV_ID,
                entry_point="gym_substrate.envs.env:SandboxEnv",
                nondeterministic=True,
                order_enforce=False,
                disable_env_checker=True,
                kwargs=dict(self._init_kwargs),
            )

        self._runtime = Runtime(config, options.provider_instance)
        self._finalizer = weakref.finalize(self, finalize, self._runtime)
        self._phase = Phase.IDLE
        self._ended_as: str | None = None  # "terminated" or "truncated", in Phase.ENDED
        self._step_count = 0
        self._task: Any = ""
        self._last_render: str | None = None
        self._last_observation = READY_OBSERVATION

    # -- pickling: by constructor, so a worker process builds its own loop and provider -------
    def __reduce__(self) -> tuple[Any, ...]:
        if not self._runtime.owns_provider:
            raise TypeError(
                "a SandboxEnv built around a provider instance cannot be pickled; pass the "
                "provider as a mapping {'substrate': {...}} so each process builds its own"
            )
        return (_rebuild, (type(self), dict(self._init_kwargs)))

    # -- gymnasium API ----------------------------------------------------------------------
    @property
    def sandbox_id(self) -> str | None:
        """The id of the current episode's sandbox, or None between episodes."""
        handle = self._runtime.handle
        return None if handle is None else handle.sandbox_id

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Release any previous sandbox and start an episode in a new one.

        `options={"task": ...}` passes the task to the reward and termination functions.
        `options={"snapshot": snap}` starts from a snapshot instead of a fresh sandbox: one from
        `snapshot()` continues that episode (same step count, task, last observation, and copies
        of the reward and termination functions' state); a provider's plain sandbox snapshot
        starts a new episode (step 0, `task` as given) on that sandbox's state. The seed only
        seeds `np_random`: a sandbox's behaviour cannot be replayed from it.
        """
        super().reset(seed=seed)
        self._check_open()
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise TypeError(f"reset(options=...) must be a mapping or None, got {options!r}")
        unknown = sorted(set(options) - {"task", "snapshot"})
        if unknown:
            raise ValueError(
                f"reset(options=...) has unknown keys {unknown}; allowed: ['snapshot', 'task']"
            )
        episode = None
        if options.get("snapshot") is not None:
            episode = episode_of(
                options["snapshot"],
                options,
                reward_fn=self.reward_fn,
                termination_fn=self.termination_fn,
                max_episode_steps=self.max_episode_steps,
            )
        task = episode.task if episode is not None else options.get("task", "")

        self._phase = Phase.IDLE
        self._release_quietly()
        from gym_substrate.nemo.types import SandboxSpec

        provider_options: dict[str, Any] = {"template": self.template} if self.template else {}
        if episode is not None:
            provider_options["from_snapshot"] = episode.snapshot
        handle = self._runtime.create(
            SandboxSpec(image=self.image, provider_options=provider_options)
        )
        self._task = task
        self._step_count = 0
        self._ended_as = None
        observation = READY_OBSERVATION
        info: dict[str, Any] = {"sandbox_id": handle.sandbox_id, "task": copy.deepcopy(task)}
        if episode is not None and episode.resume is not None:
            observation, self.reward_fn, self.termination_fn = episode.resume
            self._step_count = episode.step
            info.update(step=episode.step, snapshot=episode.snapshot.ref)
        else:
            self.reward_fn.reset(task)
            self.termination_fn.reset(task)
            if episode is not None:
                info["snapshot"] = episode.snapshot.ref
        self._phase = Phase.RUNNING
        self._last_observation = observation
        self._last_render = observation
        return observation, info

    def snapshot(self, *, name: str | None = None) -> EnvSnapshot:
        """Snapshot the episode in progress: the sandbox (files, processes, memory) and the env's
        side (step count, task, last observation, copies of the reward and termination
        functions' state). `reset(options={"snapshot": snap})`, in this env or any env built the
        same way (it pickles, e.g. into `AsyncVectorEnv` workers), continues from this step.

        This episode goes on in its own sandbox (the next step resumes it). The snapshot lasts
        until `delete_snapshot()` (or `gym-substrate sweep`), independent of this env.
        """
        self._check_open()
        if self._phase is not Phase.RUNNING:
            raise EpisodeNotRunningError(
                "snapshot() needs an episode in progress: call reset() first"
                if self._ended_as is None
                else f"this episode has ended ({self._ended_as}) and its sandbox was released; "
                "snapshot() an episode before its last step"
            )
        snap = self._runtime.snapshot(name)
        return EnvSnapshot.of(
            snap,
            step=self._step_count,
            task=self._task,
            observation=self._last_observation,
            reward_fn=self.reward_fn,
            termination_fn=self.termination_fn,
        )

    def delete_snapshot(self, snapshot: SandboxSnapshot | str, *, force: bool = False) -> None:
        """Delete a snapshot (refused while sandboxes made from it still run on it, unless
        `force`); one already gone is done."""
        self._check_open()
        self._runtime.delete_snapshot(snapshot, force)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run `action` in the sandbox; the class docstring describes the observation and `info`."""
        self._check_open()
        if self._phase is not Phase.RUNNING:
            if self._ended_as is not None:
                raise EpisodeNotRunningError(
                    f"This episode has ended ({self._ended_as}) and its sandbox was released; "
                    "call reset() to start a new one."
                )
            raise EpisodeNotRunningError("Call reset() before step().")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str (a shell command), got {type(action)!r}")
        if action not in self.action_space:
            raise ValueError(
                f"action is outside the action space: at most {ACTION_MAX_LENGTH} characters, "
                "no NUL character, no lone surrogate"
            )
        self._runtime.require_handle()
        self._step_count += 1
        started = time.monotonic()
        error_type: str | None = None
        try:
            result = self._runtime.exec(
                self._command(action),
                cwd=self.cwd,
                env=self.exec_env,
                timeout_s=self.step_timeout_s,
            )
        except Exception as exc:
            logger.warning("Failed to run action in sandbox %s: %r", self.sandbox_id, exc)
            stdout, stderr = "", f"{type(exc).__name__}: {exc}"
            exit_code, env_error, error_type = -1, True, "sandbox"
        else:
            stdout, stderr = result.stdout or "", result.stderr or ""
            error_type = result.error_type
            if error_type is None:
                exit_code, env_error = int(result.return_code), False
            elif error_type == "timeout":
                # The command's own doing (it ran too long), not a sandbox failure.
                exit_code, env_error = TIMEOUT_EXIT_CODE, False
                if not stderr:
                    stderr = f"command timed out after {self.step_timeout_s:g} s"
            else:
                exit_code, env_error = -1, True
                logger.warning(
                    "Sandbox %s failed to run an action (%s): %s",
                    self.sandbox_id,
                    error_type,
                    stderr,
                )
        elapsed_ms = int((time.monotonic() - started) * 1000)

        obs = build_observation(stdout, stderr, self.max_obs_length)
        info: dict[str, Any] = {
            "exit_code": exit_code,
            "stdout": stdout,
            "stderr": stderr,
            "elapsed_ms": elapsed_ms,
            "step": self._step_count,
            "env_error": env_error,
            "error_type": error_type,
        }
        reward = float(self.reward_fn(action, obs, info, self._task))
        terminated = bool(self.termination_fn(obs, info, self._task))
        truncated = self._step_count >= self.max_episode_steps
        self._last_render = f"$ {action}\n{obs}\n[exit code {exit_code}]"
        self._last_observation = obs
        if terminated or truncated:
            self._phase = Phase.ENDED
            self._ended_as = "terminated" if terminated else "truncated"
            try:
                self._runtime.release()
            except Exception as exc:
                logger.warning("SandboxEnv: releasing the sandbox failed (may be leaked): %s", exc)
                info["release_error"] = f"{type(exc).__name__}: {exc}"
        return obs, reward, terminated, truncated, info

    def render(self) -> str | None:  # type: ignore[override]
        """With `render_mode="ansi"`: the last command, its observation and its exit code."""
        if self.render_mode != "ansi":
            return None
        return self._last_render

    def close(self) -> None:
        """Release the sandbox, close the provider if the env built it, stop the loop thread.

        Idempotent; after it, `reset()` and `step()` raise.
        """
        if self._phase is Phase.CLOSED:
            return
        self._phase = Phase.CLOSED
        self._finalizer.detach()
        self._runtime.shutdown()

    @property
    def closed(self) -> bool:
        return self._phase is Phase.CLOSED

    # -- helpers ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._phase is Phase.CLOSED:
            raise EnvClosedError("This SandboxEnv is closed; create a new one.")

    def _command(self, action: str) -> str:
        if self.shell is None:
            return action
        return shlex.join(self.shell) + " " + shlex.quote(action)

    def _release_quietly(self) -> None:
        try:
            self._runtime.release()
        except Exception as exc:
            logger.warning("SandboxEnv: releasing the previous sandbox failed: %s", exc)

    def __repr__(self) -> str:
        state = "idle" if self._phase is Phase.ENDED else self._phase.value
        return f"<SandboxEnv {state} sandbox={self.sandbox_id!r} step={self._step_count}>"
