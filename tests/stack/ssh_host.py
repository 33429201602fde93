"""A real OpenSSH server on loopback for the remote-step tests: Debian's sshd, unpacked from its
package (apt-get download, cached), in its own mount namespace so its privilege-separation user
and /run/sshd exist there only, with generated host and client keys.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ci_policy import missing

CACHE = Path(os.environ.get("GYM_SUBSTRATE_CACHE") or "/var/cache/gym-substrate") / "sshd"
PACKAGES = ("openssh-server", "openssh-sftp-server", "libwrap0")


@dataclass
class SshHost:
    port: int
    host_key: str  # "ssh-ed25519 AAAA..."
    client_key: str  # the private key, OpenSSH format
    root: Path  # a folder the tests may read and write as the remote user (root)


def _sshd_root() -> Path:
    root = CACHE / "root"
    if (root / "usr" / "sbin" / "sshd").is_file():
        return root
    if os.geteuid() != 0 or shutil.which("apt-get") is None or shutil.which("unshare") is None:
        missing("the SSH test host needs root, apt-get and unshare")
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        ["apt-get", "download", *PACKAGES], cwd=debs, capture_output=True, text=True, check=False
    )
    if got.returncode != 0:
        missing(f"apt-get download {' '.join(PACKAGES)} failed:\n{got.stderr[-2000:]}")
    tmp = CACHE / "root.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(tmp)], check=True)
    tmp.rename(root)
    return root


def wait_for_sshd(
    address: str, port: int, proc: subprocess.Popen[bytes], log: Path, *, what: str = "sshd"
) -> None:
    """Until ``address:port`` accepts connections; a failure quoting ``log`` if ``proc`` exits
    first or 20 s pass."""
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} did not start:\n{log.read_text()}")
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ssh_host(base: Path) -> Iterator[SshHost]:
    root = _sshd_root()
    base.mkdir(parents=True, exist_ok=True)
    for name in ("host", "client"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / name)], check=True
        )
    (base / "authorized_keys").write_text((base / "client.pub").read_text())
    passwd = base / "passwd"
    passwd.write_text(
        Path("/etc/passwd").read_text() + "sshd:x:65533:65534::/run/sshd:/usr/sbin/nologin\n"
    )
    port = _free_port()
    (base / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {base / 'host'}\n"
        f"AuthorizedKeysFile {base / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n"
        f"UsePAM no\nPidFile {base / 'sshd.pid'}\n"
        f"Subsystem sftp {root / 'usr/lib/openssh/sftp-server'}\n"
    )
    libs = f"{root / 'usr/lib/x86_64-linux-gnu'}:{root / 'lib/x86_64-linux-gnu'}"
    script = (
        f"mount --bind {passwd} /etc/passwd && mount -t tmpfs tmpfs /run && mkdir -m 755 "
        f"/run/sshd && LD_LIBRARY_PATH={libs} exec {root / 'usr/sbin/sshd'} -D -e "
        f"-f {base / 'sshd_config'}"
    )
    log = (base / "sshd.log").open("w")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_sshd("127.0.0.1", port, proc, base / "sshd.log")
        host_key = " ".join((base / "host.pub").read_text().split()[:2])
        work = base / "remote"
        work.mkdir()
        yield SshHost(port, host_key, (base / "client").read_text(), work)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
