"""Head-and-tail output buffering, checked byte for byte against a plain model of the contract.

The buffer keeps its tail as a deque of chunks (coalesced small reads, whole large reads, only
the oldest one sliced); the model just keeps the whole stream and cuts it at the end. Read sizes
straddle the 64 KiB chunk size and limits straddle chunk multiples, so every way a read can land
against a chunk boundary is exercised.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_agent._jobs import _TAIL_CHUNK, _Output

# Random bytes, so a byte out of place shows (mostly invalid UTF-8: replacement is checked too).
_STREAM = random.Random(7).randbytes(3 * 1024 * 1024)

_read_sizes = st.one_of(
    st.integers(0, 16),
    st.integers(_TAIL_CHUNK - 16, _TAIL_CHUNK + 16),
    st.integers(0, 300_000),
)
_limits = st.one_of(
    st.sampled_from([0, 1, 2, 3, 2 * _TAIL_CHUNK - 1, 2 * _TAIL_CHUNK, 2 * _TAIL_CHUNK + 1]),
    st.integers(0, 4 * _TAIL_CHUNK + 3),
    st.sampled_from([1 << 20, (1 << 20) + 1]),
)


def _model(stream: bytes, limit: int) -> tuple[str, bool]:
    if len(stream) <= limit:
        return stream.decode("utf-8", "replace"), False
    head = stream[: limit // 2]
    tail = stream[len(stream) - (limit - limit // 2) :]
    dropped = len(stream) - len(head) - len(tail)
    marker = f"\n[... sandbox-agent: {dropped} bytes truncated ...]\n"
    return head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace"), True


@settings(max_examples=150, deadline=None)
@given(limit=_limits, sizes=st.lists(_read_sizes, max_size=24), start=st.integers(0, 1000))
def test_head_and_tail_match_the_model(limit: int, sizes: list[int], start: int) -> None:
    out = _Output(limit)
    pos = start
    for size in sizes:
        size = min(size, len(_STREAM) - pos)
        out.feed(_STREAM[pos : pos + size])
        pos += size
        # Memory stays bounded after every read: never more than `limit` bytes, few chunks.
        held = sum(len(c) for c in out.chunks)
        assert held == out.tail_len <= out.tail_limit
        assert len(out.head) + held <= limit
        assert len(out.chunks) <= 2 * (out.tail_limit // _TAIL_CHUNK) + 2
    stream = _STREAM[start:pos]
    assert out.total == len(stream)
    assert out.render() == _model(stream, limit)


def test_utf8_split_at_the_edges_is_replaced_not_lost() -> None:
    # 2,000 three-byte characters, 1,000 bytes kept: the head ends and the tail starts mid-char.
    text = "€" * 2000
    out = _Output(1000)
    data = text.encode()
    for i in range(0, len(data), 7):
        out.feed(data[i : i + 7])
    rendered, truncated = out.render()
    assert truncated
    head, marker, tail = rendered.partition("\n[... sandbox-agent: 5000 bytes truncated ...]\n")
    assert marker
    assert head == "€" * 166 + "\ufffd"  # 500 bytes = 166 chars + 2 bytes of the 167th
    assert tail == "\ufffd\ufffd" + "€" * 166  # last 500: 2 stray continuation bytes, then 166
