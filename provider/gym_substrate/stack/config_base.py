"""The stack config's reading machinery: one section at a time, every error naming its key.

`_Section` reads one mapping of `Pulumi.<stack>.yaml` and remembers which keys it consumed, so
`done()` can name an unknown key (a typo) with the keys that are known there. The value helpers
below check one kind of value each (a digest-pinned image, a Kubernetes quantity, a DNS label,
...) and raise `ConfigError("gym-substrate:<path>: <problem>. Fix: <fix>")`. `config` builds the
frozen `StackConfig` out of these; nothing here imports Pulumi.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gym_substrate.core.errors import ConfigError
from gym_substrate.core.names import is_dns_label

__all__ = [
    "ADDRESS",
    "COMMIT",
    "PINNED",
    "PROJECT",
    "ConfigError",
    "Section",
    "digest_image",
    "env",
    "fail",
    "host_key",
    "key",
    "label",
    "node_port",
    "offline_dir",
    "quantity",
    "quantity_value",
    "refuse",
    "version",
    "versioned_image",
    "workdir",
]

PROJECT = "gym-substrate"

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# A whole image reference pinned by digest: a name without spaces or `@`, then the digest.
PINNED = re.compile(r"^[a-z0-9][^\s@]*@sha256:[0-9a-f]{64}$")
# A node's DNS name or IPv4 address, or a bracketed IPv6 address: what providerConfig dials.
ADDRESS = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HOST_KEY = re.compile(
    r"^(ssh-[a-z0-9-]+|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.-]+) [A-Za-z0-9+/]+={0,2}$"
)
_VERSION = re.compile(r"^v?[0-9]+\.[0-9]+\.[0-9]+([-+.][0-9A-Za-z.-]+)?$")


def key(path: str) -> str:
    return f"{PROJECT}:{path}"


def fail(path: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{key(path)}: {problem}. Fix: {fix}")


def host_key(section: Section) -> str | None:
    value = section.opt_string("hostKey")
    if value is None:
        return None
    # A known_hosts line may start with the host name(s): keep the key type and blob only.
    words = value.split()
    if len(words) >= 3 and not _HOST_KEY.match(" ".join(words[:2])):
        words = words[1:]
    key = " ".join(words[:2])
    if not _HOST_KEY.match(key):
        raise fail(
            section.sub("hostKey"),
            f"{value[:60]!r} is not an SSH host key",
            "paste the host's line from `ssh-keyscan -t ed25519 <host>` "
            "(`ssh-ed25519 AAAA...`), or remove the key to record the one the host shows at "
            "the first `pulumi up`",
        )
    return key


class Section:
    """Reads one mapping section, remembering which keys were consumed."""

    def __init__(self, path: str, raw: object) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise fail(
                path,
                f"expected a mapping, got {type(raw).__name__}",
                f"write `{path}:` as a YAML mapping of keys",
            )
        self.path = path
        self.raw: Mapping[str, Any] = raw
        self.used: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = None, *, required: bool = False, fix: str = "") -> Any:
        self.used.add(key)
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise fail(
                    self.sub(key),
                    "is required but missing",
                    fix or f"set `{self.sub(key)}` in the stack file",
                )
            return default
        return self.raw[key]

    def string(
        self, key: str, default: str | None = None, *, required: bool = False, fix: str = ""
    ) -> str:
        value = self.get(key, default, required=required, fix=fix)
        if not isinstance(value, str) or not value:
            raise fail(
                self.sub(key),
                f"expected a non-empty string, got {value!r}",
                fix or f"set `{self.sub(key)}` to a string",
            )
        return value

    def opt_string(self, key: str) -> str | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise fail(
                self.sub(key),
                f"expected a non-empty string, got {value!r}",
                f"set `{self.sub(key)}` to a string or remove it",
            )
        return value

    def integer(self, key: str, default: int, lo: int, hi: int) -> int:
        value = self.get(key, default)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise fail(
                self.sub(key),
                f"expected an integer in [{lo}, {hi}], got {value!r}",
                f"set `{self.sub(key)}` to a whole number between {lo} and {hi}",
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if isinstance(value, str) and value.lower() in {"true", "false"}:
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise fail(
                self.sub(key),
                f"expected true or false, got {value!r}",
                f"set `{self.sub(key)}` to true or false",
            )
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.get(key, default)
        if value not in choices:
            raise fail(
                self.sub(key),
                f"unknown value {value!r}",
                f"set `{self.sub(key)}` to one of: {', '.join(choices)}",
            )
        return str(value)

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            where = self.sub(unknown[0])
            raise fail(
                where,
                "is not a known key",
                f"remove it or correct the spelling; known keys under "
                f"`{self.path or 'the project'}`: {', '.join(sorted(self.used))}",
            )


def digest_image(
    section: Section,
    key: str,
    default: str | None = None,
    *,
    required: bool = False,
    fix: str = "",
) -> str:
    value = section.string(key, default, required=required, fix=fix)
    if not _DIGEST.search(value) or not PINNED.match(value):
        problem = (
            f"{value!r} is not `<name>@sha256:<64 lower-case hex>`"
            if "@" in value
            else f"{value!r} is a tag, but a digest is required"
        )
        raise fail(
            section.sub(key),
            problem,
            "pin it as `<image>@sha256:<64 hex>` (get the digest with "
            "`docker buildx imagetools inspect <image>`)",
        )
    return value


def versioned_image(section: Section, key: str, default: str) -> str:
    """Images that may be a digest or an exact version tag, never `latest` or no tag."""
    value = section.string(key, default)
    if _DIGEST.search(value):
        return value
    name, _, tag = value.rpartition(":")
    if not name or "/" in tag or tag == "latest" or not re.search(r"[0-9]", tag):
        raise fail(
            section.sub(key),
            f"{value!r} is not pinned",
            "use an exact version tag (e.g. `:v3.5.3`) or `@sha256:<digest>`",
        )
    return value


def quantity(section: Section, key: str, default: str) -> str:
    value = section.get(key, default)
    value = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(value, str) or not _QUANTITY.match(value):
        raise fail(
            section.sub(key),
            f"{value!r} is not a Kubernetes quantity",
            f"write it like `1`, `500m`, `4Gi` for `{section.sub(key)}`",
        )
    return value


def label(section: Section, key: str, default: str) -> str:
    value = section.string(key, default)
    if not is_dns_label(value):
        raise fail(
            section.sub(key),
            f"{value!r} is not a DNS-1123 label",
            "use lower-case letters, digits and '-', at most 63 characters",
        )
    return value


def node_port(section: Section, key: str, default: int) -> int:
    return section.integer(key, default, 30000, 32767)


_SUFFIX = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}


def quantity_value(q: str) -> float:
    """A Kubernetes quantity (as `quantity` accepted it) as a plain number."""
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    return float(q)


def refuse(section: Section, name: str, problem: str, fix: str) -> None:
    """A key that is no longer read (renamed or moved): name it and say what replaced it."""
    if name in section.raw:
        raise fail(section.sub(name), problem, fix)
    section.used.discard(name)


def workdir(section: Section) -> str:
    value = section.string("workdir", "~/.gym-substrate")
    if not (value.startswith("/") or value == "~" or value.startswith("~/")) or any(
        c in value for c in "\"'$`\\ \n"
    ):
        raise fail(
            section.sub("workdir"),
            f"{value!r} is not an absolute or ~/ path without quotes, spaces or `$`",
            "use e.g. `~/.gym-substrate` or `/var/lib/gym-substrate`",
        )
    return value


def offline_dir(section: Section) -> str | None:
    value = section.opt_string("offlineDir")
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute() or any(c in value for c in "\"'$`\\ \n") or path.name in {"", "."}:
        raise fail(
            section.sub("offlineDir"),
            f"{value!r} is not an absolute or ~/ path of a folder without quotes, spaces or `$`",
            "point it at the folder `gym-substrate infra tools-bundle --out <dir>` filled, "
            "e.g. `~/gym-substrate-tools`",
        )
    return str(path)


def version(section: Section, key: str, default: str) -> str:
    value = section.string(key, default)
    if not _VERSION.match(value):
        raise fail(
            section.sub(key),
            f"{value!r} is not an exact version",
            "pin an exact release such as `v0.32.0` or `1.26.3`",
        )
    return value


def env(section: Section, key: str) -> tuple[tuple[str, str], ...]:
    value = section.get(key, {})
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and re.match(r"^[ -<>-~]+$", k) and isinstance(v, str | int | float)
        for k, v in value.items()
    ):
        raise fail(
            section.sub(key),
            f"expected a mapping of NAME: value, got {value!r}",
            "write env as `{NAME: value}` with printable names without '='",
        )
    return tuple((str(k), str(v)) for k, v in value.items())
