"""Forks end to end on the local backend: what the children see of the source's state.

On gVisor a snapshot holds the sandbox's memory, so a running process comes back in every child
with what it held; the process runtime keeps files only and says so in the snapshot's fidelity.
The process runtime's fork runs against each API era the backend serves (issue 30): v0.3 and
v0.4 snapshots carry a content scope (FULL or DATA), not a fidelity, so there a files-only
snapshot reads as FULL, which the codec reads as MEMORY (`ateapi/codec.py`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gym_substrate import SnapshotInUseError, SubstrateProvider
from gym_substrate.ateapi.eras import CURRENT, ERAS
from gym_substrate.nemo.types import SandboxSpec

from .conftest import make_stack

# A process that keeps a secret in memory only: it never writes it anywhere until asked (a
# file /tmp/ask appears), and takes a new one from /tmp/set. Its pid says it is the same process.
MEMORY_KEEPER = r"""
import os, secrets, time
secret = secrets.token_hex(8)
while True:
    if os.path.exists("/tmp/set"):
        secret = open("/tmp/set").read().strip()
        os.remove("/tmp/set")
    if os.path.exists("/tmp/ask"):
        os.remove("/tmp/ask")
        with open("/tmp/answer.tmp", "w") as f:
            f.write(f"{os.getpid()} {secret}")
        os.replace("/tmp/answer.tmp", "/tmp/answer")
    time.sleep(0.02)
"""

ASK = (
    "rm -f /tmp/answer; touch /tmp/ask; "
    "for i in $(seq 500); do [ -f /tmp/answer ] && break; sleep 0.02; done; cat /tmp/answer"
)


async def _ask(provider: SubstrateProvider, handle: Any) -> tuple[str, str]:
    """(pid, secret) as the memory keeper in this sandbox holds them now."""
    result = await provider.exec(handle, ASK, timeout_s=30)
    assert result.return_code == 0, result
    pid, secret = result.stdout.split()
    return pid, secret


@pytest.mark.runsc
async def test_four_gvisor_children_see_memory_and_files_then_diverge(tmp_path: Path) -> None:
    async with make_stack(tmp_path, workers=6, runtime="gvisor") as stack:
        provider = stack.provider()
        source = await provider.create(SandboxSpec(workdir="/tmp/work", env={"ROLE": "source"}))
        await provider.upload_file(
            source, _write(tmp_path, "keeper.py", MEMORY_KEEPER), "/tmp/k.py"
        )
        started = await provider.exec_with_background_services(
            source, "nohup python3 /tmp/k.py >/dev/null 2>&1 &"
        )
        assert started.return_code == 0, started
        pid, secret = await _ask(provider, source)
        await provider.exec(source, "rm -f /tmp/answer; echo 'from the source' > notes.txt")

        children = await provider.fork(source, 4)

        assert len({c.sandbox_id for c in children}) == 4
        for child in children:
            # memory: the same process, with the secret it never wrote down
            assert await _ask(provider, child) == (pid, secret)
            # files (in the source's workdir, which the child keeps) and env
            seen = await provider.exec(child, "cat notes.txt; pwd; echo $ROLE")
            assert seen.stdout == "from the source\n/tmp/work\nsource\n"
        # diverge: each child changes its process's memory and its files, on its own
        await asyncio.gather(
            *(
                # /tmp/set appears whole (a rename), or the keeper may read it still empty
                provider.exec(
                    c,
                    f"echo child-{i} > /tmp/set.new && mv /tmp/set.new /tmp/set; "
                    f"echo child-{i} > notes.txt",
                )
                for i, c in enumerate(children)
            )
        )
        for i, child in enumerate(children):
            assert (await _ask(provider, child))[1] == f"child-{i}"
            assert (await provider.exec(child, "cat notes.txt")).stdout == f"child-{i}\n"
        snapshot = children[0].raw.snapshot
        with pytest.raises(SnapshotInUseError):
            await provider.delete_snapshot(snapshot)
        for child in children:
            await provider.close(child)
        # the source kept going where it was, untouched by its children
        assert await _ask(provider, source) == (pid, secret)
        assert (await provider.exec(source, "cat notes.txt")).stdout == "from the source\n"
        assert await provider.list_snapshots() == []  # the fork's went with its last child
        await provider.close(source)
        await provider.aclose()


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("era", ERAS)
async def test_the_process_runtime_keeps_files_not_memory_and_says_so(
    tmp_path: Path, era: str
) -> None:
    async with make_stack(tmp_path, workers=4, api_era=era) as stack:
        provider = stack.provider()
        source = await provider.create(SandboxSpec())
        await provider.exec(source, "echo kept > /tmp/file")
        snap = await provider.take_snapshot(source, name="files-only")
        # v0.3/v0.4 report a content scope, FULL, not what it holds: UNKNOWN, no promise
        said = ("ROOTFS", False) if era == CURRENT else ("UNKNOWN", False)
        assert (snap.fidelity, snap.keeps_memory) == said
        # and the capability answer says so too, once a call has read the server's era
        memory = [c for c in provider.snapshot_capabilities().captures if "memory" in c]
        assert len(memory) == 1
        assert ("does not say whether it did" in memory[0]) == (era != CURRENT), memory
        child = await provider.create(SandboxSpec(provider_options={"from_snapshot": snap.ref}))
        assert (await provider.exec(child, "cat /tmp/file")).stdout == "kept\n"
        assert child.raw.snapshot == "gym/files-only"
        await provider.close(child)
        await provider.delete_snapshot(snap)
        assert await provider.list_snapshots() == []
        await provider.close(source)
        await provider.aclose()
