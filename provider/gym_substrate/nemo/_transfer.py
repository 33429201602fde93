"""Files in and out of a sandbox: chunked, sha256-checked, and never half-written.

The router cuts a request at 10 s and the agent takes at most 64 MiB per chunk, so a file moves
as a sequence of idempotent requests (a chunk carries its offset; a range read is a range read)
that `ManagedActor.call_agent` may resend. Uploads land atomically on the agent; downloads go to
a temporary sibling that is renamed into place only once its digest matches the sandbox's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import shlex
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from gym_substrate.nemo._managed import ManagedActor
from gym_substrate.nemo.agent_client import AgentClient
from gym_substrate.nemo.errors import (
    ActorCrashedError,
    AgentResponseError,
    RetryError,
    RouterError,
    TransferError,
)
from gym_substrate.nemo.types import SandboxExecResult
from sandbox_agent.contract import FileStat, UploadReply

__all__ = ["BytesSource", "FileMover", "FileSource", "Source", "download", "upload"]

T = TypeVar("T")

log = logging.getLogger("gym_substrate.provider")

# Asks the sandbox for a file's sha256 (None: the image has no sha256sum).
Sha256InSandbox = Callable[[str], Awaitable[str | None]]


class Source:
    """Where upload bytes come from."""

    async def read(self, n: int) -> bytes:
        raise NotImplementedError

    async def at_eof(self) -> bool:
        raise NotImplementedError


class FileSource(Source):
    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh

    async def read(self, n: int) -> bytes:
        return await asyncio.to_thread(self._fh.read, n)

    async def at_eof(self) -> bool:
        def peek() -> bool:
            pos = self._fh.tell()
            more = self._fh.read(1)
            self._fh.seek(pos)
            return not more

        return await asyncio.to_thread(peek)


class BytesSource(Source):
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    async def read(self, n: int) -> bytes:
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk

    async def at_eof(self) -> bool:
        return self._pos >= len(self._data)


async def _hash(digest: Any, data: bytes) -> None:
    """Feed `digest`; big chunks off the loop (hashlib releases the GIL for them)."""
    if len(data) >= 1 << 20:
        await asyncio.to_thread(digest.update, data)
    else:
        digest.update(data)


async def _call(
    managed: ManagedActor, request: Callable[[AgentClient], Awaitable[T]], what: str
) -> T:
    """An agent request of a transfer; the router's failures and a crash become
    `TransferError`."""
    try:
        return await managed.call_agent(request, what=what)
    except RetryError as exc:
        raise TransferError(f"{what}: {exc.cause}") from exc
    except (RouterError, ActorCrashedError) as exc:
        raise TransferError(f"{what}: {exc}") from exc


async def upload(
    managed: ManagedActor,
    source: Source,
    target: str,
    *,
    mode: int,
    chunk_size: int,
    sha256_in_sandbox: Sha256InSandbox,
) -> None:
    """Send `source` to `target` in chunks; the agent's final digest must match ours."""
    digest = hashlib.sha256()
    offset = 0
    while True:
        data = await source.read(chunk_size)
        final = len(data) < chunk_size or await source.at_eof()
        await _hash(digest, data)
        try:
            reply = await _call(
                managed,
                lambda agent, d=data, o=offset, f=final: agent.put_chunk(  # type: ignore[misc]
                    target, o, d, final=f, mode=mode
                ),
                f"upload {target}",
            )
        except AgentResponseError as exc:
            if not (final and offset and exc.code == "offset_mismatch"):
                raise
            # A resent final chunk finds no upload in progress when the first attempt landed
            # and only its reply was lost: accept the file if it is ours.
            reply = await _uploaded_already(
                managed, target, offset + len(data), digest.hexdigest(), exc, sha256_in_sandbox
            )
        offset += len(data)
        if final:
            break
    if reply.get("sha256") != digest.hexdigest() or int(reply.get("size", -1)) != offset:
        raise TransferError(
            f"upload of {target} did not verify: sent {offset} bytes sha256 "
            f"{digest.hexdigest()}, sandbox has {reply.get('size')} bytes sha256 "
            f"{reply.get('sha256')}"
        )


async def _uploaded_already(
    managed: ManagedActor,
    target: str,
    size: int,
    sha256: str,
    cause: Exception,
    sha256_in_sandbox: Sha256InSandbox,
) -> UploadReply:
    """The agent reply for an upload whose final chunk landed but whose reply was lost."""
    try:
        info = await _call(managed, lambda agent: agent.stat(target), f"stat {target}")
    except AgentResponseError:
        info = cast(FileStat, {})
    remote = None
    if info.get("type") == "file" and int(info.get("size", -1)) == size:
        remote = await sha256_in_sandbox(target)
    if remote != sha256:
        raise TransferError(f"upload of {target} failed: {cause}") from cause
    return {"path": target, "size": size, "sha256": sha256}


async def _file_to_download(managed: ManagedActor, source_path: str) -> FileStat:
    """The sandbox file's stat; TransferError (ENOENT when there is none) unless a file."""
    try:
        info = await _call(managed, lambda agent: agent.stat(source_path), f"stat {source_path}")
    except AgentResponseError as exc:
        if exc.status == 404:
            raise TransferError(
                errno.ENOENT, f"no such file in the sandbox: {source_path}"
            ) from exc
        raise TransferError(f"cannot download {source_path}: {exc}") from exc
    if info.get("type") != "file":
        raise TransferError(
            f"cannot download {source_path}: it is a {info.get('type')}, not a file"
        )
    return info


async def download(
    managed: ManagedActor,
    source_path: str,
    target: Path,
    *,
    chunk_size: int,
    sha256_in_sandbox: Sha256InSandbox,
) -> None:
    """Fetch a sandbox file in ranged chunks into a temp file, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part-{uuid.uuid4().hex[:8]}")
    stat_what = f"stat {source_path}"
    try:
        info = await _file_to_download(managed, source_path)
        size = int(info["size"])
        digest = hashlib.sha256()
        # The sandbox hashes its copy while we fetch ours.
        remote_task = asyncio.ensure_future(sha256_in_sandbox(source_path))
        fh = await asyncio.to_thread(tmp.open, "wb")

        def sink(data: bytes) -> None:
            digest.update(data)
            fh.write(data)

        def fetch(start: int) -> asyncio.Future[tuple[bytes, dict[str, str]]]:
            end = min(start + chunk_size, size) - 1
            return asyncio.ensure_future(
                _call(
                    managed,
                    lambda agent: agent.get_range(source_path, start, end),
                    f"download {source_path}",
                )
            )

        pending = fetch(0) if size else None
        try:
            offset = 0
            while pending is not None:
                data, _ = await pending
                expected = min(chunk_size, size - offset)
                if len(data) != expected:
                    pending = None
                    raise TransferError(
                        f"download of {source_path} got {len(data)} bytes for range "
                        f"{offset}-{offset + expected - 1}; the file changed while it was read"
                    )
                offset += len(data)
                # Fetch the next range while this one is hashed and written.
                pending = fetch(offset) if offset < size else None
                await asyncio.to_thread(sink, data)
            await asyncio.to_thread(fh.flush)
        except BaseException:
            remote_task.cancel()
            if pending is not None:
                pending.cancel()
            raise
        finally:
            await asyncio.to_thread(fh.close)
        after = await _call(managed, lambda agent: agent.stat(source_path), stat_what)
        if int(after.get("size", -1)) != size or after.get("mtime") != info.get("mtime"):
            raise TransferError(f"{source_path} changed while it was downloaded")
        remote = await remote_task
        if remote is not None and remote != digest.hexdigest():
            raise TransferError(
                f"download of {source_path} did not verify: got sha256 {digest.hexdigest()}, "
                f"sandbox has {remote}"
            )
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


class FileMover:
    """A provider's transfers: its chunk size, and how to run `sha256sum` in a sandbox."""

    def __init__(
        self,
        chunk_size: int,
        run: Callable[[ManagedActor, str], Awaitable[SandboxExecResult]],
    ) -> None:
        self.chunk_size = chunk_size
        self._run = run

    async def sha256(self, managed: ManagedActor, path: str) -> str | None:
        """The sandbox-side sha256 of `path` via `sha256sum`, or None if the image lacks it.

        The agent's GET carries no digest, so the end-to-end check asks the sandbox itself;
        without `sha256sum` the size and mtime checks around the transfer still apply.
        """
        result = await self._run(managed, f"sha256sum -- {shlex.quote(path)}")
        if result.return_code != 0 or not result.stdout:
            if result.return_code not in (126, 127):
                log.info("sha256sum of %s failed: %s", path, result.stderr)
            return None
        return result.stdout.split()[0]

    async def upload(self, managed: ManagedActor, source: Source, target: str, mode: int) -> None:
        async with managed.active():
            await upload(
                managed,
                source,
                target,
                mode=mode,
                chunk_size=self.chunk_size,
                sha256_in_sandbox=lambda path: self.sha256(managed, path),
            )

    async def download(self, managed: ManagedActor, source_path: str, target: Path) -> None:
        async with managed.active():
            await download(
                managed,
                source_path,
                target,
                chunk_size=self.chunk_size,
                sha256_in_sandbox=lambda path: self.sha256(managed, path),
            )
