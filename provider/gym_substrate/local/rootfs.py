"""The default template's own root filesystem: a minimal Debian made with debootstrap, cached.

Sandboxes of the default template used to run on the host's `/`: they could read the host's
/root, and a login shell sourced the host's /etc/profile (slow under gVisor). Now they get a
small Debian bookworm (`debootstrap --variant=minbase` plus bash, coreutils, python3, tmux,
git, curl and ca-certificates, with this machine's extra CAs trusted as `.ci/gym-env` does),
built once per machine on first use.

Layout: ``<rootfs dir>/<name>-<version>/`` where the rootfs dir is ``$GYM_SUBSTRATE_ROOTFS_DIR``
or ``rootfs/`` in the default state folder (not a backend's own, so the demo's throwaway state
folders share one build). A build runs in ``.build-<name>-<version>.<pid>`` next to it, inside a
private mount namespace (debootstrap's /proc and /sys mounts vanish with it), gets its marker
file last and is then renamed into place: a crash leaves only a `.build-*` folder, which is never
used and is removed by the next build. An flock on ``.lock`` keeps two processes from building
at once; the second one waits and then reuses the first one's result.

The sandbox agent is not installed into the tree: its static binary (``agent/build/
build-static.sh``, or ``$GYM_SUBSTRATE_AGENT_BINARY``) is copied to ``agent/<sha>/`` and bound
read-only at ``AGENT_PATH`` by both runtimes, so one rootfs serves every agent version and a
new agent never reuses a golden snapshot of an old one (the path is in the template digest).
Its unpacked form (``agent/build/build-unpacked.sh``, or ``$GYM_SUBSTRATE_AGENT_DIR``), which
the gVisor runtime uses by default, is copied to ``agent/u-<sha>/`` and its whole folder is
bound read-only at ``AGENT_PATH``'s folder: nothing is unpacked into the sandbox's memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "AGENT_BINARY_ENV",
    "AGENT_DIR_ENV",
    "AGENT_FORMS",
    "AGENT_FORM_ENV",
    "AGENT_PATH",
    "MARKER",
    "MIRROR_ENV",
    "PACKAGES",
    "RELEASE_FILE",
    "ROOTFS_DIR_ENV",
    "ROOTFS_NAME",
    "ROOTFS_VERSION",
    "SUITE",
    "BuiltRootfs",
    "RootfsError",
    "agent_binary",
    "agent_folder",
    "agent_form",
    "build_rootfs",
    "debian_mirror",
    "default_rootfs_dir",
    "ensure_rootfs",
    "find_rootfs",
    "remove_rootfs",
]

ROOTFS_DIR_ENV = "GYM_SUBSTRATE_ROOTFS_DIR"
MIRROR_ENV = "GYM_SUBSTRATE_DEBIAN_MIRROR"
AGENT_BINARY_ENV = "GYM_SUBSTRATE_AGENT_BINARY"
AGENT_DIR_ENV = "GYM_SUBSTRATE_AGENT_DIR"
# which agent build the default template runs: "unpacked" (gVisor's default) or "static"
AGENT_FORM_ENV = "GYM_SUBSTRATE_AGENT_FORM"
AGENT_FORMS = ("unpacked", "static")

SUITE = "bookworm"
ROOTFS_NAME = f"debian-{SUITE}"
# bump when the recipe changes: a new version is built next to the old one, never over it
ROOTFS_VERSION = 1
PACKAGES = ("bash", "coreutils", "python3", "tmux", "git", "curl", "ca-certificates")
MARKER = ".gym-substrate-rootfs.json"
# inside the tree: says which build this is (the tests read it to tell it from the host's /)
RELEASE_FILE = "/etc/gym-substrate-rootfs"
AGENT_PATH = "/opt/sandbox-agent/sandbox-agent"
_DEBOOTSTRAP_TIMEOUT_S = 1800
_REPO = Path(__file__).resolve().parents[3]
_BUILD_SCRIPT = _REPO / "agent" / "build" / "build-static.sh"
_UNPACKED_SCRIPT = _REPO / "agent" / "build" / "build-unpacked.sh"

Progress = Callable[[str], None]


class RootfsError(RuntimeError):
    """The rootfs cannot be had; the message says why and what to do instead."""


@dataclass(frozen=True)
class BuiltRootfs:
    path: Path
    info: dict[str, Any]

    @property
    def key(self) -> str:
        return self.path.name


def _stderr(line: str) -> None:
    print(f"[rootfs] {line}", file=sys.stderr, flush=True)


def default_rootfs_dir() -> Path:
    """Where built root filesystems are kept (one machine-wide cache per state folder)."""
    from gym_substrate.local.statedir import default_state_dir

    override = os.environ.get(ROOTFS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return default_state_dir() / "rootfs"


def debian_mirror() -> str:
    """The Debian archive: ``$GYM_SUBSTRATE_DEBIAN_MIRROR``, else the one apt already uses."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return _check_mirror_url(override)
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                if line.startswith("URIs:"):
                    for uri in line.split()[1:]:
                        if "security" not in uri and "debian" in uri:
                            return uri
    for path in [
        Path("/etc/apt/sources.list"),
        *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
    ]:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                words = line.split()
                if words[:1] == ["deb"] and "security" not in line:
                    for word in words[1:]:
                        if "://" in word and "debian" in word:
                            return word
    raise RootfsError(
        "no Debian mirror found in /etc/apt/sources.list*; name one with "
        f"{MIRROR_ENV}=http://deb.debian.org/debian or `gym-substrate local rootfs build --mirror`"
    )


def _check_mirror_url(url: str) -> str:
    if not re.fullmatch(r"(https?|file)://[^\s]+", url):
        raise RootfsError(
            f"mirror {url!r} is not an http://, https:// or file:// URL; give e.g. "
            "http://deb.debian.org/debian"
        )
    return url.rstrip("/")


def _probe_mirror(mirror: str) -> None:
    url = f"{mirror}/dists/{SUITE}/Release"
    try:
        with urllib.request.urlopen(url, timeout=15) as response:  # noqa: S310 - checked scheme
            response.read(1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RootfsError(
            f"the Debian mirror {mirror} is unreachable ({url}: {reason}); point "
            f"{MIRROR_ENV} (or --mirror) at one this machine reaches, or opt in to the host's "
            "root filesystem with `rootfs: host`"
        ) from None


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def find_rootfs(base: Path | None = None) -> BuiltRootfs | None:
    """The complete current-version rootfs under ``base``, or None (a partial one never counts)."""
    path = (base or default_rootfs_dir()) / f"{ROOTFS_NAME}-{ROOTFS_VERSION}"
    info = _read_marker(path)
    if info is None or info.get("version") != ROOTFS_VERSION:
        return None
    return BuiltRootfs(path, info)


@contextlib.contextmanager
def _locked(base: Path, progress: Progress) -> Iterator[None]:
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process building in {base}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _mounted_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [m for line in lines if (m := line.split()[1]).startswith(prefix)]


def _safe_rmtree(path: Path) -> None:
    """Remove a (half-built) tree, never through a mount left inside it."""
    if not path.exists():
        return
    for mount in sorted(_mounted_under(path), reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    if _mounted_under(path):
        raise RootfsError(f"{path} still has mounts below it; unmount them and retry")
    shutil.rmtree(path)


def _preconditions(mirror: str) -> None:
    fallback = "or opt in to the host's root filesystem with `rootfs: host` (`--rootfs host`)"
    if os.geteuid() != 0:
        raise RootfsError(
            "building the sandbox root filesystem needs root (debootstrap, chroot); run this "
            f"as root once (`sudo gym-substrate local rootfs build`), {fallback}"
        )
    if shutil.which("debootstrap") is None:
        raise RootfsError(f"debootstrap is not installed: `apt install debootstrap`, {fallback}")
    if shutil.which("unshare") is None:
        raise RootfsError(
            f"unshare (util-linux) is not installed: `apt install util-linux`, {fallback}"
        )
    _probe_mirror(mirror)


# debootstrap's phase lines worth showing (it prints one line per package too)
_PHASES = re.compile(
    r"^(I: (Retrieving Release|Checking Release signature|Valid Release signature|"
    r"Resolving dependencies|Found (additional )?(required|base) packages|"
    r"Checking component|Extracting base-files|Installing core packages|"
    r"Unpacking required packages|Configuring required packages|Unpacking the base system|"
    r"Configuring the base system|Base system installed successfully)|E: |W: )"
)

_PER_PACKAGE = re.compile(r"^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) ")


def _run_debootstrap(target: Path, mirror: str, log_path: Path, progress: Progress) -> None:
    argv = [
        "unshare", "--mount", "--propagation", "private", "--",
        "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
        SUITE, str(target), mirror,
    ]  # fmt: skip
    progress(f"debootstrap {SUITE} from {mirror} (log {log_path})")
    deadline = time.monotonic() + _DEBOOTSTRAP_TIMEOUT_S
    tail: list[str] = []
    count = 0
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log_file.write(line)
            tail = [*tail[-29:], line.rstrip()]
            if _PHASES.match(line):
                progress(line.rstrip())
            elif _PER_PACKAGE.match(line):
                count += 1
                if count % 25 == 0:  # one line per package would be hundreds
                    progress(f"{line.rstrip()} ({count} package steps so far)")
            if time.monotonic() > deadline:
                proc.kill()
        code = proc.wait()
    if code != 0:
        raise RootfsError(
            f"debootstrap {SUITE} from {mirror} failed (exit {code}); last lines:\n"
            + "\n".join(tail)
            + f"\nfull log: {log_path}"
        )


def _chroot(target: Path, *argv: str) -> None:
    done = subprocess.run(
        ["chroot", str(target), *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )
    if done.returncode != 0:
        raise RootfsError(f"`{' '.join(argv)}` failed in {target}: {done.stderr.strip()[-2000:]}")


def _finish_tree(target: Path, mirror: str) -> None:
    """Trust this machine's CAs, add the mount points both runtimes bind, slim the tree."""
    extra = target / "usr/local/share/ca-certificates"
    extra.mkdir(parents=True, exist_ok=True)
    for cert in sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt")):
        shutil.copy2(cert, extra / cert.name)
    _chroot(target, "update-ca-certificates")
    _chroot(target, "apt-get", "clean")
    for stale in (target / "var/lib/apt/lists").glob("*_*"):
        with contextlib.suppress(OSError):
            stale.unlink()
    # bind targets: bwrap creates a missing one in the tree itself, so they exist beforehand
    agent = target / AGENT_PATH.lstrip("/")
    agent.parent.mkdir(parents=True, exist_ok=True)
    agent.touch()
    (target / "run/ate").mkdir(parents=True, exist_ok=True)
    for name in ("etc/resolv.conf", "etc/hosts"):
        path = target / name
        if path.is_symlink() or not path.exists():
            path.unlink(missing_ok=True)
            path.write_text("127.0.0.1\tlocalhost\n" if name == "etc/hosts" else "")
    (target / "etc/hostname").write_text("sandbox\n")
    (target / RELEASE_FILE.lstrip("/")).write_text(
        f"NAME={ROOTFS_NAME}\nVERSION={ROOTFS_VERSION}\nSUITE={SUITE}\nMIRROR={mirror}\n"
    )


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def build_rootfs(
    base: Path | None = None, *, mirror: str | None = None, progress: Progress = _stderr
) -> BuiltRootfs:
    """Build the rootfs (or reuse a complete one) under ``base``; see the module docstring."""
    base = base or default_rootfs_dir()
    found = find_rootfs(base)
    if found is not None:
        return found
    mirror = _check_mirror_url(mirror) if mirror else debian_mirror()
    _preconditions(mirror)
    key = f"{ROOTFS_NAME}-{ROOTFS_VERSION}"
    final = base / key
    with _locked(base, progress):
        found = find_rootfs(base)
        if found is not None:  # another process built it while we waited
            return found
        for leftover in base.glob(".build-*"):
            progress(f"removing interrupted build {leftover}")
            _safe_rmtree(leftover)
        if final.exists():  # no marker: not ours to trust
            progress(f"removing incomplete {final}")
            _safe_rmtree(final)
        started = time.monotonic()
        tmp = base / f".build-{key}.{os.getpid()}"
        progress(f"building the sandbox root filesystem {key} (once per machine; a few minutes)")
        try:
            tmp.mkdir()
            _run_debootstrap(tmp, mirror, base / f".debootstrap-{key}.log", progress)
            progress("trusting this machine's CA certificates, cleaning apt caches")
            _finish_tree(tmp, mirror)
            size = _tree_bytes(tmp)
            info: dict[str, Any] = {
                "name": ROOTFS_NAME,
                "version": ROOTFS_VERSION,
                "suite": SUITE,
                "mirror": mirror,
                "packages": list(PACKAGES),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.monotonic() - started, 1),
                "size_bytes": size,
            }
            marker = tmp / MARKER
            with open(marker, "w") as fh:
                json.dump(info, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.sync()
            tmp.rename(final)
        except BaseException:
            with contextlib.suppress(Exception):
                _safe_rmtree(tmp)
            raise
    progress(f"built {final} in {info['build_seconds']} s ({size / 1e6:.0f} MB)")
    return BuiltRootfs(final, info)


def ensure_rootfs(base: Path | None = None, *, progress: Progress = _stderr) -> BuiltRootfs:
    """The rootfs, built on first use (with progress on stderr); milliseconds once built."""
    return find_rootfs(base) or build_rootfs(base, progress=progress)


def remove_rootfs(base: Path | None = None) -> list[str]:
    """Remove every built rootfs, interrupted build and agent copy under ``base``."""
    base = base or default_rootfs_dir()
    removed: list[str] = []
    if not base.is_dir():
        return removed
    with _locked(base, lambda _line: None):
        for path in sorted(base.iterdir()):
            if path.name == ".lock":
                continue
            if path.is_dir():
                _safe_rmtree(path)
            else:
                path.unlink()
            removed.append(str(path))
    return removed


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _static_build(progress: Progress) -> Path:
    return _run_build(_BUILD_SCRIPT, "static", AGENT_BINARY_ENV, progress)


def _run_build(script: Path, what: str, env_name: str, progress: Progress) -> Path:
    if not script.is_file():
        raise RootfsError(
            f"no {what} sandbox agent: set {env_name} to its path (built by "
            f"agent/build/{script.name} in a gym-substrate checkout), or opt in to the host's "
            "root filesystem with `rootfs: host`"
        )
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=_REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:  # not cached: a real build, about a minute
        progress(f"building the {what} sandbox agent ({script.relative_to(_REPO)})")
        try:
            stdout, stderr = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RootfsError(f"building the {what} sandbox agent took over 15 minutes") from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if done.returncode != 0:
        raise RootfsError(
            f"building the {what} sandbox agent failed:\n"
            + done.stderr.strip()[-3000:]
            + f"\nset {env_name} to a built one, or use `rootfs: host`"
        )
    return _REPO / done.stdout.strip().splitlines()[-1]


def agent_binary(base: Path | None = None, *, progress: Progress = _stderr) -> Path:
    """The static agent, copied to ``<base>/agent/<sha>/`` (content-addressed, so never changed
    under a golden snapshot that maps it)."""
    base = base or default_rootfs_dir()
    override = os.environ.get(AGENT_BINARY_ENV)
    source = Path(override).expanduser() if override else _static_build(progress)
    if not source.is_file() or not os.access(source, os.X_OK):
        raise RootfsError(f"{AGENT_BINARY_ENV}={source} is not an executable file")
    digest = _sha256(source)[:16]
    dest = base / "agent" / digest / "sandbox-agent"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".sandbox-agent.{os.getpid()}"
    shutil.copy2(source, tmp)
    tmp.chmod(0o755)
    tmp.replace(dest)
    return dest


def agent_form(runtime: str) -> str:
    """Which agent build the default template runs under ``runtime``: ``$GYM_SUBSTRATE_AGENT_FORM``
    if set, else the unpacked folder under gVisor (nothing unpacked into sandbox memory) and
    the static binary under the process runtime."""
    chosen = os.environ.get(AGENT_FORM_ENV, "").strip()
    if not chosen:
        return "unpacked" if runtime == "gvisor" else "static"
    if chosen not in AGENT_FORMS:
        raise RootfsError(
            f"{AGENT_FORM_ENV}={chosen!r} is not one of {', '.join(AGENT_FORMS)}; unset it for "
            "the runtime's default"
        )
    return chosen


def agent_folder(base: Path | None = None, *, progress: Progress = _stderr) -> Path:
    """The unpacked agent, copied to ``<base>/agent/u-<sha>/`` (content-addressed, so never
    changed under a golden snapshot that maps it); returns the entry ``.../sandbox-agent``."""
    from gym_substrate.local.images import content_digest

    base = base or default_rootfs_dir()
    override = os.environ.get(AGENT_DIR_ENV)
    source = (
        Path(override).expanduser()
        if override
        else _run_build(_UNPACKED_SCRIPT, "unpacked", AGENT_DIR_ENV, progress)
    )
    entry = source / "sandbox-agent"
    if not (source / "_internal").is_dir() or not os.access(entry, os.X_OK):
        raise RootfsError(
            f"{source} is not an unpacked agent build (no executable sandbox-agent beside an "
            f"_internal folder); point {AGENT_DIR_ENV} at the folder build-unpacked.sh prints"
        )
    digest = content_digest(source).removeprefix("sha256:")[:16]
    dest = base / "agent" / f"u-{digest}"
    if (dest / "sandbox-agent").is_file():
        return dest / "sandbox-agent"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".u-{digest}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, symlinks=True)
    try:
        tmp.rename(dest)
    except OSError:  # another process placed the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / "sandbox-agent"
