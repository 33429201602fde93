"""Thin async wrappers around the `runsc` CLI, one state root per backend.

The wrappers encode gvisor-local.md's hard-won rules so callers cannot forget them:
``run``/``restore`` go through a private mount namespace with an empty tmpfs over
``/proc/sys/net`` (workaround 1, google/gvisor#10704), sandboxes always get
``--net-disconnect-ok`` (otherwise an open TCP connection fails the checkpoint, and a failed
checkpoint kills the sandbox), and ids are checked so one never is a prefix of another.

Disk limit: with ``overlay_limit`` bytes, a sandbox's writable root overlay keeps its files in a
tmpfs of that size (``--overlay2=root:dir=...``, the tmpfs mounted in the same private mount
namespace, so it goes when the sandbox does), instead of unbounded sentry memory
(``root:memory``): a write past it is ENOSPC inside that sandbox, which keeps running. The
limit is recorded in the bundle and copied into every image it checkpoints (``OVERLAY_MARKER``),
since an image restores only with the overlay medium it was saved with: an image without the
marker (made before limits) is restored on ``root:memory``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_substrate.local.runtimes.gvisor._proc import CommandError, CommandResult, run_command, tail

__all__ = [
    "OVERLAY_MARKER",
    "ContainerState",
    "Runsc",
    "RunscError",
    "check_container_id",
    "image_bytes",
]

log = logging.getLogger(__name__)

# runsc accepts [\w+.-]; we also forbid nothing else, but require a fixed-width random tail so
# that no id is ever a prefix of another (runsc matches ids by prefix).
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\.[0-9a-f]{8}")  # fullmatch

_MASK_SCRIPT = 'mount -t tmpfs -o size=4k,mode=0555 gsnetmask /proc/sys/net && exec "$0" "$@"'
# the same, and a tmpfs of {size} bytes at {folder} for the root overlay's files
_OVERLAY_SCRIPT = (
    "mount -t tmpfs -o size=4k,mode=0555 gsnetmask /proc/sys/net && "
    'mount -t tmpfs -o size={size},mode=0700 gsoverlay {folder} && exec "$0" "$@"'
)
OVERLAY_MARKER = "overlay-limit"


def image_bytes(memory: int, compression: str) -> int:
    """What a checkpoint image of a sandbox using ``memory`` bytes plainly needs: all of it
    uncompressed, a quarter of it compressed (flate shrinks images ~3x)."""
    return memory if compression == "none" else memory // 4


class RunscError(Exception):
    """A runsc command failed; ``output`` holds the tail of what it printed."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def check_container_id(cid: str) -> str:
    if not _ID_RE.fullmatch(cid) or len(cid) > 200:
        raise ValueError(
            f"container id {cid!r} must look like <name>.<8 hex digits> "
            "(a fixed-width tail keeps ids from being prefixes of each other)"
        )
    return cid


@dataclass(frozen=True)
class ContainerState:
    id: str
    status: str  # "creating" | "created" | "running" | "stopped" | "paused"
    pid: int
    bundle: str


class Runsc:
    """runsc bound to one ``--root`` state directory and one set of sandbox flags."""

    def __init__(
        self,
        root: Path,
        *,
        binary: str | None = None,
        platform: str | None = None,
        extra_flags: Sequence[str] = (),
        overlay_limit: int = 0,
        bundle_root: Path | None = None,
    ) -> None:
        self.root = root
        # bytes of files a sandbox's root overlay holds (0: unbounded, in sentry memory);
        # bundles live under ``bundle_root``/<cid>, where checkpoint finds a sandbox's limit
        self.overlay_limit = overlay_limit
        self.bundle_root = bundle_root
        self._overlay_dir = root / "overlay"  # a mount point in each sandbox's namespace only
        found = binary or shutil.which("runsc")
        if found is None:
            raise RunscError("runsc is not installed: apt-get install -t bookworm-backports runsc")
        self.binary = found
        self._platform = platform
        self._extra = tuple(extra_flags)

    # -- flags -------------------------------------------------------------------------------
    def _base(self) -> list[str]:
        return [self.binary, f"--root={self.root}"]

    def sandbox_flags(self, network: str = "sandbox", overlay_limit: int = 0) -> list[str]:
        medium = f"dir={self._overlay_dir}" if overlay_limit else "memory"
        flags = [
            f"--network={network}",
            f"--overlay2=root:{medium}",
            "--net-disconnect-ok",
        ]
        if self._platform:
            flags.append(f"--platform={self._platform}")
        return flags + list(self._extra)

    def _masked(self, args: Sequence[str], overlay_limit: int = 0) -> list[str]:
        script = _MASK_SCRIPT
        if overlay_limit:
            self._overlay_dir.mkdir(parents=True, exist_ok=True)
            script = _OVERLAY_SCRIPT.format(size=overlay_limit, folder=self._overlay_dir)
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, *args]

    @staticmethod
    def _mark(folder: Path, limit: int) -> None:
        marker = folder / OVERLAY_MARKER
        if limit:
            marker.write_text(str(limit))
        else:
            marker.unlink(missing_ok=True)

    @staticmethod
    def _marked_limit(folder: Path) -> int:
        try:
            return max(0, int((folder / OVERLAY_MARKER).read_text()))
        except (OSError, ValueError):
            return 0

    async def _call(
        self, args: Sequence[str], *, timeout_s: float, log_path: Path | None = None
    ) -> CommandResult:
        try:
            return await run_command(args, timeout_s=timeout_s, log_path=log_path)
        except CommandError as exc:
            output = exc.result.stderr if exc.result else ""
            raise RunscError(str(exc), tail(output, 12)) from None

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(
        self, bundle: Path, cid: str, *, log_path: Path, timeout_s: float, network: str = "sandbox"
    ) -> None:
        check_container_id(cid)
        self.root.mkdir(parents=True, exist_ok=True)
        limit = self.overlay_limit
        self._mark(bundle, limit)
        args = [
            *self._base(),
            *self.sandbox_flags(network, limit),
            "run",
            "--detach",
            f"--bundle={bundle}",
            cid,
        ]
        await self._call(self._masked(args, limit), timeout_s=timeout_s, log_path=log_path)

    async def restore(
        self, bundle: Path, cid: str, image: Path, *, log_path: Path, timeout_s: float
    ) -> None:
        check_container_id(cid)
        self.root.mkdir(parents=True, exist_ok=True)
        saved = self._marked_limit(image)  # 0: saved on root:memory, restored on it
        limit = max(saved, self.overlay_limit) if saved else 0
        self._mark(bundle, limit)
        args = [
            *self._base(),
            *self.sandbox_flags(overlay_limit=limit),
            "restore",
            "--detach",
            f"--image-path={image}",
            f"--bundle={bundle}",
            cid,
        ]
        await self._call(self._masked(args, limit), timeout_s=timeout_s, log_path=log_path)

    async def checkpoint(
        self,
        cid: str,
        image: Path,
        *,
        compression: str = "none",
        timeout_s: float,
        done_file: Path | None = None,
    ) -> None:
        """``done_file`` is created once runsc has exited 0, by a shell that outlives a killed
        backend (the command runs in its own session): a restart can tell a finished image
        from one cut short."""
        args = [
            *self._base(),
            "checkpoint",
            f"--image-path={image}",
            f"--compression={compression}",
            cid,
        ]
        if done_file is not None:
            args = ["sh", "-c", 'd=$1; shift; "$@" && : > "$d"', "sh", str(done_file), *args]
        await self._call(args, timeout_s=timeout_s)
        if self.bundle_root is not None:  # the image restores only on the medium it was saved on
            self._mark(image, self._marked_limit(self.bundle_root / cid))

    async def state(self, cid: str, *, timeout_s: float = 10.0) -> ContainerState | None:
        """The container's state, or None when runsc does not know it."""
        result = await run_command([*self._base(), "state", cid], timeout_s=timeout_s, check=False)
        if result.returncode != 0:
            return None
        try:
            data: dict[str, Any] = json.loads(result.stdout)
        except ValueError:
            return None
        if data.get("id") != cid:  # a prefix match on another id: treat as unknown
            return None
        return ContainerState(
            id=cid,
            status=str(data.get("status", "")),
            pid=int(data.get("pid") or -1),
            bundle=str(data.get("bundle", "")),
        )

    async def memory_usage(self, cid: str, *, timeout_s: float = 10.0) -> int | None:
        """The sandbox's memory usage as ``runsc events --stats`` reports it (bytes), or None.

        This is the application memory a checkpoint writes out (the image's pages file is a
        little smaller: 31 MB for 36 MB reported, 52 MB for 58 MB, measured uncompressed).
        """
        result = await run_command(
            [*self._base(), "events", "--stats", cid], timeout_s=timeout_s, check=False
        )
        if result.returncode != 0:
            return None
        try:
            usage = json.loads(result.stdout)["data"]["memory"]["usage"]["usage"]
        except (ValueError, KeyError, TypeError):
            return None
        return int(usage) if isinstance(usage, int) and usage > 0 else None

    def pids(self, cid: str) -> tuple[int, int] | None:
        """(sandbox pid, gofer pid) from runsc's state file, or None when unknown.

        Reading the file costs microseconds where ``runsc state`` costs a process start
        (10-40 ms on a loaded 2-core machine), which matters on the pause/resume path. The
        file is runsc's own format; anything unexpected falls back to None.
        """
        path = self.root / f"{cid}_sandbox:{cid}.state"
        try:
            data = json.loads(path.read_text())
            return int(data["sandbox"]["pid"]), int(data.get("goferPid") or -1)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    async def list(self, *, timeout_s: float = 15.0) -> list[ContainerState]:
        if not self.root.is_dir():
            return []
        result = await run_command(
            [*self._base(), "list", "-format=json"], timeout_s=timeout_s, check=False
        )
        if result.returncode != 0:
            raise RunscError(f"runsc list failed: {tail(result.stderr)}")
        data = json.loads(result.stdout or "null") or []
        return [
            ContainerState(
                id=str(item.get("id")),
                status=str(item.get("status", "")),
                pid=int(item.get("pid") or -1),
                bundle=str(item.get("bundle", "")),
            )
            for item in data
        ]

    async def kill(self, cid: str, signal: str = "KILL", *, timeout_s: float = 10.0) -> bool:
        result = await run_command(
            [*self._base(), "kill", cid, signal], timeout_s=timeout_s, check=False
        )
        return result.returncode == 0

    async def delete(self, cid: str, *, force: bool = False, timeout_s: float = 30.0) -> bool:
        """Delete ``cid``; False (and no exception) when runsc refused or did not know it."""
        args = [*self._base(), "delete"]
        if force:
            args.append("--force")
        result = await run_command([*args, cid], timeout_s=timeout_s, check=False)
        if result.returncode != 0:
            log.debug("runsc delete %s: %s", cid, tail(result.stderr))
        return result.returncode == 0

    async def destroy(self, cid: str, *, timeout_s: float = 30.0) -> None:
        """Make ``cid`` gone, running or not: SIGKILL, wait for stopped, delete (force last)."""
        deadline = time.monotonic() + timeout_s
        state = await self.state(cid)
        if state is None:
            return
        if state.status in {"running", "paused", "created"}:
            await self.kill(cid, "KILL")
        while time.monotonic() < deadline:
            state = await self.state(cid)
            if state is None:
                return
            if state.status == "stopped" and await self.delete(cid):
                return
            await asyncio.sleep(0.05)
        await self.delete(cid, force=True, timeout_s=max(5.0, deadline - time.monotonic()))
