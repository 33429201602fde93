"""gVisor (runsc) sandboxes for the local backend, with the workarounds gvisor-local.md needs.

Layers, lowest first: ``net`` (per-slot netns + veth, machine-wide address leases), ``bundle``
(OCI specs), ``runsc`` (async CLI wrappers), ``host`` (finding leftovers), ``probe``
(``gvisor_problem``), ``folders`` (a sandbox's folder, checkpoint images), ``ready`` (the
wakeup probe), ``slots`` (each slot's namespace now, its worker IP, the book of namespace units),
``sandboxes`` (the sandbox registry, and the ``Parts`` the runtime shares), ``frozen`` and
``freezer`` (the frozen pause tier), ``warm`` (the warm pool), ``adoption``, ``runtime``
(``GvisorRuntime``, the control plane's runtime seam).
"""

from __future__ import annotations

from gym_substrate.local.runtimes.gvisor.probe import gvisor_problem
from gym_substrate.local.runtimes.gvisor.runtime import GvisorRuntime, default_agent_command

__all__ = ["GvisorRuntime", "default_agent_command", "gvisor_problem"]
