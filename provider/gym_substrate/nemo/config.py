"""Provider configuration: one frozen dataclass per YAML section, validated on construction.

Gym calls `SubstrateProvider(**yaml_block)`, so every sub-key of the `substrate:` block arrives as a
keyword and is coerced here from a mapping (or a ready dataclass, or None for defaults). Errors
name the YAML path (`connection.tls.ca_file`), because the user's fix is in a YAML file, not in
Python. Nothing here touches the network or the filesystem, so a bad config fails fast and a good
one costs nothing until the first call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, cast
from urllib.parse import urlsplit

from gym_substrate.ateapi.eras import EraError, parse_era
from gym_substrate.core.names import is_dns_label, parse_ref
from gym_substrate.nemo.errors import ConfigError
from sandbox_agent.contract import DEFAULT_MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES

__all__ = [
    "ConnectionConfig",
    "CrashPolicy",
    "CreateConfig",
    "ExecConfig",
    "LifecycleConfig",
    "MetricsConfig",
    "ProviderOptions",
    "RetryConfig",
    "TLSConfig",
    "TokenConfig",
    "coerce_section",
    "default_ledger_path",
]

IdlePolicy = Literal["never", "pause", "suspend"]
PauseMode = Literal["pause", "suspend"]
CrashPolicy = Literal["fail", "revert"]

C = TypeVar("C")


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _number(
    path: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    integer: bool = False,
) -> float:
    if isinstance(value, str):  # `${oc.env:...}` always resolves to a string
        try:
            value = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            raise _fail(path, f"expected a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, f"expected a number, got {type(value).__name__} {value!r}")
    if integer and not float(value).is_integer():
        raise _fail(path, f"expected a whole number, got {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise _fail(path, f"expected a finite number, got {value!r}")
    if positive and value <= 0:
        raise _fail(path, f"must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise _fail(path, f"must be >= {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise _fail(path, f"must be <= {maximum:g}, got {value!r}")
    return float(value)


def _bool(path: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"  # `${oc.env:...}` resolves to a string
    raise _fail(path, f"expected true or false, got {value!r}")


def _string(path: str, value: Any, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"expected a string, got {type(value).__name__} {value!r}")
    if not allow_empty and not value.strip():
        raise _fail(path, "must not be empty")
    return value


def _choice(path: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(path, f"must be one of {', '.join(choices)}; got {value!r}")
    return cast(str, value)


def _template_ref(path: str, value: Any) -> str:
    text = _string(path, value)
    if parse_ref(text) is None:
        raise _fail(
            path,
            f"expected an ActorTemplate as 'atespace/name' (two DNS labels: a-z, 0-9, '-'), "
            f"got {text!r}",
        )
    return text


def _snapshot_ref(path: str, value: Any) -> str:
    text = _string(path, str(value) if _is_snapshot(value) else value)
    if parse_ref(text) is None:
        raise _fail(
            path,
            "expected a snapshot as 'atespace/tag' (two DNS labels: a-z, 0-9, '-'), as "
            f"snapshot() returns it, got {text!r}",
        )
    return text


def _is_snapshot(value: Any) -> bool:
    from gym_substrate.nemo.snapshot import SandboxSnapshot

    return isinstance(value, SandboxSnapshot)


def _atespace(path: str, value: Any) -> str:
    text = _string(path, value)
    if not is_dns_label(text):
        raise _fail(path, f"an atespace must be a DNS-1123 label (a-z, 0-9, '-'), got {text!r}")
    return text


def coerce_section(cls: type[C], value: Any, path: str) -> C:
    """Build section `cls` from a dataclass instance, a mapping, or None (all defaults)."""
    if isinstance(value, cls):
        return value
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise _fail(path, f"expected a mapping, got {type(value).__name__} {value!r}")
    names = [f.name for f in fields(cast(Any, cls)) if f.init and not f.name.startswith("_")]
    unknown = sorted(str(k) for k in value if k not in names)
    if unknown:
        raise _fail(
            path,
            f"unknown key(s) {', '.join(unknown)}; allowed keys: {', '.join(names)}",
        )
    kwargs = dict(value)
    kwargs["_path"] = path
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required key is missing
        missing = [
            f.name
            for f in fields(cast(Any, cls))
            if f.name in names
            and f.name not in value
            and f.default is MISSING
            and f.default_factory is MISSING
        ]
        raise _fail(path, f"missing required key(s): {', '.join(missing)}") from exc


@dataclass(frozen=True)
class TokenConfig:
    """Bearer token for ateapi in jwt mode: exactly one of `file`, `env`, `value`.

    A `file` is re-read on every call, so a projected service-account token can rotate.
    """

    file: str | None = None
    env: str | None = None
    value: str | None = field(default=None, repr=False)
    _path: str = field(default="connection.token", repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [k for k in ("file", "env", "value") if getattr(self, k) is not None]
        if len(given) != 1:
            raise _fail(self._path, "set exactly one of file, env or value")
        for key in given:
            _string(f"{self._path}.{key}", getattr(self, key))

    def read(self) -> str:
        """Return the current token (re-reading the file or environment each time)."""
        if self.file is not None:
            return Path(self.file).read_text().strip()
        if self.env is not None:
            token = os.environ.get(self.env)
            if not token:
                raise ConfigError(f"{self._path}.env: environment variable {self.env} is not set")
            return token.strip()
        return cast(str, self.value).strip()


@dataclass(frozen=True)
class TLSConfig:
    """How to verify ateapi: a pinned CA (`ca_file` or `ca_pem`) or `plaintext` (local backend)."""

    ca_file: str | None = None
    ca_pem: str | None = field(default=None, repr=False)
    server_name: str = "api.ate-system.svc"
    plaintext: bool = False
    _path: str = field(default="connection.tls", repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plaintext", _bool(f"{self._path}.plaintext", self.plaintext))
        if self.ca_file is not None and self.ca_pem is not None:
            raise _fail(self._path, "set ca_file or ca_pem, not both")
        if self.plaintext and (self.ca_file is not None or self.ca_pem is not None):
            raise _fail(self._path, "plaintext: true cannot be combined with ca_file or ca_pem")
        if self.ca_file is not None:
            _string(f"{self._path}.ca_file", self.ca_file)
            if not os.path.isfile(self.ca_file):
                raise _fail(
                    f"{self._path}.ca_file",
                    f"no such file: {self.ca_file!r}; point it at ateapi's CA bundle (PEM)",
                )
        if self.ca_pem is not None and "BEGIN CERTIFICATE" not in _string(
            f"{self._path}.ca_pem", self.ca_pem
        ):
            raise _fail(
                f"{self._path}.ca_pem", "expected a PEM block (-----BEGIN CERTIFICATE-----)"
            )
        _string(f"{self._path}.server_name", self.server_name)


@dataclass(frozen=True)
class ConnectionConfig:
    """Where Substrate is: ateapi (gRPC) and the router (HTTP); hashable, it keys shared pools."""

    api: str
    router: str
    atespace: str = "gym"
    tls: TLSConfig = field(default_factory=TLSConfig)
    token: TokenConfig | None = None
    request_timeout_s: float = 30.0
    # How long an ateapi that refuses connections is waited for: at first contact (a backend
    # still starting; then the error names the key to fix) and in connect()/status() (a restart).
    connect_timeout_s: float = 10.0
    # The server's ateapi era (v0.3, v0.4, current): "auto" reads it from the server's own
    # descriptors (gRPC reflection); a named era must agree with them, and decides alone where
    # reflection is refused (docs/compatibility.md).
    api_era: str = "auto"
    _path: str = field(default="connection", repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self._path
        api = _string(f"{p}.api", self.api)
        host, sep, port = api.rpartition(":")
        if "://" in api or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _fail(
                f"{p}.api", f"expected host:port of ateapi (e.g. 127.0.0.1:7443), got {api!r}"
            )
        router = _string(f"{p}.router", self.router).rstrip("/")
        parts = urlsplit(router)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise _fail(
                f"{p}.router", f"expected an http(s) URL of the router, got {self.router!r}"
            )
        object.__setattr__(self, "router", router)
        _atespace(f"{p}.atespace", self.atespace)
        object.__setattr__(self, "tls", coerce_section(TLSConfig, self.tls, f"{p}.tls"))
        if self.token is not None:
            object.__setattr__(self, "token", coerce_section(TokenConfig, self.token, f"{p}.token"))
        object.__setattr__(
            self,
            "request_timeout_s",
            _number(f"{p}.request_timeout_s", self.request_timeout_s, positive=True),
        )
        object.__setattr__(
            self,
            "connect_timeout_s",
            _number(f"{p}.connect_timeout_s", self.connect_timeout_s, positive=True),
        )
        era = _string(f"{p}.api_era", self.api_era)
        if era != "auto":
            try:
                era = parse_era(era)
            except EraError as exc:
                raise _fail(f"{p}.api_era", f"{exc} (or auto: read it from the server)") from None
        object.__setattr__(self, "api_era", era)


@dataclass(frozen=True)
class RetryConfig:
    """Backoff for control-plane calls: full-jitter exponential, capped, under a deadline."""

    initial: float = 0.2
    maximum: float = 2.0
    multiplier: float = 2.0
    deadline: float = 60.0
    _path: str = field(default="create.retry", repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self._path
        for key in ("initial", "maximum", "deadline"):
            object.__setattr__(self, key, _number(f"{p}.{key}", getattr(self, key), positive=True))
        object.__setattr__(
            self, "multiplier", _number(f"{p}.multiplier", self.multiplier, minimum=1.0)
        )
        if self.maximum < self.initial:
            raise _fail(
                f"{p}.maximum", f"must be >= initial ({self.initial:g}), got {self.maximum:g}"
            )


@dataclass(frozen=True)
class CreateConfig:
    """How sandboxes are made: which ActorTemplate (`atespace/name`), and how long to wait."""

    template: str = "default/sandbox"
    image_templates: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 120.0
    retry: RetryConfig = field(default_factory=RetryConfig)
    _path: str = field(default="create", repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self._path
        _template_ref(f"{p}.template", self.template)
        if not isinstance(self.image_templates, Mapping):
            raise _fail(f"{p}.image_templates", "expected a mapping of image -> atespace/name")
        mapping: dict[str, str] = {}
        for image, ref in self.image_templates.items():
            key = _string(f"{p}.image_templates", image)
            mapping[key] = _template_ref(f"{p}.image_templates[{key!r}]", ref)
        object.__setattr__(self, "image_templates", mapping)
        object.__setattr__(
            self,
            "ready_timeout_s",
            _number(f"{p}.ready_timeout_s", self.ready_timeout_s, positive=True),
        )
        object.__setattr__(self, "retry", coerce_section(RetryConfig, self.retry, f"{p}.retry"))


@dataclass(frozen=True)
class ExecConfig:
    """Command execution and file transfer through the agent's job API."""

    default_timeout_s: float = 180.0
    poll_wait_s: float = 8.0
    shell: str = "/bin/sh"
    concurrency: int = 64
    timeout_margin_s: float = 5.0
    transfer_chunk_bytes: int = 8 * 1024 * 1024
    # Per stream; beyond it the agent keeps head and tail around a marker line and the provider
    # says so in stderr and the log. At most the agent's 64 MiB.
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    _path: str = field(default="exec", repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self._path
        object.__setattr__(
            self,
            "default_timeout_s",
            _number(f"{p}.default_timeout_s", self.default_timeout_s, positive=True),
        )
        object.__setattr__(
            self,
            "poll_wait_s",
            _number(f"{p}.poll_wait_s", self.poll_wait_s, minimum=0.0, maximum=8.0),
        )
        shell = _string(f"{p}.shell", self.shell)
        if not shell.startswith("/"):
            raise _fail(f"{p}.shell", f"must be an absolute path, got {shell!r}")
        object.__setattr__(
            self,
            "concurrency",
            int(_number(f"{p}.concurrency", self.concurrency, minimum=1, integer=True)),
        )
        object.__setattr__(
            self,
            "timeout_margin_s",
            _number(f"{p}.timeout_margin_s", self.timeout_margin_s, minimum=0.0),
        )
        object.__setattr__(
            self,
            "transfer_chunk_bytes",
            int(
                _number(
                    f"{p}.transfer_chunk_bytes",
                    self.transfer_chunk_bytes,
                    minimum=64 * 1024,
                    maximum=64 * 1024 * 1024,
                    integer=True,
                )
            ),
        )
        object.__setattr__(
            self,
            "max_output_bytes",
            int(
                _number(
                    f"{p}.max_output_bytes",
                    self.max_output_bytes,
                    minimum=0,
                    maximum=MAX_OUTPUT_BYTES,
                    integer=True,
                )
            ),
        )


def default_ledger_path() -> str:
    """`$XDG_STATE_HOME/gym-substrate/ledger.jsonl` (or `~/.local/state/...`)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "gym-substrate", "ledger.jsonl")


@dataclass(frozen=True)
class LifecycleConfig:
    """What happens between calls and at the end: idle parking, crashes, ledger, time to live.

    `on_crash`: `fail` reports a CRASHED sandbox (exec results say so, status() is ERROR);
    `revert` takes it back to its last durable snapshot (RevertActor) and resumes it.
    """

    idle_policy: IdlePolicy = "never"
    idle_after_s: float = 5.0
    on_crash: CrashPolicy = "fail"
    ledger: str | None = field(default_factory=default_ledger_path)
    ttl_s: float | None = None
    close_timeout_s: float = 60.0
    # Snapshots live until deleted unless this is set: a checkpoint's life is its taker's call,
    # never the actors' ttl_s (sweep would otherwise delete a checkpoint behind its back).
    snapshot_ttl_s: float | None = None
    _path: str = field(default="lifecycle", repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self._path
        _choice(f"{p}.idle_policy", self.idle_policy, ("never", "pause", "suspend"))
        _choice(f"{p}.on_crash", self.on_crash, ("fail", "revert"))
        object.__setattr__(
            self, "idle_after_s", _number(f"{p}.idle_after_s", self.idle_after_s, positive=True)
        )
        if self.ledger is not None:
            object.__setattr__(
                self, "ledger", os.path.expanduser(_string(f"{p}.ledger", self.ledger))
            )
        for key in ("ttl_s", "snapshot_ttl_s"):
            if getattr(self, key) is not None:
                value = _number(f"{p}.{key}", getattr(self, key), positive=True)
                object.__setattr__(self, key, value)
        object.__setattr__(
            self,
            "close_timeout_s",
            _number(f"{p}.close_timeout_s", self.close_timeout_s, positive=True),
        )


@dataclass(frozen=True)
class MetricsConfig:
    """Opt-in Prometheus endpoint; `port: null` (the default) serves nothing."""

    port: int | None = None
    host: str = "127.0.0.1"
    _path: str = field(default="metrics", repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.port is not None:
            object.__setattr__(
                self,
                "port",
                int(
                    _number(f"{self._path}.port", self.port, minimum=0, maximum=65535, integer=True)
                ),
            )
        _string(f"{self._path}.host", self.host)


@dataclass(frozen=True)
class ProviderOptions:
    """`SandboxSpec.provider_options` accepted by this provider."""

    template: str | None = None
    atespace: str | None = None
    # A snapshot (`atespace/tag`) to start from instead of the template's golden snapshot.
    from_snapshot: str | None = None
    # The same, under the key NeMo Gym's session checkpointer restores with.
    snapshot_id: str | None = None
    # Accepted for Gym's stock configs (an OpenSandbox option); an actor gets its worker pool's
    # resources, so it is ignored with one warning per process.
    resource_requests: Mapping[str, Any] | None = None

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> ProviderOptions:
        if not options:
            return cls()
        if not isinstance(options, Mapping):
            raise TypeError(f"provider_options must be a mapping, got {type(options).__name__}")
        allowed = ("atespace", "from_snapshot", "resource_requests", "snapshot_id", "template")
        unknown = sorted(str(k) for k in options if k not in allowed)
        if unknown:
            raise ValueError(
                f"Unknown substrate provider_options key(s): {', '.join(unknown)}. "
                f"Expected keys: {', '.join(allowed)}"
            )
        template = options.get("template")
        atespace = options.get("atespace")
        if template is not None:
            _template_ref("provider_options.template", template)
        if atespace is not None:
            _atespace("provider_options.atespace", atespace)
        snapshot = options.get("from_snapshot")
        if snapshot is not None:
            snapshot = _snapshot_ref("provider_options.from_snapshot", snapshot)
        snapshot_id = options.get("snapshot_id")
        if snapshot_id is not None:
            snapshot_id = _snapshot_ref("provider_options.snapshot_id", snapshot_id)
        requests = options.get("resource_requests")
        if requests is not None and not isinstance(requests, Mapping):
            raise TypeError(
                "provider_options.resource_requests must be a mapping (e.g. {cpu: 2}), got "
                f"{type(requests).__name__}"
            )
        return cls(
            template=template,
            atespace=atespace,
            from_snapshot=snapshot,
            snapshot_id=snapshot_id,
            resource_requests=requests,
        )
