"""Helpers for the stack tests: repo paths, stack configs, and a Pulumi mock harness.

The harness runs the real `infra/__main__.py` once per stack file under `pulumi.runtime.set_mocks`
and records every registration request (type, name, parent, dependencies, secret outputs),
which is what the component tests assert on. Command resources get canned stdout standing in for
what the scripts print on a real machine.
"""

from __future__ import annotations

import asyncio
import json
import re
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gym_substrate.stack.config import StackConfig, load_stack_file, stack_file

REPO = Path(__file__).resolve().parents[2]
STACKS = ("kind-gvisor", "kind-microvm", "host-gvisor", "host-microvm")
# Our WorkerPool and SandboxConfig schemas, written from upstream's pkg/api/v1alpha1 types.
CRD_DIR = REPO / "manifests" / "crds"
WORKER = "ghcr.io/agent-substrate/substrate/ateom-gvisor:v0.3.0@sha256:" + "a" * 64
AGENT = "localhost:5001/gym-substrate/sandbox-agent@sha256:" + "b" * 64
PINNED = "python@sha256:" + "d" * 64
SOURCE = "/home/op/.gym-substrate/substrate-gvisor/substrate"
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n"
# Our dynamic provider's step resource (gym_substrate.stack.commands) and its file copy.
COMMAND = "pulumi-python:dynamic/gymsubstrate:Command"
COPY = "pulumi-python:dynamic/gymsubstrate:CopyToHost"
# Our ateapi resources (gym_substrate.stack.templates).
TEMPLATE = "pulumi-python:dynamic/gymsubstrate:ActorTemplate"
ATESPACE = "pulumi-python:dynamic/gymsubstrate:Atespace"
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n"


def stack_config(stack: str) -> StackConfig:
    return load_stack_file(stack_file(REPO, stack))


def stack_values(stack: str) -> dict[str, Any]:
    doc = yaml.safe_load(stack_file(REPO, stack).read_text())
    return dict(doc["config"])


@dataclass
class Registration:
    typ: str
    name: str
    urn: str
    parent: str
    dependencies: list[str]
    inputs: dict[str, Any]
    secret_outputs: list[str]
    delete_before_replace: bool
    raw: dict[str, Any]


@dataclass
class StackRun:
    registrations: list[Registration]
    outputs: dict[str, Any]
    secrets: dict[str, bool]
    globals: dict[str, Any] = field(repr=False)

    def by_name(self, name: str) -> Registration:
        found = [r for r in self.registrations if r.name == name]
        assert len(found) == 1, (name, [r.name for r in self.registrations])
        return found[0]

    def of_type(self, typ: str) -> list[Registration]:
        return [r for r in self.registrations if r.typ == typ]

    def commands(self, *, remote: bool) -> list[Registration]:
        """The step resources that run here (remote=False) or over SSH (remote=True)."""
        return [r for r in self.of_type(COMMAND) if bool(r.inputs.get("connection")) == remote]

    def urn(self, name: str) -> str:
        return self.by_name(name).urn


def _stdout(name: str, inputs: dict[str, Any]) -> str:
    if name == "substrate-source":
        return SOURCE + "\n"
    if name == "worker-image":
        return WORKER + "\n"
    if name == "kubeconfig":
        return KUBECONFIG
    if name == "ca":
        return CA_PEM
    if name == "agent-image":
        return AGENT + "\n"
    if name.startswith("image-"):
        return PINNED + "\n"
    if name == "microvm-assets":
        return json.dumps(
            {"arch": "arm64"}
            | {
                k: "e" * 64
                for k in (
                    "cloud-hypervisor",
                    "virtiofsd",
                    "kata-kernel",
                    "kata-image",
                    "kata-config",
                )
            }
        )
    if name == "client-token":
        # What the script's last `echo "<workdir>/<cluster>/ate-client.token"` prints.
        (path,) = re.findall(r'echo "([^"]*/ate-client\.token)"', str(inputs.get("create", "")))
        return path.replace("${HOME}", str(Path.home())) + "\n"
    return "ok\n"


def run_stack(
    stack: str, overrides: dict[str, Any] | None = None, *, stdout: dict[str, str] | None = None
) -> StackRun:
    """Run the program for `stack`; `stdout` replaces what the named command steps print."""
    from pulumi.runtime import mocks as pm

    printed = dict(stdout or {})

    registrations: list[Registration] = []

    class Mocks(pm.Mocks):
        def new_resource(self, args: pm.MockResourceArgs) -> tuple[str, dict[str, Any]]:
            outputs = dict(args.inputs)
            if args.typ == COMMAND:
                outputs["stdout"] = printed.get(args.name, _stdout(args.name, args.inputs))
            if args.typ == TEMPLATE:
                meta = args.inputs["template"]["metadata"]
                outputs["ref"] = f"{meta['atespace']}/{meta['name']}"
                outputs["goldenTag"] = "ate-golden/golden-uid"
            if args.typ == ATESPACE:
                outputs["adopted"] = False
            return f"{args.name}-id", outputs

        def call(self, args: pm.MockCallArgs) -> dict[str, Any]:
            return {}

    class Monitor(pm.MockMonitor):
        def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (gRPC method name)
            from google.protobuf import json_format
            from pulumi.runtime import rpc

            response = super().RegisterResource(request)
            registrations.append(
                Registration(
                    typ=request.type,
                    name=request.name,
                    urn=response.urn,
                    parent=request.parent,
                    dependencies=list(request.dependencies),
                    inputs=rpc.deserialize_properties(request.object),
                    secret_outputs=list(request.additionalSecretOutputs),
                    delete_before_replace=bool(request.deleteBeforeReplace),
                    raw=json_format.MessageToDict(request.object),
                )
            )
            return response

    # Pulumi's mock runtime drives its own event loop through asyncio.get_event_loop(); an
    # earlier pytest-asyncio test may have closed and unset the main thread's loop, so give the
    # program a fresh one and close it afterwards.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return _run_program(stack, overrides, registrations, Mocks, Monitor)
    finally:
        # A failed program leaves Pulumi's tasks pending: finish them on their own loop.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        asyncio.set_event_loop(None)
        loop.close()


def _run_program(
    stack: str,
    overrides: dict[str, Any] | None,
    registrations: list[Registration],
    mocks_cls: Any,
    monitor_cls: Any,
) -> StackRun:
    import pulumi
    from pulumi.runtime import mocks as pm

    mocks = mocks_cls()
    pm.set_mocks(
        mocks, project="gym-substrate", stack=stack, preview=False, monitor=monitor_cls(mocks)
    )
    values = stack_values(stack)
    values.update(overrides or {})
    config = {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
    secret_keys: list[str] = []
    if values.get("gym-substrate:target") == "host" and "gym-substrate:sshPrivateKey" not in values:
        config["gym-substrate:sshPrivateKey"] = SSH_KEY
        secret_keys.append("gym-substrate:sshPrivateKey")
    pulumi.runtime.set_all_config(config, secret_keys)

    result: dict[str, Any] = {}
    secrets: dict[str, bool] = {}
    program_globals: dict[str, Any] = {}

    @pulumi.runtime.test  # type: ignore[misc]
    def program() -> Any:
        program_globals.update(
            runpy.run_path(str(REPO / "infra" / "__main__.py"), run_name="__main__")
        )
        parts = program_globals["parts"]
        kubeconfig = parts["cluster"].kubeconfig
        checks = {
            "kubeconfig": kubeconfig,
            "ca": parts["ca_pem"],
            "templates": parts["templates"].names,
            "worker": parts["install"].worker_image,
            "agent": parts["agent"].image,
            "providerConfig": parts["provider_config"],
        }

        def keep(values: dict[str, Any]) -> None:
            result.update(values)

        async def secret_flags() -> dict[str, bool]:
            return {"kubeconfig": await kubeconfig.is_secret()}

        return pulumi.Output.all(
            pulumi.Output.all(**checks).apply(keep),
            pulumi.Output.from_input(secret_flags()).apply(secrets.update),
        )

    program()
    return StackRun(registrations, result, secrets, program_globals)


SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
SIG_KEY = "4dabf18193072939515e22adb298388d"


def plain_occurrences(value: Any, needle: str, inside_secret: bool = False) -> int:
    """How often `needle` appears in a serialized request outside a secret wrapper."""
    if isinstance(value, dict):
        secret = inside_secret or value.get(SIG_KEY) == SECRET_SIG
        return sum(plain_occurrences(v, needle, secret) for v in value.values())
    if isinstance(value, list):
        return sum(plain_occurrences(v, needle, inside_secret) for v in value)
    return int(isinstance(value, str) and needle in value and not inside_secret)


def secret_occurrences(value: Any, needle: str) -> int:
    return _count(value, needle) - plain_occurrences(value, needle)


def _count(value: Any, needle: str) -> int:
    if isinstance(value, dict):
        return sum(_count(v, needle) for v in value.values())
    if isinstance(value, list):
        return sum(_count(v, needle) for v in value)
    return int(isinstance(value, str) and needle in value)
