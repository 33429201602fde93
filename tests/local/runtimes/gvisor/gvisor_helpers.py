"""Helpers shared by the gVisor runtime tests (a uniquely named module: tests are no package)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from gym_substrate.local.runtimes.base import Rootfs, TemplateSpec

COUNTER_AGENT = Path(__file__).with_name("counter_agent.py")


def new_instance() -> str:
    return "gt" + secrets.token_hex(3)


def counter_template(
    snapshots: Path, *, marker: bool = True, name: str = "counter", probe: bool = True
) -> TemplateSpec:
    command = [sys.executable, str(COUNTER_AGENT)] + (["--marker"] if marker else [])
    return TemplateSpec(
        atespace="local",
        name=name,
        command=tuple(command),
        env=(),
        readyz_path="/readyz" if probe else None,
        readyz_port=80,
        snapshot_location=snapshots,
        rootfs=Rootfs("host"),
    )


def get(address: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as resp:  # noqa: S310
        data: dict[str, Any] = json.loads(resp.read())
    return data


def kernel_leftovers(instance: str, runtime_dir: Path) -> list[str]:
    """What the kernel still holds for ``instance``, independent of the runtime's bookkeeping."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    found += [f"netns {line}" for line in netns.stdout.splitlines() if line.startswith(instance)]
    found += [
        f"link {p.name}" for p in Path("/sys/class/net").iterdir() if p.name.startswith(instance)
    ]
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/{instance}-*")]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [
        f"mount {line.split()[4]}"
        for line in mounts.splitlines()
        if instance in line.split()[4] or str(runtime_dir) in line.split()[4]
    ]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(runtime_dir) in cmd:
                found.append(f"process {proc.name} {cmd[:80]}")
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    found += [f"nft {line}" for line in tables.stdout.splitlines() if instance in line]
    for lease in Path("/run/gym-substrate/gvisor-net").glob("*.lease"):
        try:
            if json.loads(lease.read_text()).get("instance") == instance:
                found.append(f"lease {lease}")
        except (OSError, ValueError):
            continue
    return found
