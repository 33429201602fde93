"""The offline tool folder: what install-tools installs on a host that cannot download anything.

`gym-substrate infra tools-bundle --out DIR` fills the folder on a connected machine of the
host's Debian release and architecture; `gym-substrate:tools.offlineDir` points a host stack at
it. The stack copies it to the host over SFTP, and install-tools installs from that copy: the
.debs as a flat apt repository named only on apt's command line (no file under /etc/apt, no
apt list left behind), the binaries from `bin/` and Go from `go/`.

Layout::

    bundle.json           {"format": 1, "arch": ..., "packages": [...], "tools": {...}}
    debs/*.deb, debs/Packages   every package install-tools names and its dependencies
    bin/kind, bin/kubectl, bin/ko
    go/bin/go             the Go tree that becomes /usr/local/go
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gym_substrate.core.errors import ConfigError

__all__ = [
    "BINARIES",
    "FORMAT",
    "MANIFEST",
    "check_bundle",
    "make_bundle",
    "manifest_hash",
    "packages_index",
]

FORMAT = 1
MANIFEST = "bundle.json"
BINARIES = ("kind", "kubectl", "ko")
_MAKE = (
    "make it on a connected machine with "
    "`gym-substrate infra tools-bundle --stack-file <stack> --out <dir>`"
)


def manifest_hash(path: Path) -> str:
    """What re-copies the folder to the host: its manifest changes with any rebuild."""
    try:
        return hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return ""


def _names(specs: Iterable[str]) -> list[str]:
    """apt specs (`docker.io=24.0.5+dfsg1-1`) to package names."""
    return [s.split("=", 1)[0] for s in specs]


def check_bundle(
    path: Path, *, packages: Iterable[str], tools: Mapping[str, str], arch: str | None = None
) -> dict[str, object]:
    """The bundle's manifest, once every file install-tools needs is there and its versions are
    the stack's; otherwise a ConfigError naming what is missing and how to make it."""
    key = "gym-substrate:tools.offlineDir"
    if not path.is_dir():
        raise ConfigError(f"{key}: {path} is not a folder. Fix: {_MAKE}")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{key}: {path / MANIFEST} is missing or unreadable ({exc}). Fix: {_MAKE}"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ConfigError(f"{key}: {path / MANIFEST} is not a format-{FORMAT} bundle. Fix: {_MAKE}")
    problems: list[str] = []
    if arch is not None and manifest.get("arch") != arch:
        problems.append(f"it is for {manifest.get('arch')!r}, the host needs {arch!r}")
    have = set(manifest.get("packages") or [])
    lacking = [p for p in _names(packages) if p not in have]
    if lacking:
        problems.append(f"packages not in it: {', '.join(lacking)}")
    if not (path / "debs" / "Packages").is_file():
        problems.append("debs/Packages (the apt index) is missing")
    for tool in BINARIES:
        if not os.access(path / "bin" / tool, os.X_OK):
            problems.append(f"bin/{tool} is missing or not executable")
    if not os.access(path / "go" / "bin" / "go", os.X_OK):
        problems.append("go/bin/go (the Go tree) is missing")
    raw_tools = manifest.get("tools")
    versions: dict[str, object] = raw_tools if isinstance(raw_tools, dict) else {}
    for tool, want in tools.items():
        got = versions.get(tool)
        if str(got).lstrip("v") != want.lstrip("v"):
            problems.append(f"{tool} is {got!r}, the stack pins {want!r}")
    if problems:
        raise ConfigError(
            f"{key}: the tool folder {path} is incomplete: {'; '.join(problems)}. Fix: {_MAKE}"
        )
    return manifest


def _control(deb: Path) -> str:
    out = subprocess.run(
        ["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True
    )
    return out.stdout.rstrip("\n")


def packages_index(debs: Path) -> str:
    """A flat repository's `Packages`: each .deb's control fields plus where and what it is."""
    stanzas = []
    for deb in sorted(debs.glob("*.deb")):
        data = deb.read_bytes()
        stanzas.append(
            f"{_control(deb)}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    return "\n".join(stanzas)


def _closure(packages: list[str]) -> list[str]:
    """The packages and everything they depend on (no recommends), as apt on this machine sees
    them: the whole closure, so a clean minimal host of the same release lacks none."""
    out = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise ConfigError(f"apt-cache depends {' '.join(packages)} failed: {out.stderr.strip()}")
    names = {line.strip() for line in out.stdout.splitlines() if not line.startswith(" ")}
    return sorted(n for n in names if n and not n.startswith("<"))


def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=120) as response, dest.open("wb") as f:  # noqa: S310
        shutil.copyfileobj(response, f)


def _fetch_binaries(work: Path, tools: Mapping[str, str], arch: str) -> dict[str, Path]:
    """kind, kubectl, ko and the Go tree from their release downloads."""
    kind, kubectl = work / "kind", work / "kubectl"
    _download(f"https://kind.sigs.k8s.io/dl/{tools['kind']}/kind-linux-{arch}", kind)
    _download(f"https://dl.k8s.io/release/{tools['kubectl']}/bin/linux/{arch}/kubectl", kubectl)
    ko_v = tools["ko"].lstrip("v")
    ko_arch = {"amd64": "x86_64", "arm64": "arm64"}.get(arch, arch)
    ko_tgz = work / "ko.tgz"
    _download(
        f"https://github.com/ko-build/ko/releases/download/v{ko_v}/ko_{ko_v}_Linux_{ko_arch}.tar.gz",
        ko_tgz,
    )
    with tarfile.open(ko_tgz) as tar:
        tar.extract("ko", work, filter="data")
    go_tgz = work / "go.tgz"
    _download(f"https://go.dev/dl/go{tools['go'].lstrip('v')}.linux-{arch}.tar.gz", go_tgz)
    with tarfile.open(go_tgz) as tar:
        tar.extractall(work, filter="data")
    return {"kind": kind, "kubectl": kubectl, "ko": work / "ko", "go": work / "go"}


def make_bundle(
    out: Path,
    *,
    packages: list[str],
    tools: Mapping[str, str],
    binaries: Mapping[str, Path] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, object]:
    """Fill `out`: apt-get download of `packages` and their closure, the binaries (downloaded,
    or the local files in `binaries`: kind/kubectl/ko files, `go` a Go tree), the manifest."""
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    debs = out / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    closure = _closure(_names(packages))
    progress(f"apt-get download: {len(closure)} packages")
    pinned = {s.split("=", 1)[0]: s for s in packages if "=" in s}
    got = subprocess.run(
        ["apt-get", "download", *(pinned.get(n, n) for n in closure)],
        cwd=debs, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if got.returncode != 0:
        raise ConfigError(f"apt-get download failed: {got.stderr.strip()[-2000:]}")
    (debs / "Packages").write_text(packages_index(debs))
    with tempfile.TemporaryDirectory() as tmp:
        given = dict(binaries or {})
        if set(given) != {*BINARIES, "go"}:
            progress("downloading kind, kubectl, ko and Go")
            given = {**_fetch_binaries(Path(tmp), tools, arch), **given}
        (out / "bin").mkdir(exist_ok=True)
        for tool in BINARIES:
            shutil.copy(given[tool], out / "bin" / tool)
            (out / "bin" / tool).chmod(0o755)
        shutil.rmtree(out / "go", ignore_errors=True)
        shutil.copytree(given["go"], out / "go", symlinks=True)
    manifest: dict[str, object] = {
        "format": FORMAT,
        "arch": arch,
        "packages": closure,
        "tools": dict(tools),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
