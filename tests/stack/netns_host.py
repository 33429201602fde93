"""A borrowed host of our own for the host stacks' live test: a Debian bookworm root made with
debootstrap (minbase plus openssh-server, sudo, systemd for systemctl, procps for sysctl), cached
once per machine, and Debian's own sshd from that root serving it on the address of a network
namespace, reached over a veth pair with a generated ed25519 key as a non-root sudo user.

Each run works on an overlay of the cached root (the cache stays pristine) mounted at
`<base>/merged`; sshd runs chrooted there in its own mount namespace (private /proc, /dev, /run)
and inside the network namespace, which has no route beyond its /30: apt on the host cannot
reach any mirror. In the chroot, systemctl enables and disables units (symlinks under
/etc/systemd) but ignores start, stop and restart ("Running in chroot, ignoring request").
Names are fixed (namespace `gs-testhost`, veth `gs-th0`), so whatever a crashed run left is
removed at the next start; teardown kills every process whose root is the overlay.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ci_policy import missing
from ssh_host import wait_for_sshd

CACHE = Path(os.environ.get("GYM_SUBSTRATE_CACHE") or "/var/cache/gym-substrate") / "test-host"
VERSION = "2"  # bump when PACKAGES or the build steps change: a new cache folder is built
PACKAGES = ("openssh-server", "sudo", "systemd", "procps")
NETNS = "gs-testhost"
VETH = "gs-th0"  # this side; the namespace side is gs-th1
HOST_IP, NS_IP = "10.213.77.1", "10.213.77.2"
DROP, DROP_IP = "gs-thsink", "10.213.78.1"  # the namespace's default route: a sink
USER = "gym"
MARK = "gs-test-host-merged"  # the overlay's mount point name: found and removed when stale


@dataclass
class NetnsHost:
    address: str
    port: int
    user: str
    private_key: str  # OpenSSH format
    host_key: str  # "ssh-ed25519 AAAA..."
    root: Path  # the host's / as this machine sees it (the overlay)


def _run(*argv: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, **kw)  # type: ignore[call-overload, no-any-return]


def _mirror() -> str:
    from gym_substrate.local.rootfs import RootfsError, debian_mirror

    try:
        return debian_mirror()
    except RootfsError as exc:
        missing(str(exc))


def cached_root() -> Path:
    """The pristine root, built once (temp folder + rename: a crash leaves no half root)."""
    root = CACHE / f"bookworm-{VERSION}"
    if (root / ".complete").is_file():
        return root
    if os.geteuid() != 0:
        missing("the test host needs root (debootstrap, chroot, network namespaces)")
    for tool in ("debootstrap", "unshare", "ip", "chroot"):
        if shutil.which(tool) is None:
            missing(f"the test host needs {tool} (apt-get install debootstrap iproute2)")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = CACHE / f".build-{VERSION}.{os.getpid()}"
    for stale in CACHE.glob(".build-*"):
        shutil.rmtree(stale, ignore_errors=True)
    built = _run(
        "unshare", "--mount", "--propagation", "private", "--",
        "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
        "bookworm", str(tmp), _mirror(),
        check=False, timeout=1800,
    )  # fmt: skip
    if built.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        missing(
            f"debootstrap of the test host failed:\n{built.stdout[-3000:]}{built.stderr[-2000:]}"
        )
    # Up to date like a real host, from this machine's Debian sources (with -updates and
    # -security): the tool folder is made here, so its packages are never newer than the host's.
    deb822 = Path("/etc/apt/sources.list.d/debian.sources")
    if deb822.is_file():
        shutil.copy(deb822, tmp / "etc/apt/sources.list.d/debian.sources")
        (tmp / "etc/apt/sources.list").unlink()
    elif Path("/etc/apt/sources.list").is_file():
        shutil.copy("/etc/apt/sources.list", tmp / "etc/apt/sources.list")
    setup = (
        "export DEBIAN_FRONTEND=noninteractive && apt-get update -qq && apt-get upgrade -y -qq && "
        f"useradd -m -s /bin/bash {USER} && "
        f"echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{USER} && "
        f"chmod 0440 /etc/sudoers.d/{USER} && apt-get clean"
    )
    done = _run("chroot", str(tmp), "/bin/sh", "-c", setup, check=False, timeout=1800)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        missing(f"setting up the test host failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    (tmp / ".complete").write_text(f"{VERSION}\n")
    tmp.rename(root)
    return root


def _stale_cleanup() -> None:
    """What a crashed run left: processes chrooted into an overlay, the overlay, the netns."""
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].endswith(f"/{MARK}")
    ]
    for merged in mounts:
        _kill_rooted(Path(merged))
        _run("umount", "-l", merged, check=False)
    _run("ip", "netns", "delete", NETNS, check=False)
    _run("ip", "link", "delete", VETH, check=False)


def _kill_rooted(root: Path) -> None:
    """SIGKILL every process whose root directory is `root` (sshd and its sessions)."""
    for _ in range(50):
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(proc / "root") == str(root):
                    found.append(int(proc.name))
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise AssertionError(f"processes rooted at {root} survived SIGKILL")


def _network() -> None:
    for argv in (
        ("ip", "netns", "add", NETNS),
        ("ip", "link", "add", VETH, "type", "veth", "peer", "name", "gs-th1"),
        ("ip", "link", "set", "gs-th1", "netns", NETNS),
        ("ip", "addr", "add", f"{HOST_IP}/30", "dev", VETH),
        ("ip", "link", "set", VETH, "up"),
        ("ip", "-n", NETNS, "addr", "add", f"{NS_IP}/30", "dev", "gs-th1"),
        ("ip", "-n", NETNS, "link", "set", "gs-th1", "up"),
        ("ip", "-n", NETNS, "link", "set", "lo", "up"),
        # A default route into a veth pair inside the namespace, a sink (the namespace does not
        # forward): programs that look for one (kube-apiserver picks its advertise address so)
        # find it, and nothing leaves.
        ("ip", "-n", NETNS, "link", "add", DROP, "type", "veth", "peer", "name", f"{DROP}-p"),
        ("ip", "-n", NETNS, "addr", "add", f"{DROP_IP}/32", "dev", DROP),
        ("ip", "-n", NETNS, "link", "set", f"{DROP}-p", "up"),
        ("ip", "-n", NETNS, "link", "set", DROP, "up"),
        ("ip", "-n", NETNS, "route", "add", "default", "dev", DROP),
    ):
        _run(*argv)


def netns_host(
    base: Path,
    *,
    binds: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
    owned: tuple[Path, ...] = (),
) -> Iterator[NetnsHost]:
    """Start the test host on an overlay of the cached root under `base`; tear it all down.

    `binds`: folders of this machine shown at the same path inside the host (the fakes, the
    toolchain); `owned`: those of them the host's user writes to; `env`: what every SSH session
    gets (sshd's SetEnv), PATH included."""
    lower = cached_root()
    _stale_cleanup()
    upper, work, merged = base / "upper", base / "work", base / MARK
    for d in (upper, work, merged):
        d.mkdir(parents=True)
    _run("mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged))  # fmt: skip
    proc: subprocess.Popen[bytes] | None = None
    try:
        _network()
        keys = base / "keys"
        keys.mkdir()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gs-test", "-f", str(keys / "id"))
        ssh_dir = merged / "home" / USER / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text((keys / "id.pub").read_text())
        uid = int(_run("chroot", str(merged), "id", "-u", USER).stdout)
        for p in (ssh_dir, ssh_dir / "authorized_keys", *owned):
            os.chown(p, uid, uid)
        # Every real host has one (netbase's postinst writes one where there is none, and no
        # purge removes it); it also lets sudo resolve the host name.
        if not (merged / "etc/hosts").exists():
            (merged / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\t\tlocalhost\n")
        # systemctl without a running systemd: unit files only, start/stop/restart ignored,
        # as in a chroot (systemd's SYSTEMD_OFFLINE, kept through sudo).
        offline = merged / "etc/sudoers.d/systemd-offline"
        offline.write_text('Defaults env_keep += "SYSTEMD_OFFLINE"\n')
        offline.chmod(0o440)
        sessions = {"SYSTEMD_OFFLINE": "1", **(env or {})}
        # Private mounts for the chroot, gone with the namespace: /proc (systemctl, dpkg),
        # /dev, a fresh /run with sshd's privilege-separation folder.
        script = (
            f"set -e; R={merged}; mount -t proc proc $R/proc; mount --rbind /dev $R/dev; "
            + "".join(f"mkdir -p $R{b}; mount --bind {b} $R{b}; " for b in binds)
            + "mount -t tmpfs tmpfs $R/run; mkdir -m 755 $R/run/sshd; hostname localhost; "
            f"exec chroot $R /usr/sbin/sshd -D -e -o ListenAddress={NS_IP} -o "
            + shlex.quote("SetEnv=" + " ".join(f"{k}={v}" for k, v in sessions.items()))
        )
        log = (base / "sshd.log").open("w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, "unshare", "--mount", "--uts",
             "--propagation", "private", "bash", "-c", script],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        wait_for_sshd(NS_IP, 22, proc, base / "sshd.log", what="test host sshd")
        host_key = " ".join((merged / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])
        yield NetnsHost(NS_IP, 22, USER, (keys / "id").read_text(), host_key, merged)
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_rooted(merged)
        _run("umount", "-l", str(merged), check=False)
        _run("ip", "netns", "delete", NETNS, check=False)
        _run("ip", "link", "delete", VETH, check=False)
