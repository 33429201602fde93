"""The static binary "rides into any image": PID 1 in gVisor on a busybox-only rootfs, and Docker.

The runsc test follows the project's gVisor recipe (reference/gvisor-local.md): its own network
namespace and veth pair with unique names, `--network=sandbox` with the /proc/sys/net mask, the
veth address re-added before the run, and the safety rules (no default route in the namespace,
forwarding off on the host side, resolv.conf pointing at 127.0.0.1). Everything it creates is
removed even when an assertion fails.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "agent" / "build" / "build-static.sh"
DOCKERFILE = REPO / "agent" / "build" / "Dockerfile"
_MASKED_RUNSC = 'mount -t tmpfs -o size=4k,mode=0555 gvmask /proc/sys/net && exec runsc "$@"'


def _run(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)


@pytest.fixture(scope="session")
def static_binary() -> Path:
    """Build (or reuse the cached) static agent; the path of the binary."""
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, f"static build failed:\n{proc.stderr[-4000:]}"
    binary = REPO / proc.stdout.strip().splitlines()[-1]
    assert binary.is_file()
    again = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0
    assert "up to date" in again.stderr, "an unchanged tree must reuse the cached binary"
    assert (REPO / again.stdout.strip().splitlines()[-1]) == binary
    assert (binary.parent / "image" / "sandbox-agent").samefile(binary)
    return binary


class _Http:
    def __init__(self, host: str, port: int = 80) -> None:
        self.host, self.port = host, port

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> tuple[int, dict[str, str], bytes]:
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def wait_ready(self, deadline_s: float, why: Any) -> dict[str, Any]:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                status, _, body = self.call("GET", "/readyz", timeout=2)
                if status == 200:
                    return dict(json.loads(body))
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the agent never answered /readyz: {why()}")

    def exec(self, **fields: Any) -> dict[str, Any]:
        status, _, body = self.call("POST", "/v1/exec?wait=8", fields)
        assert status == 200, body
        return dict(json.loads(body))


def _drive(agent: _Http) -> None:
    """Exec and files through the agent, as a provider would."""
    job = agent.exec(command=["/bin/busybox", "uname", "-r"])
    assert job["state"] == "exited", job["error"]
    job = agent.exec(command="echo $((6 * 7)); echo oops >&2; exit 4")
    assert (job["stdout"], job["stderr"], job["exit_code"]) == ("42\n", "oops\n", 4)
    job = agent.exec(command="cat /proc/1/cmdline | tr '\\0' ' '")
    assert job["stdout"].startswith("/opt/sandbox-agent/sandbox-agent"), job
    job = agent.exec(command="env")
    assert "LD_LIBRARY_PATH" not in job["stdout"]
    assert "_MEI" not in job["stdout"]
    job = agent.exec(command="sleep 30 & sleep 30", timeout_s=0.5)
    assert job["state"] == "timeout"
    # The agent reaps orphans of its jobs: no zombie is left under the sandbox's PID 1.
    orphan = agent.exec(command="sleep 0.3 >/dev/null 2>&1 & echo $!")["stdout"].strip()
    time.sleep(1.0)
    job = agent.exec(command=f"cat /proc/{orphan}/status 2>/dev/null | grep State || echo gone")
    assert job["stdout"].strip() == "gone", job["stdout"]

    data = os.urandom(3 * 1024 * 1024 + 17)
    half = len(data) // 2
    for offset, chunk, final in ((0, data[:half], "false"), (half, data[half:], "true")):
        status, _, body = agent.call(
            "PUT",
            f"/v1/files?path=/work/data.bin&offset={offset}&final={final}&mode=0600",
            chunk,
        )
        assert status == 200, body
    assert json.loads(body)["sha256"] == hashlib.sha256(data).hexdigest()
    status, headers, got = agent.call(
        "GET", "/v1/files?path=/work/data.bin", headers={"Range": "bytes=100-199"}
    )
    assert status == 206
    assert got == data[100:200]
    status, _, got = agent.call("GET", "/v1/files?path=/work/data.bin")
    assert got == data
    status, _, body = agent.call("GET", "/v1/stat?path=/work/data.bin")
    assert json.loads(body)["mode"] == 0o600
    job = agent.exec(command="wc -c < /work/data.bin", user=1234)
    assert job["state"] == "exited", job["error"]
    assert job["exit_code"] != 0, "uid 1234 must not read a 0600 root file"
    job = agent.exec(command=["/bin/busybox", "wc", "-c", "/work/data.bin"])
    assert job["stdout"].split()[0] == str(len(data))
    _drive_pty(agent)


def _drive_pty(agent: _Http) -> None:
    """A terminal from the static binary: termios and the PTY work without the image's help,
    and no bash means busybox's /bin/sh for an interactive shell."""
    status, _, body = agent.call("POST", "/v1/pty", {"user": 1234, "rows": 22, "cols": 66})
    assert status == 200, body
    session = json.loads(body)["id"]
    status, _, body = agent.call(
        "POST",
        f"/v1/pty/{session}/input?offset=0",
        b"stty size; id -u; echo $0; exit 3\n",
        headers={"Content-Type": "application/octet-stream"},
    )
    assert status == 200, body
    out, offset = b"", 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, _, body = agent.call("GET", f"/v1/pty/{session}/output?offset={offset}&wait=8")
        doc = json.loads(body)
        out += base64.b64decode(doc["data"])
        offset = doc["next_offset"]
        if doc["eof"]:
            break
    assert b"22 66\r\n1234\r\n/bin/sh\r\n" in out, out
    status, _, body = agent.call("GET", f"/v1/pty/{session}")
    assert json.loads(body)["exit_code"] == 3


def _busybox_rootfs(root: Path) -> None:
    """A root file system holding nothing but busybox-static (and its applet links)."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    applets = _run(str(root / "bin" / "busybox"), "--list").stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")


@pytest.fixture
def netns() -> Iterator[tuple[str, str, str, str]]:
    """A private network namespace plus veth pair: (netns, host veth, sandbox veth, sandbox ip)."""
    tag = f"{os.getpid() % 10000}{random.randrange(100):02d}"
    ns, host_if, sb_if = f"sagt{tag}", f"sah{tag}", f"san{tag}"
    used = _run("ip", "-4", "addr").stdout
    octet = next(o for o in random.sample(range(1, 255), 254) if f"10.217.{o}." not in used)
    host_ip, sb_ip = f"10.217.{octet}.1", f"10.217.{octet}.2"
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", sb_if)
        _run("ip", "link", "set", sb_if, "netns", ns)
        Path(f"/proc/sys/net/ipv4/conf/{host_if}/forwarding").write_text("0\n")
        Path(f"/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6").write_text("1\n")
        _run("ip", "addr", "add", f"{host_ip}/24", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        # Deliberately no default route inside the namespace.
        yield ns, host_if, sb_if, sb_ip
    finally:
        _run("ip", "link", "del", host_if, check=False)
        _run("ip", "netns", "del", ns, check=False)


class _GvisorSandbox:
    """One runsc sandbox running the static agent as PID 1 on a busybox-only rootfs."""

    def __init__(self, binary: Path, netns: tuple[str, str, str, str], work: Path) -> None:
        self.ns, _, self.sb_if, self.sb_ip = netns
        self.work = work
        self.rootfs, self.state = work / "rootfs", work / "state"
        _busybox_rootfs(self.rootfs)
        self.state.mkdir()
        (work / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        (work / "hosts").write_text("127.0.0.1 localhost\n")
        self.binary = binary
        self.runsc = [
            "runsc",
            f"--root={self.state}",
            "--network=sandbox",
            "--overlay2=root:memory",
            "--net-disconnect-ok",
        ]
        self.containers: list[str] = []
        self.log = work / "runsc.log"

    def bundle(self, name: str, actor_id: str) -> Path:
        """A bundle whose /run/ate/actor-id says `actor_id` (as Substrate mounts it)."""
        bundle = self.work / name
        bundle.mkdir()
        (bundle / "actor-id").write_text(actor_id + "\n")
        _run("runsc", "spec", "--bundle", str(bundle))
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"] = {"path": str(self.rootfs), "readonly": False}
        spec["hostname"] = "sa-static-test"
        spec["process"]["terminal"] = False
        spec["process"]["args"] = ["/opt/sandbox-agent/sandbox-agent"]
        # `runsc spec` grants only three capabilities; add the ones Docker grants by default
        # that running a command as another user needs.
        for kind, caps in spec["process"]["capabilities"].items():
            if kind != "inheritable":
                caps += [c for c in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN") if c not in caps]
        spec["process"]["env"] = [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        ]
        binds = {
            "/etc/resolv.conf": self.work / "resolv.conf",
            "/etc/hosts": self.work / "hosts",
            "/opt/sandbox-agent/sandbox-agent": self.binary,
            "/run/ate/actor-id": bundle / "actor-id",
        }
        spec["mounts"] += [
            {"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", "ro"]}
            for dest, src in binds.items()
        ]
        for entry in spec["linux"]["namespaces"]:
            if entry["type"] == "network":
                entry["path"] = f"/var/run/netns/{self.ns}"
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle

    def _masked(self, *args: str) -> None:
        # The veth loses its address whenever a sandbox leaves the netns: re-add it first.
        _run("ip", "-n", self.ns, "addr", "replace", f"{self.sb_ip}/24", "dev", self.sb_if)
        _run("ip", "-n", self.ns, "link", "set", self.sb_if, "up")
        with open(self.log, "ab") as out:
            done = subprocess.run(
                [
                    "unshare",
                    "-m",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    _MASKED_RUNSC,
                    "runsc",
                    *self.runsc[1:],
                    *args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=120,
            )
        assert done.returncode == 0, self.log.read_text()[-3000:]

    def run(self, bundle: Path) -> _Http:
        container = f"sagt-{uuid.uuid4().hex[:12]}"
        self.containers.append(container)
        self._masked("run", "--detach", "--bundle", str(bundle), container)
        return _Http(self.sb_ip)

    def checkpoint_and_restore(self, image: Path, bundle: Path) -> _Http:
        old = self.containers[-1]
        _run(*self.runsc, "checkpoint", f"--image-path={image}", old, timeout=120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = _run(*self.runsc, "state", old, check=False).stdout
            if '"stopped"' in state or not state:
                break
            time.sleep(0.1)
        _run(*self.runsc, "delete", "--force", old, check=False)
        self.containers.remove(old)
        container = f"sagt-{uuid.uuid4().hex[:12]}"
        self.containers.append(container)
        self._masked(
            "restore", "--detach", f"--image-path={image}", "--bundle", str(bundle), container
        )
        return _Http(self.sb_ip)

    def close(self) -> None:
        for container in reversed(self.containers):
            _run(*self.runsc, "delete", "--force", container, check=False)


@pytest.fixture
def gvisor(
    static_binary: Path, netns: tuple[str, str, str, str], tmp_path: Path
) -> Iterator[_GvisorSandbox]:
    sandbox = _GvisorSandbox(static_binary, netns, tmp_path)
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.mark.runsc
@pytest.mark.slow
def test_static_binary_is_pid1_in_gvisor_on_busybox_rootfs(gvisor: _GvisorSandbox) -> None:
    agent = gvisor.run(gvisor.bundle("bundle", "actor-static-1"))
    ready = agent.wait_ready(60, lambda: gvisor.log.read_text()[-2000:])
    assert ready["actor_id"] == "actor-static-1"
    assert ready["agent_version"]
    _drive(agent)


@pytest.mark.runsc
@pytest.mark.slow
def test_restore_as_another_actor_gets_a_new_boot_id(gvisor: _GvisorSandbox) -> None:
    """A golden snapshot restored for another actor must not keep the first one's identity."""
    agent = gvisor.run(gvisor.bundle("golden", "actor-golden"))
    golden = agent.wait_ready(60, lambda: gvisor.log.read_text()[-2000:])
    assert golden["actor_id"] == "actor-golden"
    job = agent.exec(command="echo kept > /work-state; echo ok")
    assert job["stdout"] == "ok\n"

    restored = gvisor.checkpoint_and_restore(gvisor.work / "image", gvisor.bundle("b2", "actor-2"))
    after = restored.wait_ready(60, lambda: gvisor.log.read_text()[-2000:])
    assert after["actor_id"] == "actor-2"
    assert after["boot_id"] != golden["boot_id"]
    assert after["uptime_s"] < golden["uptime_s"] + 30
    status, _, body = restored.call(
        "POST",
        "/v1/exec?wait=8",
        {"command": "cat /work-state"},
        headers={"X-Sandbox-Actor-Id": "actor-golden"},
    )
    assert status == 409, "a call meant for the golden actor must not run in actor-2"
    assert json.loads(body)["error"]["code"] == "actor_mismatch"
    job = restored.exec(command="cat /work-state")
    assert job["stdout"] == "kept\n", "memory and files survive the restore"


@pytest.mark.docker
@pytest.mark.slow
def test_scratch_image_runs_the_agent(static_binary: Path, tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    shutil.copy2(static_binary, context / "sandbox-agent")
    tag = f"gym-substrate-test/sandbox-agent:{uuid.uuid4().hex[:10]}"
    name = f"sagt-{uuid.uuid4().hex[:10]}"
    built = _run(
        "docker",
        "build",
        "-q",
        "-f",
        str(DOCKERFILE),
        "-t",
        tag,
        str(context),
        check=False,
        timeout=240,
    )
    assert built.returncode == 0, built.stderr
    try:
        inspect = json.loads(_run("docker", "image", "inspect", tag).stdout)[0]
        assert inspect["Config"]["Entrypoint"] == ["/opt/sandbox-agent/sandbox-agent"]
        assert len(inspect["RootFS"]["Layers"]) == 1, "FROM scratch: the binary is the only layer"
        # Host networking on a free loopback port: no bridge, iptables or port proxy needed.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        run = _run(
            "docker",
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            tag,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            check=False,
        )
        assert run.returncode == 0, run.stderr
        agent = _Http("127.0.0.1", port)
        agent.wait_ready(60, lambda: _run("docker", "logs", name, check=False).stderr[-2000:])
        job = agent.exec(command=["/opt/sandbox-agent/sandbox-agent", "--version"])
        assert job["stdout"].startswith("sandbox-agent ")
        status, _, body = agent.call("PUT", "/v1/files?path=/data/x.txt", b"scratch")
        assert status == 200, body
        status, _, got = agent.call("GET", "/v1/files?path=/data/x.txt")
        assert got == b"scratch"
    finally:
        _run("docker", "rm", "-f", name, check=False)
        _run("docker", "rmi", "-f", tag, check=False)
