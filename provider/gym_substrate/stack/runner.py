"""Where a stack's shell steps run: this machine (kind) or the borrowed host over SSH.

One seam so every component is written once: the same builder script becomes a
`command.local.Command` or a `command.remote.Command`. Scripts are hashed into `triggers`, so a
changed script re-runs its step; steps that own a delete script are replaced delete-first, so a
re-run never tears down what its own replacement just created.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import cast

import pulumi
from pulumi_command import local, remote

from gym_substrate.stack.scripts import as_command

__all__ = ["Runner"]


@dataclass(frozen=True)
class Runner:
    connection: remote.ConnectionArgs | None = None
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
    ) -> local.Command:
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
        if self.connection is not None:
            # Same outputs (stdout, stderr) as local.Command; typed as one step kind.
            return cast(
                local.Command,
                remote.Command(
                    name,
                    connection=self.connection,
                    create=create,
                    delete=delete_cmd,
                    triggers=all_triggers,
                    opts=opts,
                ),
            )
        return local.Command(
            name, create=create, delete=delete_cmd, triggers=all_triggers, dir=self.cwd, opts=opts
        )
