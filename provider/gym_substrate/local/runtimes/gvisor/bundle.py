"""OCI bundles for actor sandboxes, shaped like atelet's (substrate.md §2.2).

The spec is written directly rather than via ``runsc spec`` (one process fewer per start).
Everything that differs between actors of one template lives in exactly two places, the netns
path and the ``/run/ate`` bind source, so one golden checkpoint restores into any actor on any
slot. Everything else (mount list, masks, env) depends only on the template and the host, which
must stay identical between checkpoint and restore.

Rootfs ``host`` is the host's ``/`` with ``readonly: false``: ``--overlay2=root:memory`` keeps all
writes in sentry memory, and ``readonly: true`` would switch the overlay off (EROFS). Host paths
that hold other actors' snapshots, runtime state or credentials are masked with empty tmpfs
mounts so one actor cannot read another's memory image.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CAPABILITIES",
    "DEFAULT_PATH_ENV",
    "HOST_MASKS",
    "masks_for",
    "write_actor_id",
    "write_bundle",
    "write_etc_files",
]

DEFAULT_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Docker's default set: the agent runs as root and must be able to switch to another user for
# `exec` with "user" (setuid/setgid) and manage files it creates; gVisor is the boundary.
CAPABILITIES = [
    "CAP_AUDIT_WRITE",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_MKNOD",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_CHROOT",
]

# Host directories hidden from `host`-rootfs sandboxes (when present): scratch space of other
# programs, runtime state (netns, leases, sockets) and credentials.
HOST_MASKS = (
    "/tmp",
    "/var/tmp",
    "/run",
    "/var/run",
    "/root/.ssh",
    "/root/.aws",
    "/root/.kube",
    "/root/.docker",
    "/root/.config/gcloud",
    "/etc/ssh",
    "/home",
)
# Files masked by binding an empty read-only file over them.
HOST_FILE_MASKS = ("/etc/shadow", "/etc/gshadow")


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def masks_for(
    extra_dirs: Iterable[Path], keep_visible: Iterable[Path] = ()
) -> tuple[list[str], list[str]]:
    """Directories and files to hide in a host-rootfs sandbox, deduplicated.

    A candidate that contains a path in ``keep_visible`` (the interpreter, the venv, the
    command) is skipped: hiding it would break the template's command.
    """
    dirs: list[Path] = []
    visible = [Path(os.path.realpath(p)) for p in keep_visible]
    candidates = [Path(p) for p in HOST_MASKS] + [Path(os.path.realpath(p)) for p in extra_dirs]
    for cand in candidates:
        if cand == Path("/") or not cand.is_dir() or cand.is_symlink():
            continue
        if any(_under(v, cand) for v in visible):
            continue
        if any(_under(cand, kept) for kept in dirs):
            continue
        dirs = [kept for kept in dirs if not _under(kept, cand)] + [cand]
    files = [p for p in HOST_FILE_MASKS if Path(p).is_file()]
    return sorted(str(d) for d in dirs), files


def write_etc_files(etc_dir: Path) -> tuple[Path, Path, Path]:
    """resolv.conf pointing at nothing (127.0.0.1), a minimal hosts file, an empty mask file."""
    etc_dir.mkdir(parents=True, exist_ok=True)
    resolv = etc_dir / "resolv.conf"
    hosts = etc_dir / "hosts"
    empty = etc_dir / "empty"
    for path, text in (
        (resolv, "nameserver 127.0.0.1\n"),
        (hosts, "127.0.0.1\tlocalhost runsc\n::1\tlocalhost\n"),
        (empty, ""),
    ):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return resolv, hosts, empty


def write_actor_id(run_ate_dir: Path, actor_id: str) -> None:
    """The file Substrate's agents read at request time (no trailing newline)."""
    run_ate_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_ate_dir / ".actor-id.tmp"
    tmp.write_text(actor_id)
    tmp.replace(run_ate_dir / "actor-id")


def _ro_bind(source: str, destination: str) -> dict[str, Any]:
    """One read-only bind mount entry."""
    return {
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", "ro"],
    }


def _mounts(
    *,
    resolv: Path,
    hosts: Path,
    empty: Path,
    run_ate_dir: Path,
    mask_dirs: Sequence[str],
    mask_files: Sequence[str],
    binds: Sequence[tuple[str, str]],
    mask_size: int,
) -> list[dict[str, Any]]:
    """The sandbox's mount table, in the order runsc applies it: the pseudo file systems,
    the masks over host paths, the caller's binds, then the files the sandbox must see."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
    ]
    for mask in mask_dirs:
        mounts.append(
            {
                "destination": mask,
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "mode=1777"]
                + ([f"size={mask_size}"] if mask_size else []),
            }
        )
    mounts += [_ro_bind(str(empty), mask) for mask in mask_files]
    # e.g. the static agent into a rootfs of its own
    mounts += [_ro_bind(source, destination) for source, destination in binds]
    mounts += [
        _ro_bind(str(resolv), "/etc/resolv.conf"),
        _ro_bind(str(hosts), "/etc/hosts"),
        _ro_bind(str(run_ate_dir), "/run/ate"),
    ]
    return mounts


def _process(args: Sequence[str], env: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The spec's process: root, the given argv and env, full capabilities, many fds."""
    return {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": list(args),
        "env": [DEFAULT_PATH_ENV] + [f"{name}={value}" for name, value in env],
        "cwd": "/",
        "capabilities": {
            key: list(CAPABILITIES) for key in ("bounding", "effective", "inheritable", "permitted")
        },
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}],
    }


def write_bundle(
    bundle_dir: Path,
    *,
    rootfs: Path,
    args: Sequence[str],
    env: Sequence[tuple[str, str]],
    netns_path: Path,
    run_ate_dir: Path,
    etc_dir: Path,
    mask_dirs: Sequence[str] = (),
    mask_files: Sequence[str] = (),
    binds: Sequence[tuple[str, str]] = (),
    mask_size: int = 0,
) -> Path:
    """Write ``bundle_dir/config.json``; returns the bundle directory. ``mask_size`` bounds
    each masking tmpfs (a writable /tmp of a host-rootfs sandbox) as the root overlay is."""
    resolv, hosts, empty = write_etc_files(etc_dir)
    mounts = _mounts(
        resolv=resolv,
        hosts=hosts,
        empty=empty,
        run_ate_dir=run_ate_dir,
        mask_dirs=mask_dirs,
        mask_files=mask_files,
        binds=binds,
        mask_size=mask_size,
    )
    spec: dict[str, Any] = {
        "ociVersion": "1.0.0",
        "process": _process(args, env),
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": "runsc",
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "network", "path": str(netns_path)},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
            ]
        },
    }
    bundle_dir.mkdir(parents=True, exist_ok=True)
    tmp = bundle_dir / "config.json.tmp"
    tmp.write_text(json.dumps(spec, indent=1))
    tmp.replace(bundle_dir / "config.json")
    return bundle_dir
