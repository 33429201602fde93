"""Contract tests for /v1/files and /v1/stat against the real agent process."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

MiB = 1024 * 1024


def _q(path: Path | str) -> str:
    return quote(str(path), safe="/")


def test_put_creates_parents_and_returns_sha(agent: Any, tmp_path: Path, check_schema: Any) -> None:
    target = tmp_path / "a" / "b" / "c.txt"
    resp = agent.request("PUT", f"/v1/files?path={_q(target)}", body=b"hello")
    assert resp.status == 200
    doc = resp.json()
    check_schema(doc, "UploadReply")
    assert doc == {
        "path": str(target),
        "size": 5,
        "sha256": hashlib.sha256(b"hello").hexdigest(),
    }
    assert target.read_bytes() == b"hello"
    assert (target.stat().st_mode & 0o7777) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["c.txt"], "no temporary file left"


def test_put_mode_and_overwrite(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "run.sh"
    agent.request("PUT", f"/v1/files?path={_q(target)}&mode=0755", body=b"#!/bin/sh\necho 1\n")
    assert (target.stat().st_mode & 0o7777) == 0o755
    job = agent.exec(command=[str(target)]).json()
    assert job["stdout"] == "1\n"
    agent.request("PUT", f"/v1/files?path={_q(target)}&mode=600", body=b"new")
    assert target.read_bytes() == b"new"
    assert (target.stat().st_mode & 0o7777) == 0o600


def test_empty_file(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "empty"
    resp = agent.request("PUT", f"/v1/files?path={_q(target)}", body=b"")
    assert resp.status == 200
    assert resp.json()["size"] == 0
    resp = agent.request("GET", f"/v1/files?path={_q(target)}")
    assert resp.status == 200
    assert resp.body == b""
    assert resp.headers["content-length"] == "0"


def test_100_mib_chunked_upload_read_back_in_ranges(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "big.bin"
    block = os.urandom(MiB)
    data = b"".join(block[i:] + block[:i] for i in range(100))  # 100 MiB, not periodic
    chunk = 25 * MiB
    offsets = list(range(0, len(data), chunk))
    for n, offset in enumerate(offsets):
        final = "true" if n == len(offsets) - 1 else "false"
        resp = agent.request(
            "PUT",
            f"/v1/files?path={_q(target)}&offset={offset}&final={final}",
            body=data[offset : offset + chunk],
            timeout=60,
        )
        assert resp.status == 200, resp.body
        if final == "false":
            assert resp.json()["sha256"] is None
            assert not target.exists(), "a reader must never see a half-written file"
            assert resp.json()["size"] == offset + chunk
    assert resp.json()["size"] == len(data)
    assert resp.json()["sha256"] == hashlib.sha256(data).hexdigest()

    head = agent.request("HEAD", f"/v1/files?path={_q(target)}")
    assert head.status == 200
    assert head.headers["content-length"] == str(len(data))
    assert head.body == b""

    got = hashlib.sha256()
    step = 30 * MiB
    for start in range(0, len(data), step):
        end = min(start + step, len(data)) - 1
        part = agent.request(
            "GET", f"/v1/files?path={_q(target)}", headers={"Range": f"bytes={start}-{end}"}
        )
        assert part.status == 206
        assert part.headers["content-range"] == f"bytes {start}-{end}/{len(data)}"
        assert len(part.body) == end - start + 1
        got.update(part.body)
    assert got.hexdigest() == hashlib.sha256(data).hexdigest()
    whole = agent.request("GET", f"/v1/files?path={_q(target)}", timeout=60)
    assert whole.status == 200
    assert whole.headers["content-length"] == str(len(data))
    assert hashlib.sha256(whole.body).hexdigest() == hashlib.sha256(data).hexdigest()


def test_range_forms(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "r.txt"
    target.write_bytes(b"0123456789")
    url = f"/v1/files?path={_q(target)}"
    cases = {"bytes=2-4": b"234", "bytes=7-": b"789", "bytes=-3": b"789", "bytes=5-100": b"56789"}
    for header, expected in cases.items():
        resp = agent.request("GET", url, headers={"Range": header})
        assert resp.status == 206, header
        assert resp.body == expected, header
    resp = agent.request("GET", url, headers={"Range": "bytes=10-"})
    assert resp.status == 416
    assert resp.json()["error"]["code"] == "range_not_satisfiable"
    assert resp.headers["content-range"] == "bytes */10"
    for bad in ("bytes=a-b", "items=0-1", "bytes=0-1,3-4", "bytes=5-2", "bytes=-"):
        resp = agent.request("GET", url, headers={"Range": bad})
        assert resp.status == 400, bad
        assert resp.json()["error"]["code"] == "bad_request"


def test_failed_upload_leaves_old_file_intact(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "keep.txt"
    agent.request("PUT", f"/v1/files?path={_q(target)}", body=b"old content")
    # An abandoned chunked upload: the old file stays until a final chunk arrives.
    agent.request("PUT", f"/v1/files?path={_q(target)}&final=false", body=b"new partial")
    assert target.read_bytes() == b"old content"
    # A client that dies mid-body: the old file stays and the partial chunk is dropped.
    with socket.create_connection(("127.0.0.1", agent.port)) as sock:
        sock.sendall(
            f"PUT /v1/files?path={_q(target)} HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: 1000000\r\n\r\n".encode()
            + b"x" * 1000
        )
        time.sleep(0.2)
    time.sleep(0.3)
    assert target.read_bytes() == b"old content"
    assert agent.request("GET", f"/v1/files?path={_q(target)}").body == b"old content"
    # An oversize request is refused and leaves the old file as it was.
    resp = agent.request(
        "PUT", f"/v1/files?path={_q(target)}", body=b"y" * (64 * MiB + 1), timeout=60
    )
    assert resp.status == 413
    assert target.read_bytes() == b"old content"


def test_resumed_chunk_after_failure(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "resume.bin"
    url = f"/v1/files?path={_q(target)}"
    assert agent.request("PUT", url + "&offset=0&final=false", body=b"aaaa").status == 200
    # Retrying the same chunk is harmless (idempotent overwrite at its offset).
    assert agent.request("PUT", url + "&offset=0&final=false", body=b"aaaa").status == 200
    gap = agent.request("PUT", url + "&offset=10&final=true", body=b"bbbb")
    assert gap.status == 409
    assert gap.json()["error"]["code"] == "offset_mismatch"
    assert "offset=4" in gap.json()["error"]["message"]
    done = agent.request("PUT", url + "&offset=4&final=true", body=b"bbbb")
    assert done.json() == {
        "path": str(target),
        "size": 8,
        "sha256": hashlib.sha256(b"aaaabbbb").hexdigest(),
    }
    assert target.read_bytes() == b"aaaabbbb"
    nothing = agent.request("PUT", url + "&offset=8&final=true", body=b"cc")
    assert nothing.status == 409


def test_oversize_body_gets_413_even_when_sent_whole(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "too-big"
    body = b"z" * (64 * MiB + 1)
    resp = agent.request("PUT", f"/v1/files?path={_q(target)}", body=body, timeout=60)
    assert resp.status == 413
    assert resp.json()["error"]["code"] == "too_large"
    assert not target.exists()
    # Chunked transfer encoding has no Content-Length: the cap is enforced while streaming.
    agent.close_conn()
    with socket.create_connection(("127.0.0.1", agent.port), timeout=60) as sock:
        sock.sendall(
            f"PUT /v1/files?path={_q(target)} HTTP/1.1\r\nHost: x\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        piece = b"q" * MiB
        frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
        try:
            for _ in range(70):
                sock.sendall(frame)
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
    assert b"too_large" in reply
    assert not target.exists()
    leftover = tmp_path / ".too-big.sandbox-agent-upload"
    assert not leftover.exists() or leftover.stat().st_size == 0, "a refused chunk is dropped"
    # The exact limit is accepted.
    ok = agent.request("PUT", f"/v1/files?path={_q(target)}", body=body[:-1], timeout=60)
    assert ok.status == 200
    assert ok.json()["size"] == 64 * MiB


@pytest.mark.parametrize("method", ["GET", "PUT", "HEAD"])
def test_relative_or_missing_path_is_400(agent: Any, method: str) -> None:
    for query in ("?path=relative/x", "", "?path="):
        resp = agent.request(method, f"/v1/files{query}", body=b"" if method == "PUT" else None)
        assert resp.status == 400, query
        if method != "HEAD":
            assert resp.json()["error"]["code"] == "bad_request"
    resp = agent.request("GET", "/v1/stat?path=relative")
    assert resp.status == 400


def test_directory_and_missing_file(agent: Any, tmp_path: Path) -> None:
    resp = agent.request("GET", f"/v1/files?path={_q(tmp_path)}")
    assert resp.status == 400
    assert "directory" in resp.json()["error"]["message"]
    resp = agent.request("PUT", f"/v1/files?path={_q(tmp_path)}", body=b"x")
    assert resp.status == 400
    resp = agent.request("GET", f"/v1/files?path={_q(tmp_path / 'missing')}")
    assert resp.status == 404
    assert resp.json()["error"]["code"] == "not_found"
    assert agent.request("HEAD", f"/v1/files?path={_q(tmp_path / 'missing')}").status == 404
    (tmp_path / "plain").write_text("x")
    resp = agent.request("PUT", f"/v1/files?path={_q(tmp_path / 'plain' / 'sub')}", body=b"x")
    assert resp.status == 400
    assert "not a directory" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    "query",
    ["offset=-1", "offset=abc", "final=maybe", "mode=999", "mode=rwx", "mode=12345"],
)
def test_bad_put_parameters(agent: Any, tmp_path: Path, query: str) -> None:
    resp = agent.request("PUT", f"/v1/files?path={_q(tmp_path / 'f')}&{query}", body=b"x")
    assert resp.status == 400
    name = query.split("=")[0]
    assert name in resp.json()["error"]["message"]
    assert not (tmp_path / "f").exists()


def test_stat(agent: Any, tmp_path: Path, check_schema: Any) -> None:
    (tmp_path / "f").write_bytes(b"12345")
    os.chmod(tmp_path / "f", 0o640)
    os.symlink(tmp_path / "f", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    expected = {"f": ("file", 5), "link": ("symlink", None), "fifo": ("other", 0)}
    for name, (kind, size) in expected.items():
        resp = agent.request("GET", f"/v1/stat?path={_q(tmp_path / name)}")
        assert resp.status == 200
        doc = resp.json()
        check_schema(doc, "FileStat")
        assert doc["type"] == kind
        assert doc["path"] == str(tmp_path / name)
        if size is not None:
            assert doc["size"] == size
    doc = agent.request("GET", f"/v1/stat?path={_q(tmp_path)}").json()
    assert doc["type"] == "dir"
    doc = agent.request("GET", f"/v1/stat?path={_q(tmp_path / 'f')}").json()
    assert doc["mode"] == 0o640
    assert abs(doc["mtime"] - (tmp_path / "f").stat().st_mtime) < 1e-3
    resp = agent.request("GET", f"/v1/stat?path={_q(tmp_path / 'nope')}")
    assert resp.status == 404
    assert resp.json()["error"]["code"] == "not_found"


def test_fifo_and_devices_are_refused_not_hung(agent: Any, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", Path("/dev/null")):
        resp = agent.request("GET", f"/v1/files?path={_q(path)}", timeout=10)
        assert resp.status == 400
        assert "not a regular file" in resp.json()["error"]["message"]


def test_concurrent_uploads_to_one_path_never_mix(agent: Any, tmp_path: Path) -> None:
    import http.client
    from concurrent.futures import ThreadPoolExecutor

    target = tmp_path / "contended.bin"
    bodies = [os.urandom(4 * MiB), os.urandom(4 * MiB)]
    digests = {hashlib.sha256(b).hexdigest() for b in bodies}

    def put(body: bytes) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=60)
        try:
            conn.request("PUT", f"/v1/files?path={_q(target)}", body=body)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    with ThreadPoolExecutor(2) as pool:
        for _ in range(8):
            replies = list(pool.map(put, bodies))
            assert [status for status, _ in replies] == [200, 200], replies
            assert hashlib.sha256(target.read_bytes()).hexdigest() in digests
