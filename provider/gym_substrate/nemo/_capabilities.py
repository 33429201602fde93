"""What Substrate can and cannot honour of Gym 0.7.0's Compose-era capabilities, and why.

Gym's Compose adapter (`nemo_gym/sandbox/adapters/docker_compose.py`) asks a provider before it
provisions anything: `validate_runtime_requirements` for `cap_add`/`shm_size`,
`validate_port_forwarding` for `network_mode: service:x`, `shared_volume_options` for volumes and
`validate_networking` for every collection. A provider without the methods gets Gym's generic
"does not support ..."; these answer with the reason instead, raised as `NotImplementedError`
(what Gym's own providers raise for a capability their deployment lacks).

Facts of Substrate behind each answer (docs/provider.md has the table):
- an actor is reached from outside only through the router, on TCP port 80 of its worker pod,
  and that address changes on every resume; no other port is forwarded (real:
  cmd/ateom-gvisor/main.go DNATs only podIP:80; cmd/atenet/internal/router/extproc.go);
- an ActorTemplate has no securityContext: containers run with CAP_AUDIT_WRITE, CAP_KILL and
  CAP_NET_BIND_SERVICE only (real: cmd/atelet/oci.go), and /dev is a tmpfs of the sandbox;
- its only volume type is a per-actor `durableDir` (real: pkg/api/v1alpha1/actortemplate_types.go):
  nothing is shared between actors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gym_substrate.nemo.types import SandboxExecResult, SandboxHandle

__all__ = [
    "GRANTED_CAPABILITIES",
    "ComposeCapabilities",
    "NETWORKING",
    "PORT_FORWARDING",
    "SHARED_STORAGE",
    "capability_names",
    "check_shm_size",
    "runtime_check_script",
]

NETWORKING = (
    "Substrate sandboxes cannot reach each other on service ports: an actor is reachable only "
    "through the router on TCP port 80, and its worker address changes on every resume. Run "
    "the services in one sandbox (exec with preserve_background_services=True) or reach port "
    "80 of a sandbox through endpoint()"
)
PORT_FORWARDING = (
    "Substrate sandboxes cannot forward ports to one another: inbound traffic reaches an actor "
    "only from the router on TCP port 80, so network_mode: service:<name> cannot be honoured. "
    "Run both services in one sandbox instead"
)
SHARED_STORAGE = (
    "Substrate has no storage shared between sandboxes: an ActorTemplate's only volume type is "
    "a per-actor durableDir. Copy files into each sandbox with upload() instead of a shared "
    "volume"
)
# What an actor's container runs with on a Substrate cluster (cmd/atelet/oci.go).
GRANTED_CAPABILITIES = ("AUDIT_WRITE", "KILL", "NET_BIND_SERVICE")
# Bit numbers in /proc/<pid>/status CapEff (linux/capability.h).
_CAP_BITS = {"AUDIT_WRITE": 29, "KILL": 5, "NET_BIND_SERVICE": 10}


def capability_names(cap_add: Iterable[Any]) -> tuple[str, ...]:
    """Compose `cap_add` entries as bare upper-case names (`CAP_KILL`, `kill` -> `KILL`)."""
    if isinstance(cap_add, str):
        raise ValueError(f"cap_add must be a list of capability names, got {cap_add!r}")
    names = []
    for raw in cap_add:
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError(f"cap_add entries must be capability names, got {raw!r}")
        name = raw.strip().upper().removeprefix("CAP_")
        if name == "ALL":
            raise NotImplementedError(
                "cap_add: ALL cannot be granted: Substrate actors run with "
                f"{', '.join('CAP_' + c for c in GRANTED_CAPABILITIES)} only"
            )
        names.append(name)
    missing = [n for n in names if n not in GRANTED_CAPABILITIES]
    if missing:
        raise NotImplementedError(
            f"cap_add {', '.join('CAP_' + n for n in missing)} cannot be granted: an "
            "ActorTemplate has no securityContext, and Substrate actors run with "
            f"{', '.join('CAP_' + c for c in GRANTED_CAPABILITIES)} only"
        )
    return tuple(names)


def check_shm_size(shm_size: Any) -> int | None:
    if shm_size is None:
        return None
    if isinstance(shm_size, bool) or not isinstance(shm_size, int) or shm_size <= 0:
        raise ValueError(f"shm_size must be a positive number of bytes, got {shm_size!r}")
    return shm_size


def runtime_check_script(caps: tuple[str, ...], shm_size: int | None) -> str:
    """A sh script that exits 1 with the reason unless the sandbox has `caps` and `shm_size`.

    Substrate cannot size /dev/shm or add capabilities, so the check is what can be honoured:
    the sandbox already has them (which a local runtime may not).
    """
    steps = []
    if caps:
        mask = 0
        for name in caps:
            mask |= 1 << _CAP_BITS[name]
        steps.append(
            "eff=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status); "
            f"if [ $(( 0x$eff & {mask:#x} )) -ne {mask} ]; then "
            f"echo 'this sandbox lacks capabilities {' '.join(caps)} (CapEff '\"$eff\"')'; "
            "exit 1; fi"
        )
    if shm_size is not None:
        steps.append(
            "free=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}'); "
            "if [ -z \"$free\" ]; then echo 'this sandbox has no /dev/shm'; exit 1; fi; "
            f"if [ $(( free * 1024 )) -lt {shm_size} ]; then "
            f'echo "/dev/shm has $free KiB free, shm_size asks for {shm_size} bytes; Substrate '
            'cannot resize it"; exit 1; fi'
        )
    return "; ".join(steps) or "true"


class ComposeCapabilities:
    """Gym's `SupportsSandboxNetwork`, `SupportsSandboxPortForwarding`,
    `SupportsSandboxSharedStorage` and `SupportsSandboxRuntimeRequirements`, as Substrate can
    answer them: the first three with the reason they cannot work, the last by checking."""

    async def _check_in_sandbox(self, handle: SandboxHandle, script: str) -> SandboxExecResult:
        raise NotImplementedError  # the provider runs it with exec()

    def validate_networking(self) -> None:
        raise NotImplementedError(NETWORKING)

    async def network_address(self, handle: SandboxHandle) -> str:
        raise NotImplementedError(NETWORKING)

    async def set_hosts(self, handle: SandboxHandle, hosts: Mapping[str, str]) -> None:
        raise NotImplementedError(NETWORKING)

    def validate_port_forwarding(self) -> None:
        raise NotImplementedError(PORT_FORWARDING)

    async def forward_ports(
        self,
        handle: SandboxHandle,
        target_address: str,
        ports: tuple[int, ...],
        *,
        ready_file: str,
    ) -> None:
        raise NotImplementedError(PORT_FORWARDING)

    def shared_volume_options(
        self, source: str | None, target: str, *, read_only: bool = False
    ) -> dict[str, Any]:
        raise NotImplementedError(SHARED_STORAGE)

    def shared_volume_metadata(self) -> dict[str, str]:
        raise NotImplementedError(SHARED_STORAGE)

    def validate_runtime_requirements(
        self, *, cap_add: tuple[str, ...], shm_size: int | None
    ) -> dict[str, str] | None:
        """Capabilities a Substrate actor has anyway pass; any other is NotImplementedError."""
        capability_names(cap_add)
        check_shm_size(shm_size)
        return None

    async def configure_runtime(
        self, handle: SandboxHandle, *, cap_add: tuple[str, ...], shm_size: int | None
    ) -> None:
        """Check in the sandbox that it has the capabilities and the /dev/shm space asked for
        (Substrate can grant neither): `RuntimeError` saying what is missing."""
        caps = capability_names(cap_add)
        shm = check_shm_size(shm_size)
        result = await self._check_in_sandbox(handle, runtime_check_script(caps, shm))
        if result.return_code != 0:
            found = f"{(result.stdout or '').strip()} {(result.stderr or '').strip()}".strip()
            raise RuntimeError(
                f"sandbox {handle.sandbox_id} cannot satisfy cap_add={list(cap_add)} "
                f"shm_size={shm_size}: {found}"
            )
