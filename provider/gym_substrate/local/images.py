"""The local backend's images: what a template's digest-pinned references resolve to here.

Substrate pulls OCI images by digest; this machine has no registry. So the backend keeps a
small catalogue of what it can run, each entry under a reference of the upstream form
`<repository>@sha256:<64 hex>`:

- `local/debian-bookworm@sha256:...`: the Debian root filesystem `rootfs.py` builds (its digest
  is that of the build's marker file, which records when and from what it was built);
- `local/sandbox-agent@sha256:...`: a folder holding the static sandbox agent, the digest that
  of the binary. A template mounts it as an image volume, so the workload image runs untouched;
- `local/host@sha256:...`: the host's own `/`, read-only (an explicit opt-in; the digest is of
  this machine's id, not of its contents);
- images an operator adds with `gym-substrate local images add DIR --name NAME` (the digest is
  of the tree's listing: paths, modes, sizes and modification times).

A template names images as upstream does; what is not in the catalogue fails the template's
golden build, as an image that cannot be pulled fails it on a cluster.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "AGENT_IMAGE",
    "DEBIAN_IMAGE",
    "HOST_IMAGE",
    "ImageCatalogue",
    "ImageError",
    "LocalImage",
    "content_digest",
    "split_reference",
    "tree_digest",
]

DEBIAN_IMAGE = "local/debian-bookworm"
AGENT_IMAGE = "local/sandbox-agent"
HOST_IMAGE = "local/host"
_REPOSITORY = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ImageError(ValueError):
    """An image that cannot be registered or resolved; the message says what to do."""


@dataclass(frozen=True)
class LocalImage:
    repository: str
    digest: str  # "sha256:<hex>"
    kind: Literal["rootfs", "host", "files"]
    path: Path | None  # the tree (rootfs), or the folder whose files are the image (files)

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


def split_reference(reference: str) -> tuple[str, str] | None:
    """`(repository, digest)` of `repo[:tag]@sha256:<hex>`; None when not pinned by digest."""
    name, at, digest = reference.partition("@")
    if not at or not _DIGEST.fullmatch(digest):
        return None
    repository = name.split(":", 1)[0] if "/" not in name.rsplit(":", 1)[-1] else name
    return repository, digest


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def content_digest(root: Path) -> str:
    """A digest of a folder's files (relative path, mode bits and bytes of each, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        digest.update(f"{rel}\0{path.stat().st_mode & 0o777}\0".encode())
        digest.update(_sha256_file(path).encode() + b"\n")
    return "sha256:" + digest.hexdigest()


def tree_digest(root: Path) -> str:
    """A digest of a folder's listing (path, mode, size, mtime of each entry, sorted)."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            rel = path.relative_to(root).as_posix()
            digest.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "sha256:" + digest.hexdigest()


def _machine_digest() -> str:
    for source in (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")):
        try:
            ident = source.read_text().strip()
        except OSError:
            continue
        if ident:
            return "sha256:" + hashlib.sha256(f"host-rootfs:{ident}".encode()).hexdigest()
    return "sha256:" + hashlib.sha256(f"host-rootfs:{os.uname().nodename}".encode()).hexdigest()


class ImageCatalogue:
    """The images a backend can run; operator-added ones persist in ``<state>/images.json``."""

    def __init__(self, state_dir: Path) -> None:
        self._file = state_dir / "images.json"
        self._images: dict[str, LocalImage] = {}
        self.add(LocalImage(HOST_IMAGE, _machine_digest(), "host", None))
        for entry in self._stored():
            self.add(
                LocalImage(entry["repository"], entry["digest"], "rootfs", Path(entry["path"]))
            )

    def _stored(self) -> list[Mapping[str, str]]:
        try:
            data = json.loads(self._file.read_text())
        except (OSError, ValueError):
            return []
        return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []

    def __iter__(self) -> Iterator[LocalImage]:
        return iter(sorted(self._images.values(), key=lambda i: i.reference))

    def add(self, image: LocalImage) -> LocalImage:
        self._images[image.reference] = image
        return image

    def add_rootfs_build(self, tree: Path, marker: Path) -> LocalImage:
        """The Debian rootfs `rootfs.py` built (identified by its build marker)."""
        return self.add(LocalImage(DEBIAN_IMAGE, _sha256_file(marker), "rootfs", tree))

    def add_agent(self, binary: Path) -> LocalImage:
        """The agent; its image is the folder holding it (content-addressed already): the static
        binary alone, or the unpacked build (the entry beside its ``_internal`` folder)."""
        folder = binary.parent
        if (folder / "_internal").is_dir():
            return self.add(LocalImage(AGENT_IMAGE, content_digest(folder), "files", folder))
        return self.add(LocalImage(AGENT_IMAGE, _sha256_file(binary), "files", folder))

    def register_tree(self, name: str, tree: Path) -> LocalImage:
        """An operator's root filesystem folder, as `local/<name>@sha256:...` (persisted)."""
        if not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*", name):
            raise ImageError(
                f"image name {name!r} is not valid: use lowercase letters, digits and single "
                "'.', '_' or '-' between them, e.g. 'python-3-12'"
            )
        tree = tree.expanduser().resolve()
        if not tree.is_dir():
            raise ImageError(f"{tree} is not a folder: give the image's root filesystem folder")
        for needed in ("bin", "usr"):
            if not (tree / needed).exists():
                raise ImageError(
                    f"{tree} has no /{needed}: it does not look like a root filesystem (build "
                    "one with debootstrap, or unpack an image's layers into a folder)"
                )
        image = LocalImage(f"local/{name}", tree_digest(tree), "rootfs", tree)
        entries = [e for e in self._stored() if e.get("repository") != image.repository]
        entries.append({"repository": image.repository, "digest": image.digest, "path": str(tree)})
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(self._file)
        self._images = {k: v for k, v in self._images.items() if v.repository != image.repository}
        return self.add(image)

    def resolve(self, reference: str) -> LocalImage:
        """The image pinned by ``reference`` (the repository and digest must both match)."""
        parts = split_reference(reference)
        if parts is not None:
            for image in self._images.values():
                if (image.repository, image.digest) == parts:
                    return image
        known = ", ".join(i.reference for i in self) or "none"
        raise ImageError(
            f"image {reference!r} is not on this machine (the local backend has no registry); "
            f"known images: {known}. Add a root filesystem folder with `gym-substrate local "
            "images add DIR --name NAME`"
        )

    def latest(self, repository: str) -> LocalImage | None:
        """The image of ``repository`` (the CLI's shorthand for an unpinned name)."""
        return next((i for i in self._images.values() if i.repository == repository), None)
