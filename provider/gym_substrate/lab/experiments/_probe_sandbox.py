"""The probes' hands in a sandbox: one probe sandbox, a checked command, a data-holding process.

Kept apart from `probes` because every probe (and the cancelled-pause race in `_probe_race`)
works through these, while each probe's judging is its own.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Awaitable
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._guest_scripts import HOLDER_SCRIPT
from gym_substrate.lab.experiments.backend import Target, merged_kwargs


async def run_checked(
    provider: Any, handle: Any, command: str, what: str, limit_s: float = 300
) -> str:
    """`command`'s stdout; a non-zero exit is an error naming `what` and the output's tail."""
    result = await provider.exec(handle, command, timeout_s=limit_s)
    if result.return_code != 0:
        raise ExperimentError(
            f"{what} failed in the sandbox (exit {result.return_code}"
            f"{', ' + result.error_type if result.error_type else ''}): "
            f"{(result.stderr or result.stdout or '').strip()[-500:]}"
        )
    return str(result.stdout)


async def timed(call: Awaitable[Any]) -> float:
    """Seconds `call` took."""
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


class Holder:
    """The data-holding process of the memory and footprint probes, in one sandbox."""

    def __init__(self, provider: Any, handle: Any, root: str) -> None:
        self.provider, self.handle, self.root = provider, handle, root

    async def start(self, mib: int, seed: int) -> None:
        r = shlex.quote(self.root)
        await run_checked(
            self.provider,
            self.handle,
            f"rm -rf {r} && mkdir -p {r} && "
            f"cat > {r}/holder.py <<'GSPROBE'\n{HOLDER_SCRIPT}\nGSPROBE\n"
            f"(cd {r} && exec nohup python3 holder.py {mib} {seed} . "
            "</dev/null >holder.log 2>&1) &\n"
            f"for i in $(seq 1 2400); do [ -f {r}/pid ] && exit 0; sleep 0.05; done; "
            f"cat {r}/holder.log; exit 1",
            f"starting a process holding {mib} MiB (needs python3 in the sandbox)",
        )
        self.mib, self.seed = mib, seed

    async def check(self) -> str:
        r = shlex.quote(self.root)
        script = (
            f"t=$(date +%s%N); pid=$(cat {r}/pid 2>/dev/null); "
            f'if [ -n "$pid" ] && grep -q holder.py /proc/$pid/cmdline 2>/dev/null; then '
            f"echo $t > {r}/request; kill -USR1 $pid; "
            f"for i in $(seq 1 2400); do [ -f {r}/result-$t ] && {{ cat {r}/result-$t; exit 0; }}; "
            f"sleep 0.05; done; echo memory=no-answer file=unchecked; "
            f"else printf 'memory=lost '; python3 {r}/holder.py {self.mib} {self.seed} {r} file; fi"
        )
        held = await run_checked(self.provider, self.handle, script, "checking the held data")
        return held.strip()

    async def stop(self) -> None:
        r = shlex.quote(self.root)
        await self.provider.exec(
            self.handle,
            f'pid=$(cat {r}/pid 2>/dev/null); [ -n "$pid" ] && grep -q holder.py '
            f"/proc/$pid/cmdline 2>/dev/null && kill $pid; rm -rf {r}",
            timeout_s=60,
        )


@contextlib.asynccontextmanager
async def probe_sandbox(target: Target) -> Any:
    """(provider, handle) of one sandbox that never parks on its own, closed on the way out."""
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.types import SandboxSpec

    kwargs = merged_kwargs(target.provider_kwargs, lifecycle={"idle_policy": "never"})
    provider = SubstrateProvider(**kwargs)
    handle = None
    try:
        handle = await provider.create(SandboxSpec(metadata={"experiment": "probe"}))
        yield provider, handle
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                await provider.close(handle)
        await provider.aclose()
