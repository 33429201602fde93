"""RL experiments on one machine or a cluster: the library behind `gym-substrate arm`, ...

Why: a rollout's sandbox sits idle while the policy model thinks, and Substrate can park it and
give its worker to another rollout. These experiments answer the operator's questions about
that: how many rollouts fit on W actor slots (`arm`, `compare`, `oversub`, `ladder`), what parking
costs and whether a host or sandbox class is sound (`probe`), and they need no model to do it
(`replay_policy`, an OpenAI-compatible server replaying recorded rollouts).

Each experiment is a library function returning plain records; `gym_substrate.cli` prints them
and writes them to an output folder (`artifacts`, `plots`). `backend.local_or_config` is the
one place that knows how a local backend is started. Importing this package imports neither
grpc nor aiohttp; the modules that run against a provider do, when used.
"""

from __future__ import annotations

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._think import ThinkSpec
from gym_substrate.lab.experiments._workload import BUILTIN_WORKLOADS, Workload, load_workload

__all__ = ["BUILTIN_WORKLOADS", "ExperimentError", "ThinkSpec", "Workload", "load_workload"]
