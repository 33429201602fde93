"""Pulumi components for gym-substrate's stacks.

Components only wire resources: every object and script comes from the Pulumi-free builders in
`gym_substrate.infra`, which are tested without mocks. Each component takes one frozen args
object, parents every child to itself, uses the explicit Kubernetes provider it is given, and
ends with `register_outputs`.
"""

from __future__ import annotations

from substrate_infra.components import (
    Access,
    ActorTemplates,
    AgentImage,
    BorrowedHost,
    KindCluster,
    Observability,
    Runtime,
    SubstrateInstall,
    WorkerPool,
)
from substrate_infra.runner import Runner

__all__ = [
    "Access",
    "ActorTemplates",
    "AgentImage",
    "BorrowedHost",
    "KindCluster",
    "Observability",
    "Runner",
    "Runtime",
    "SubstrateInstall",
    "WorkerPool",
]
