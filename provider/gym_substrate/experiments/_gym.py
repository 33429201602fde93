"""`--driver gym`: the same arms through real NeMo Gym (issue 13 §3), not built yet.

The driver would start Gym's servers with the provider config and the replay policy as the
model, and collect N rollouts at once with Gym's own rollout collection. It needs the Python
3.13 environment with NeMo Gym 0.7.0 that `.ci/gym-env build` makes; until the driver exists,
`gym_driver_error` says where that environment is (or how to build it) and what to use instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from gym_substrate.experiments._errors import ExperimentError

__all__ = ["DRIVERS", "gym_driver_error", "gym_env_path"]

DRIVERS = ("synthetic", "gym")


def gym_env_path() -> Path | None:
    """The built NeMo Gym environment (`.ci/gym-env`'s chroot), or None if there is none."""
    root = Path(os.environ.get("GYM_SUBSTRATE_CACHE") or "/var/cache/gym-substrate")
    current = root / "gym-chroot" / "current"
    return current if (current / ".gym-env-complete").is_file() else None


def gym_driver_error() -> ExperimentError:
    """Why `--driver gym` cannot run here, naming the fix."""
    env = gym_env_path()
    if env is None:
        return ExperimentError(
            "--driver gym runs NeMo Gym 0.7.0 in its Python 3.13 environment, which is not built "
            "on this machine: build it from a gym-substrate checkout with `.ci/gym-env build` "
            "(as root; it prints the environment's path), or use --driver synthetic"
        )
    return ExperimentError(
        f"--driver gym is not implemented yet (issue 13 §3): the NeMo Gym environment exists at "
        f"{env}, but starting Gym's servers with the replay policy as the model is still to be "
        "written; use --driver synthetic, which drives the same provider calls directly"
    )
