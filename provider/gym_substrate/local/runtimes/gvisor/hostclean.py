"""What one gVisor runtime instance leaves on the host, found and removed by name.

Everything the runtime makes carries its instance id (cgroups, netns, veths, the nft table) or
lives under its folder or runsc root, so `local down` can remove a crashed run's leftovers
without records, and `leftovers` can prove a clean stop in tests.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gym_substrate.local.runtimes.gvisor import host, net

__all__ = ["find_instance_leftovers", "remove_instance_leftovers"]


def find_instance_leftovers(runsc_root: Path, instance: str, folder: Path) -> list[str]:
    """Processes, cgroups, mounts, namespaces, links and the firewall table of ``instance``."""
    items = [f"process {pid} {cmd}" for pid, cmd in host.find_processes(runsc_root)]
    items += [f"cgroup {p}" for p in host.find_cgroups(instance)]
    items += [f"mount {m}" for m in host.find_mounts([str(folder)])]
    items += [f"mount {m}" for m in host.find_mounts([f"/run/netns/{instance}-w"])]
    items += net.stale_net_of_instance(instance)
    if net.firewall_present(instance):
        items.append(f"nft table inet {net.firewall_table(instance)}")
    return items


def remove_instance_leftovers(runsc_root: Path, instance: str, folder: Path) -> list[str]:
    """Kill, remove and unmount all of it (``folder`` last); what was removed, one line each."""
    removed: list[str] = []
    procs = host.find_processes(runsc_root)
    if procs:
        host.kill_processes([pid for pid, _ in procs])
        removed += [f"process {pid} {cmd}" for pid, cmd in procs]
    cgroups = host.find_cgroups(instance)
    if cgroups:
        host.remove_cgroups(cgroups)
        removed += [f"cgroup {p}" for p in cgroups]
    for mount in host.find_mounts([str(folder)]):
        host.unmount(mount)
        removed.append(f"mount {mount}")
    removed += net.remove_net_of_instance(instance)
    if net.remove_firewall(instance):
        removed.append(f"nft table inet {net.firewall_table(instance)}")
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(f"dir {folder}")
    return removed
