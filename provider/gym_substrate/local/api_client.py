"""The operator's ateapi client of a running local backend (`local templates ...`).

Templates are API resources now: `local templates add` creates one with CreateActorTemplate
over the same gRPC API a provider uses (plaintext, or TLS and the bearer token `backend.json`
names), not through an admin endpoint. Before it does, `pin_images` turns the shorthand
`local/<name>` into the digest-pinned reference the API insists on, from the backend's image
catalogue (`GET /_local/images`), and `wait_golden` follows the template's golden build until
it has a golden tag or an error message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.core.states import state_name
from gym_substrate.local.client_config import API_SERVER_NAME
from gym_substrate.local.control.records import GOLDEN_ATESPACE
from gym_substrate.local.errors import BackendError
from gym_substrate.local.images import split_reference
from gym_substrate.local.statedir import read_backend_info
from gym_substrate.local.templates import LOCAL_SANDBOX_CONFIG, TemplateError, storage_uri

__all__ = [
    "BackendApi",
    "GoldenProgress",
    "fill_local_defaults",
    "open_channel",
    "pin_images",
    "running_backend",
    "split_ref",
]

# one call's limit: CreateActorTemplate answers at once, the golden build runs afterwards
_CALL_TIMEOUT_S = 30.0
_POLL_S = 0.25

# (seconds since the template was created, what its golden actor is doing now)
GoldenProgress = Callable[[float, str], None]


def running_backend(folder: Path) -> dict[str, Any]:
    """``folder``'s running backend as `backend.json` describes it, else a BackendError that
    says how to start one."""
    info = read_backend_info(folder)
    if info is None:
        raise BackendError(
            f"no backend is running on {folder}; start it with `gym-substrate local up` (or "
            "pass the --state-dir of the one that runs)"
        )
    return info


def open_channel(info: Mapping[str, Any]) -> grpc.Channel:
    """A channel to the backend's API: plaintext, or TLS pinned to its CA (the certificate
    names only api.ate-system.svc, so the address is dialled under that name)."""
    if not info.get("tls"):
        return grpc.insecure_channel(info["api"])
    try:
        root = Path(info["ca_file"]).read_bytes()
    except OSError as exc:
        raise BackendError(
            f"cannot read the backend's CA {info.get('ca_file')!r} ({exc.strerror or exc}); "
            "restart the backend with `gym-substrate local down` and `local up --tls`"
        ) from exc
    return grpc.secure_channel(
        info["api"],
        grpc.ssl_channel_credentials(root_certificates=root),
        options=[("grpc.ssl_target_name_override", API_SERVER_NAME)],
    )


def split_ref(text: str, what: str) -> pb.ObjectRef:
    """`<atespace>/<name>` as an ObjectRef (the server checks the names themselves)."""
    atespace, slash, name = text.partition("/")
    if not slash or not atespace or not name or "/" in name:
        raise BackendError(
            f"{what} {text!r} is not <atespace>/<name>: give both, e.g. local/sandbox"
        )
    return pb.ObjectRef(atespace=atespace, name=name)


def fill_local_defaults(template: pb.ActorTemplate, folder: Path) -> list[str]:
    """Give a template what only this backend knows, where it names nothing: the snapshot
    folder of state folder ``folder`` and the one SandboxConfig; a line for each."""
    filled = []
    config = template.snapshot_config
    if not config.storage_location:
        config.storage_location = storage_uri(folder / "snapshots" / "store")
        filled.append(
            f"snapshotConfig.storageLocation not given: {config.storage_location} (the "
            "backend's own)"
        )
    if not template.HasField("sandbox_config"):
        template.sandbox_config.sandbox_class = pb.SANDBOX_CLASS_GVISOR
        template.sandbox_config.config_name = LOCAL_SANDBOX_CONFIG
        filled.append(
            f"sandboxConfig not given: {{sandboxClass: SANDBOX_CLASS_GVISOR, configName: "
            f"{LOCAL_SANDBOX_CONFIG}}} (the backend's one)"
        )
    return filled


# ------------------------------------------------------------------------------ image pinning
def _image_fields(template: pb.ActorTemplate) -> Iterator[tuple[str, Any, str]]:
    """(path, message, field) of every image reference a template holds."""
    for i, container in enumerate(template.containers):
        yield f"containers[{i}].image", container, "image"
    for i, volume in enumerate(template.volumes):
        if volume.HasField("image"):
            yield f"volumes[{i}].image.reference", volume.image, "reference"


def pin_images(
    template: pb.ActorTemplate, catalogue: Sequence[Mapping[str, str]]
) -> list[tuple[str, str, str]]:
    """Pin every `local/<name>` reference of ``template`` (in place) to the catalogue's
    digest; (path, as written, pinned) for each. A reference the backend does not have, pinned
    or not, is a TemplateError naming the field and the images it does have."""
    references = [str(i.get("reference", "")) for i in catalogue]
    known = ", ".join(sorted(references)) or "none"
    pinned: list[tuple[str, str, str]] = []
    for path, message, field in _image_fields(template):
        written = getattr(message, field)
        if not written:
            continue  # the API says it is required
        if split_reference(written) is not None:
            if written not in references:
                raise TemplateError(
                    f"{path}: image {written!r} is not on this machine (the local backend has "
                    f"no registry); known images: {known}. Add a root filesystem folder with "
                    "`gym-substrate local images add DIR --name NAME`"
                )
            continue
        repository = written.split("@", 1)[0]
        if ":" in repository.rsplit("/", 1)[-1]:
            repository = repository.rsplit(":", 1)[0]  # a tag means nothing here: no registry
        match = [r for r in references if r.split("@", 1)[0] == repository]
        if not repository.startswith("local/") or not match:
            raise TemplateError(
                f"{path}: image {written!r} is not pinned by digest and is no image of this "
                f"backend; known images: {known}. Write local/<name> (pinned for you) or a "
                "full reference, and add root filesystems with `gym-substrate local images "
                "add DIR --name NAME`"
            )
        setattr(message, field, match[0])
        pinned.append((path, written, match[0]))
    return pinned


# ------------------------------------------------------------------------------ the API
class BackendApi:
    """ateapi.Control calls on a running backend; a failed call is a BackendError naming the
    RPC, the code and the server's message (which names the field)."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        self.info = dict(info)
        self.channel = open_channel(info)
        self._token_file = info.get("token_file") or ""

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> BackendApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        if not self._token_file:
            return ()
        try:
            token = Path(self._token_file).read_text().strip()
        except OSError as exc:
            raise BackendError(
                f"cannot read the backend's token {self._token_file} ({exc.strerror or exc})"
            ) from exc
        return (("authorization", f"Bearer {token}"),)

    def call(self, method: str, request: Any, response: Any) -> Any:
        stub = self.channel.unary_unary(
            f"/ateapi.Control/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        try:
            return stub(request, timeout=_CALL_TIMEOUT_S, metadata=self._metadata())
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if code == grpc.StatusCode.UNAVAILABLE:
                raise BackendError(
                    f"the backend's API at {self.info['api']} does not answer ({details}); "
                    "check it with `gym-substrate local status`, or start it with "
                    "`gym-substrate local up`"
                ) from exc
            name = code.name if code is not None else "UNKNOWN"
            raise BackendError(f"{method} failed: {name}: {details}") from exc

    # ---------------------------------------------------------------- templates
    def create_template(self, template: pb.ActorTemplate) -> pb.ActorTemplate:
        created: pb.ActorTemplate = self.call(
            "CreateActorTemplate",
            pb.CreateActorTemplateRequest(actor_template=template),
            pb.ActorTemplate,
        )
        return created

    def get_template(self, ref: pb.ObjectRef) -> pb.ActorTemplate:
        found: pb.ActorTemplate = self.call(
            "GetActorTemplate", pb.GetActorTemplateRequest(actor_template=ref), pb.ActorTemplate
        )
        return found

    def delete_template(self, ref: pb.ObjectRef) -> pb.ActorTemplate:
        gone: pb.ActorTemplate = self.call(
            "DeleteActorTemplate",
            pb.DeleteActorTemplateRequest(actor_template=ref),
            pb.ActorTemplate,
        )
        return gone

    def list_templates(self, atespace: str = "") -> list[pb.ActorTemplate]:
        out: list[pb.ActorTemplate] = []
        token = ""
        while True:
            page = self.call(
                "ListActorTemplates",
                pb.ListActorTemplatesRequest(atespace=atespace, page_size=100, page_token=token),
                pb.ListActorTemplatesResponse,
            )
            out.extend(page.actor_templates)
            token = page.next_page_token
            if not token:
                return out

    def golden_actor_state(self, template_uid: str) -> str:
        """What the template's golden actor is doing (`RESUMING`, ...), "" when there is none."""
        try:
            actor = self.call(
                "GetActor",
                pb.GetActorRequest(actor=pb.ObjectRef(atespace=GOLDEN_ATESPACE, name=template_uid)),
                pb.Actor,
            )
        except BackendError:
            return ""
        return state_name(actor.status.state)

    def wait_golden(
        self, ref: pb.ObjectRef, *, timeout_s: float, progress: GoldenProgress | None = None
    ) -> pb.ActorTemplate:
        """Poll the template until its golden build ends (a golden tag or an error message);
        BackendError after ``timeout_s`` (the build goes on in the backend)."""
        started = time.monotonic()
        while True:
            template = self.get_template(ref)
            golden = template.status.golden_snapshot_status
            if golden.HasField("golden_tag") or golden.error_message:
                return template
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                raise BackendError(
                    f"the golden build of {ref.atespace}/{ref.name} did not end in "
                    f"{timeout_s:g} s; it goes on in the backend: follow it with `gym-substrate "
                    "local templates list`"
                )
            if progress is not None:
                progress(elapsed, self.golden_actor_state(template.metadata.uid))
            time.sleep(_POLL_S)
