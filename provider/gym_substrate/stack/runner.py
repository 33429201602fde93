"""Where a stack's shell steps run: this machine (kind) or the borrowed host over SSH.

One seam so every component is written once: the same builder script becomes a
`commands.Command` that runs here or, given a `Connection`, over SSH. Scripts are hashed into
`triggers`, so a changed script re-runs its step; steps that own a delete script are replaced
delete-first, so a re-run never tears down what its own replacement just created.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pulumi

from gym_substrate.stack.commands import Command, Connection
from gym_substrate.stack.scripts import as_command

__all__ = ["Runner"]


@dataclass(frozen=True)
class Runner:
    connection: Connection | None = None
    cwd: str | None = None
    # Resources every step waits for (on a host: its preparation), so destroy removes every
    # step before the host's wipe and revert-root run.
    after: tuple[pulumi.Resource, ...] = ()

    @property
    def remote(self) -> bool:
        return self.connection is not None

    def run(
        self,
        name: str,
        script: pulumi.Input[str],
        *,
        parent: pulumi.Resource,
        delete: str | None = None,
        depends_on: list[pulumi.Resource] | None = None,
        triggers: list[pulumi.Input[str]] | None = None,
        secret_stdout: bool = False,
    ) -> Command:
        body = pulumi.Output.from_input(script)
        digest = body.apply(
            lambda text: hashlib.sha256((text + "\0" + (delete or "")).encode()).hexdigest()
        )
        opts = pulumi.ResourceOptions(
            parent=parent,
            depends_on=[*self.after, *(depends_on or [])],
            delete_before_replace=delete is not None,
            additional_secret_outputs=["stdout"] if secret_stdout else None,
        )
        all_triggers: list[pulumi.Input[str]] = [digest, *(triggers or [])]
        create = body.apply(as_command)
        delete_cmd = as_command(delete) if delete is not None else None
        return Command(
            name,
            create=create,
            delete=delete_cmd,
            triggers=all_triggers,
            dir=None if self.connection is not None else self.cwd,
            connection=self.connection,
            opts=opts,
        )
