"""Files over HTTP: chunked atomic uploads, ranged downloads, stat.

Why chunked: the router cuts every request at 10 s, so a large file travels as several PUTs of at
most 64 MiB each. Chunks land in a hidden temporary sibling of the target (same directory, so the
final rename is atomic on one filesystem); only `final=true` fsyncs and renames it into place. A
reader therefore never sees a half-written file, and a failed or abandoned upload leaves the old
file untouched. A chunk that fails midway is cut back to its `offset`, so the client can simply
resend it.

All file-system calls run in the default thread pool. Upload bodies are gathered into ~1 MiB
batches that one thread writes (pwritev) and hashes while the loop receives the next batch;
downloads use `loop.sendfile`, which is zero-copy on a plain socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import re
import stat
from typing import Any

from ._errors import ApiError, body_timeout_error
from ._http import Request, Response, json_response
from ._numbers import parse_decimal
from ._wire import reply
from .contract import MAX_FILE_OFFSET, ErrorCode, FileStat, UploadReply

__all__ = ["FileHandlers", "UPLOAD_SUFFIX"]

UPLOAD_SUFFIX = ".sandbox-agent-upload"
_BATCH = 2 * 1024 * 1024
_HASH_READ = 4 * 1024 * 1024
_NAME_MAX = 255  # bytes in one file name on Linux file systems


def _bad(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


# File-system errors a request can cause, as the contract's answers; any other errno is a 500.
_ERRNO_ANSWERS: dict[int, tuple[int, ErrorCode, str]] = {
    errno.ENOENT: (404, "not_found", "{path} does not exist"),
    errno.EISDIR: (400, "bad_request", "{path} is a directory; pass the path of a file"),
    errno.ENOTDIR: (400, "bad_request", "a parent of {path} is not a directory"),
    errno.EEXIST: (400, "bad_request", "a parent of {path} is not a directory"),
    errno.ENAMETOOLONG: (
        400,
        "name_too_long",
        "{path} is too long: a name is at most 255 bytes, a path at most 4095",
    ),
    errno.ELOOP: (
        400,
        "too_many_links",
        "{path} cannot be resolved: a symlink loop, or more than 40 symlinks on the way",
    ),
    errno.EACCES: (403, "permission_denied", "permission denied on {path}: {strerror}"),
    errno.EPERM: (403, "permission_denied", "permission denied on {path}: {strerror}"),
    errno.EROFS: (403, "read_only", "{path} is on a read-only file system"),
    # The target is a mount point or a running program: another path, or later, succeeds.
    errno.EBUSY: (409, "busy", "{path} is busy (a mount point, or in use): {strerror}"),
    errno.ETXTBSY: (409, "busy", "{path} is a program that is running; write it once it ends"),
    errno.EFBIG: (413, "too_large", "{path} would exceed the largest file the file system holds"),
    # Full is the sandbox's state, not a bug: the client can free space and resume the upload.
    errno.ENOSPC: (507, "no_space", "no space left on the file system holding {path}"),
    errno.EDQUOT: (507, "no_space", "the disk quota of the file system holding {path} is used up"),
}


def _os_error(exc: OSError, path: str) -> ApiError:
    shown = path if len(path) <= 200 else f"{path[:200]}... ({len(path)} characters)"
    answer = _ERRNO_ANSWERS.get(exc.errno or 0)
    if answer is None:
        return ApiError(500, "internal", f"file system error on {shown}: {exc.strerror or exc}")
    status, code, message = answer
    return ApiError(status, code, message.format(path=shown, strerror=exc.strerror))


def _tmp_path(path: str) -> str:
    """The hidden sibling an upload is written to; a hashed name if the plain one is too long."""
    head, tail = os.path.split(path)
    name = f".{tail}{UPLOAD_SUFFIX}"
    if len(os.fsencode(name)) > _NAME_MAX:
        digest = hashlib.sha256(os.fsencode(tail)).hexdigest()[:32]
        name = f".{digest}{UPLOAD_SUFFIX}"
    return os.path.join(head, name)


# ----- blocking helpers, run in the thread pool -----


def _open_upload(path: str, offset: int) -> int:
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    tmp = _tmp_path(path)
    if offset == 0:
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            return os.open(tmp, flags, 0o600)
        except FileNotFoundError:  # the first chunk creates the parents
            os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        return os.open(tmp, flags, 0o600)
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        msg = f"no upload in progress for {path} (offset {offset}); start the upload with offset=0"
        raise ApiError(409, "offset_mismatch", msg) from None
    size = os.fstat(fd).st_size
    if offset > size:
        os.close(fd)
        msg = (
            f"offset {offset} is past the {size} bytes received so far for {path}; "
            f"resume with offset={size}"
        )
        raise ApiError(409, "offset_mismatch", msg)
    return fd


def _write_batch(fd: int, chunks: list[bytes], pos: int) -> None:
    views = [memoryview(c) for c in chunks]
    while views:
        written = os.pwritev(fd, views, pos)
        pos += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _hash_batch(hasher: Any, chunks: list[bytes]) -> None:
    for chunk in chunks:
        hasher.update(chunk)


def _hash_file(fd: int) -> str:
    hasher = hashlib.sha256()
    pos = 0
    while True:
        data = os.pread(fd, _HASH_READ, pos)
        if not data:
            return hasher.hexdigest()
        hasher.update(data)
        pos += len(data)


def _finish_upload(fd: int, path: str, end: int, final: bool, mode: int, hasher: Any) -> str | None:
    os.ftruncate(fd, end)
    if not final:
        return None
    os.fchmod(fd, mode)
    os.fsync(fd)
    digest = hasher.hexdigest() if hasher is not None else _hash_file(fd)
    os.rename(_tmp_path(path), path)
    _fsync_dir(os.path.dirname(path) or "/")
    return str(digest)


def _fsync_dir(directory: str) -> None:
    """Make the rename itself durable; some file systems cannot fsync a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _abort_upload(fd: int, offset: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, offset)


class _NotRegular(Exception):
    pass


def _open_read(path: str) -> tuple[int, os.stat_result]:
    # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise IsADirectoryError(21, "Is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _NotRegular(path)
    os.set_blocking(fd, True)
    return fd, st


def _stat(path: str) -> dict[str, Any]:
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "other"
    values = {
        "path": path,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }
    return reply(FileStat, values)


_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.IGNORECASE | re.ASCII)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for a single `bytes=` range; None if it cannot be satisfied."""
    match = _RANGE.fullmatch(header)
    if match is None:
        raise _bad(
            f"malformed Range header {header[:64]!r}: use one range such as bytes=0-1023, "
            "bytes=1024- or bytes=-512 (ASCII digits)"
        )
    first, last = match.groups()
    start = parse_decimal(first, MAX_FILE_OFFSET) if first else None
    end = parse_decimal(last, MAX_FILE_OFFSET) if last else None
    if (first and start is None) or (last and end is None) or (start is None and end is None):
        raise _bad(f"malformed Range header {header[:64]!r}: positions are 0..{MAX_FILE_OFFSET}")
    if start is None:  # suffix: the last N bytes
        assert end is not None
        if end == 0 or size == 0:
            return None
        return max(0, size - end), size - 1
    if end is not None and end < start:
        raise _bad(f"malformed Range header {header[:64]!r}: END is before START")
    if start >= size:
        return None
    return start, size - 1 if end is None else min(end, size - 1)


class FileHandlers:
    """The /v1/files and /v1/stat handlers, bound to one upload size limit."""

    def __init__(self, max_upload_bytes: int, body_timeout_s: float) -> None:
        self._max = max_upload_bytes
        self._body_timeout_s = body_timeout_s
        # One writer per path: concurrent PUTs to one path would share (and truncate) one
        # temporary file, and a rename could move it into place while the other still writes.
        self._writers: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            "too_large",
            f"request body exceeds {self._max} bytes; split the file into chunks "
            "with offset= and final=false, then final=true on the last one",
        )

    async def put(self, request: Request, query: dict[str, Any]) -> Response:
        path, offset, final, mode = query["path"], query["offset"], query["final"], query["mode"]
        length = request.content_length
        if length is not None and length > self._max:
            raise self._too_large()
        entry = self._writers.get(path)
        if entry is None:
            entry = self._writers[path] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                return await self._put_locked(request, path, offset, final, mode)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._writers[path]

    async def _put_locked(
        self, request: Request, path: str, offset: int, final: bool, mode: int
    ) -> Response:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._body_timeout_s
        try:
            fd = await loop.run_in_executor(None, _open_upload, path, offset)
        except OSError as exc:
            raise _os_error(exc, path) from None
        hasher = hashlib.sha256() if offset == 0 and final else None
        pos = offset
        received = 0
        # Two lanes in the thread pool, each one batch deep: writing batch k and hashing batch k
        # run in parallel while the loop receives batch k+1.
        writing: asyncio.Future[None] | None = None
        hashing: asyncio.Future[None] | None = None
        batch: list[bytes] = []
        batch_len = 0
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        chunk = await request.read_chunk()
                except TimeoutError:
                    raise body_timeout_error(self._body_timeout_s) from None
                if chunk:
                    received += len(chunk)
                    if received > self._max:
                        raise self._too_large()
                    batch.append(chunk)
                    batch_len += len(chunk)
                if batch and (batch_len >= _BATCH or not chunk):
                    if writing is not None:
                        await writing
                    writing = loop.run_in_executor(None, _write_batch, fd, batch, pos)
                    if hasher is not None:
                        if hashing is not None:
                            await hashing
                        hashing = loop.run_in_executor(None, _hash_batch, hasher, batch)
                    pos += batch_len
                    batch, batch_len = [], 0
                if not chunk:
                    break
            for lane in (writing, hashing):
                if lane is not None:
                    await lane
            writing = hashing = None
            digest = await loop.run_in_executor(
                None, _finish_upload, fd, path, pos, final, mode, hasher
            )
        except BaseException as exc:
            for lane in (writing, hashing):
                if lane is not None:
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(lane)
            await loop.run_in_executor(None, _abort_upload, fd, offset)
            if isinstance(exc, OSError):
                raise _os_error(exc, path) from None
            raise
        finally:
            await loop.run_in_executor(None, os.close, fd)
        return json_response(reply(UploadReply, {"path": path, "size": pos, "sha256": digest}))

    async def get(self, request: Request, query: dict[str, Any]) -> Response:
        path = query["path"]
        loop = asyncio.get_running_loop()
        try:
            fd, st = await loop.run_in_executor(None, _open_read, path)
        except OSError as exc:
            raise _os_error(exc, path) from None
        except _NotRegular:
            raise _bad(f"{path} is not a regular file (a device, FIFO or socket)") from None
        fobj = os.fdopen(fd, "rb", buffering=0)  # wraps the fd opened off the loop; closed below
        try:
            size = st.st_size
            status, start, count = 200, 0, size
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            range_header = request.headers.get("Range")
            if range_header is not None:
                parsed = _parse_range(range_header, size)
                if parsed is None:
                    raise ApiError(
                        416,
                        "range_not_satisfiable",
                        f"Range {range_header!r} is outside the file's {size} bytes",
                        headers={"Content-Range": f"bytes */{size}"},
                    )
                start, end = parsed
                count = end - start + 1
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            resp = await request.send_head(status, headers, count)
            if request.method != "HEAD" and count:
                await request.sendfile(fobj, start, count)
            return resp
        finally:
            fobj.close()

    async def stat(self, request: Request, query: dict[str, Any]) -> Response:
        path = query["path"]
        try:
            info = await asyncio.get_running_loop().run_in_executor(None, _stat, path)
        except OSError as exc:
            raise _os_error(exc, path) from None
        return json_response(info)
