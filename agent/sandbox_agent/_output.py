"""What the agent keeps of a process's output, in bounded memory whatever the process prints.

Two shapes, because the two APIs read output differently:
- `HeadTailBuffer` (exec jobs): the reply carries the whole output at once, so beyond its limit
  the buffer keeps the head and the newest tail and drops the middle as it streams in;
- `OffsetStream` (PTY sessions): clients read by absolute offset, repeatably, so the stream
  drops only bytes a reader has moved past, and reports when it is full so the agent stops
  reading the program (flow control instead of loss).
"""

from __future__ import annotations

import collections

from ._errors import ApiError

__all__ = ["TAIL_CHUNK", "TRIM_BATCH", "HeadTailBuffer", "OffsetStream"]

# Reads smaller than this are coalesced into the newest tail chunk (bounds the chunk count).
TAIL_CHUNK = 64 * 1024
# Read bytes are dropped in batches of at least this much (one memmove per batch, not per read).
TRIM_BATCH = 64 * 1024


class HeadTailBuffer:
    """Head plus rolling tail of one stream; at most `limit` bytes are ever held.

    The tail is a deque of chunks with a running byte count: a large read is appended as the
    bytes object it arrived in, small reads are coalesced into a bytearray chunk (so the chunk
    count stays bounded by tail / 64 KiB), and trimming drops whole chunks and slices only the
    oldest, so each read costs O(its size) however large the tail is.
    """

    __slots__ = ("head", "chunks", "tail_len", "head_limit", "tail_limit", "total", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.chunks: collections.deque[bytes | bytearray] = collections.deque()
        self.tail_len = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        n = len(data)
        self.total += n
        room = self.head_limit - len(self.head)
        if room > 0:
            if n <= room:
                self.head += data
                return
            self.head += memoryview(data)[:room]
            data = data[room:]  # one copy, once per stream
            n -= room
        chunks = self.chunks
        tail_limit = self.tail_limit
        if n >= tail_limit:  # this read alone fills the tail
            chunks.clear()
            if tail_limit:
                chunks.append(data[n - tail_limit :] if n > tail_limit else data)
            self.tail_len = tail_limit
            return
        if n >= TAIL_CHUNK:
            chunks.append(data)  # kept as the object it arrived in: no copy
        elif chunks and type(last := chunks[-1]) is bytearray and len(last) < TAIL_CHUNK:
            last += data
        else:
            chunks.append(bytearray(data))
        tail_len = self.tail_len + n
        excess = tail_len - tail_limit
        if excess > 0:
            # The chunks hold tail_len > excess bytes, so this stops before the deque is empty.
            while len(chunks[0]) <= excess:
                excess -= len(chunks.popleft())
            if excess:
                oldest = chunks[0]
                if type(oldest) is bytearray:
                    del oldest[:excess]
                else:
                    chunks[0] = oldest[excess:]
            tail_len = tail_limit
        self.tail_len = tail_len

    def render(self) -> tuple[str, bool]:
        if self.total <= self.limit:
            whole = self.head + b"".join(self.chunks) if self.chunks else self.head
            return whole.decode("utf-8", "replace"), False
        tail = b"".join(self.chunks)
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n[... sandbox-agent: {dropped} bytes truncated ...]\n"
        text = self.head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")
        return text, True


class OffsetStream:
    """One output stream: absolute offsets, bounded memory, dropping only what was read."""

    __slots__ = ("buf", "start", "acked", "limit", "closed")

    def __init__(self, limit: int) -> None:
        self.buf = bytearray()
        self.start = 0  # stream offset of buf[0]
        self.acked = 0  # the highest offset a reader asked for: the bytes before it may go
        self.limit = limit
        self.closed = False  # no more bytes will come

    @property
    def end(self) -> int:
        return self.start + len(self.buf)

    @property
    def full(self) -> bool:
        """As many bytes unread as the buffer holds: stop reading the program."""
        return self.end - self.acked >= self.limit

    def feed(self, data: bytes) -> None:
        self.buf += data
        self._trim()

    def _trim(self) -> None:
        # Keep the newest `limit` bytes and every unread one; drop in batches.
        keep = max(self.limit, self.end - self.acked)
        excess = len(self.buf) - keep
        if excess >= TRIM_BATCH:
            del self.buf[:excess]
            self.start += excess

    def read(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """(offset of the first byte returned, bytes); acknowledges everything before `offset`."""
        end = self.end
        if offset > end:
            raise ApiError(
                409,
                "offset_mismatch",
                f"offset {offset} is past the {end} bytes this stream has produced so far; "
                f"read from offset {end} or less",
            )
        pos = max(offset, self.start)
        data = bytes(self.buf[pos - self.start : pos - self.start + max_bytes])
        if pos > self.acked:
            self.acked = pos
            self._trim()
        return pos, data

    def release(self) -> None:
        """Drop every byte (the client closed the session): reads then skip to the end."""
        self.start = self.acked = self.end
        self.buf = bytearray()
        self.closed = True
