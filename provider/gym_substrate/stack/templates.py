"""ActorTemplates and their atespace as Pulumi resources, through ateapi (our dynamic provider).

Templates are API resources now (there is no ActorTemplate CRD) and immutable (no update RPC).
`ActorTemplate` therefore:

- create: CreateActorTemplate with the stack's TLS and token settings, in the wire of the
  server's era (`era`: the era the config expects and why; the era spoken is the `apiEra`
  output; `stack/api_era.py`), then waits for the golden
  tag; a failed golden build fails `up` with the template's `error_message` (and deletes the
  template it made, so nothing is left behind);
- diff: any change to the template is a replace. The name carries a hash of the content
  (`objects.template_name`), so Pulumi's default replace order is exactly create-new, switch
  the outputs (the `ref` every consumer reads, providerConfig included), delete-old. A changed
  connection (a rotated CA or token) is an update that calls nothing;
- delete: DeleteActorTemplate (already gone is fine).

`Atespace` creates the templates' atespace unless it exists, and deletes it at destroy only if it
created it. On a borrowed host the API answers on the host's loopback, so both connect through an
SSH tunnel (`tunnel.SSHTunnel`) with the host's recorded key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import grpc
import pulumi
import pulumi.dynamic as dyn

from gym_substrate.stack.ateapi import (
    ApiCallError,
    ApiEraError,
    GoldenBuildFailed,
    TemplateClient,
    golden_state,
    template_message,
)

__all__ = ["ActorTemplate", "Atespace", "TemplateError", "token_source"]

_CONNECTION_KEYS = ("connection",)


class TemplateError(RuntimeError):
    """What the engine shows when a template or atespace step fails: which one, and why."""


@contextmanager
def _client(props: Mapping[str, Any]) -> Iterator[TemplateClient]:
    conn = dict(props["connection"])
    ssh = conn.pop("ssh", None)
    era = props.get("era")
    if not ssh:
        with TemplateClient.connect(conn, era=era) as client:
            yield client
        return
    from gym_substrate.stack.tunnel import SSHTunnel

    host, _, port = str(conn["api"]).rpartition(":")
    tunnel = SSHTunnel(ssh, remote=(host, int(port)), name=str(props.get("name", "ateapi")))
    with (
        tunnel as local,
        TemplateClient.connect(conn, dial=f"127.0.0.1:{local}", era=era) as client,
    ):
        yield client


def _ref(template: Mapping[str, Any]) -> tuple[str, str]:
    meta = template["metadata"]
    return str(meta["atespace"]), str(meta["name"])


class _TemplateProvider(dyn.ResourceProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        atespace, name = _ref(props["template"])
        message = template_message(props["template"])
        timeout = float(props.get("readyTimeoutSeconds") or 300)
        with _client(props) as api:
            try:
                created = api.create_template(message)
            except ApiEraError as exc:
                raise TemplateError(f"ActorTemplate {atespace}/{name}: {exc}") from None
            except ApiCallError as exc:
                if exc.code != grpc.StatusCode.ALREADY_EXISTS:
                    raise TemplateError(f"ActorTemplate {atespace}/{name}: {exc}") from None
                # Same name, so same content (the name hashes it): a run that stopped after the
                # create. Take it over rather than fail.
                found = api.get_template(atespace, name)
                if found is None:
                    raise TemplateError(f"ActorTemplate {atespace}/{name}: {exc}") from None
                created = found
            try:
                ready = api.wait_golden(atespace, name, timeout)
            except GoldenBuildFailed as exc:
                api.delete_template(atespace, name)
                raise TemplateError(str(exc)) from None
        golden, _ = golden_state(ready)
        outs = {
            **props,
            "ref": f"{atespace}/{name}",
            "uid": created.metadata.uid,
            "goldenTag": golden,
            "apiEra": api.era,
        }
        return dyn.CreateResult(id_=f"{atespace}/{name}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        replaces = [k for k in ("template",) if _canon(olds.get(k)) != _canon(news.get(k))]
        changed = replaces + [
            k
            for k in (*_CONNECTION_KEYS, "readyTimeoutSeconds", "era")
            if _canon(olds.get(k)) != _canon(news.get(k))
        ]
        return dyn.DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        # Only the connection, the wait or the expected era changed: the template itself is the
        # same resource (a server upgraded in place keeps its templates).
        keep: dict[str, Any] = {
            k: olds[k] for k in ("ref", "uid", "goldenTag", "apiEra") if k in olds
        }
        return dyn.UpdateResult(outs={**news, **keep})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        atespace, name = _ref(props["template"])
        with _client(props) as api:
            try:
                api.delete_template(atespace, name)
            except ApiCallError as exc:
                raise TemplateError(
                    f"ActorTemplate {atespace}/{name} could not be deleted: {exc}"
                ) from None


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class ActorTemplate(dyn.Resource, module="gymsubstrate", name="ActorTemplate"):
    """One ateapi ActorTemplate: created, awaited until its golden snapshot exists, replaced on
    any change (new first, then the old one deleted), deleted on destroy."""

    ref: pulumi.Output[str]
    uid: pulumi.Output[str]
    goldenTag: pulumi.Output[str]
    apiEra: pulumi.Output[str]

    @property
    def golden_tag(self) -> pulumi.Output[str]:
        return self.goldenTag

    def __init__(
        self,
        name: str,
        *,
        connection: pulumi.Input[Mapping[str, Any]],
        template: pulumi.Input[Mapping[str, Any]],
        ready_timeout_s: int,
        era: Mapping[str, str | None] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["connection"])
        )
        super().__init__(
            _TemplateProvider(),
            name,
            {
                "name": name,
                "connection": connection,
                "template": template,
                "readyTimeoutSeconds": ready_timeout_s,
                "era": dict(era or {}),
                "ref": None,
                "uid": None,
                "goldenTag": None,
                "apiEra": None,
            },
            opts,
        )


class _AtespaceProvider(dyn.ResourceProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        name = str(props["atespace"])
        with _client(props) as api:
            try:
                created = api.ensure_atespace(name)
            except ApiCallError as exc:
                raise TemplateError(f"Atespace {name}: {exc}") from None
        return dyn.CreateResult(id_=name, outs={**props, "adopted": not created})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        replaces = ["atespace"] if olds.get("atespace") != news.get("atespace") else []
        changed = replaces or _canon(olds.get("connection")) != _canon(news.get("connection"))
        return dyn.DiffResult(changes=bool(changed), replaces=replaces)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        return dyn.UpdateResult(outs={**news, "adopted": olds.get("adopted", True)})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        if props.get("adopted", True):
            return  # it was there before this stack: leave it
        name = str(props["atespace"])
        with _client(props) as api:
            try:
                api.delete_atespace(name)
            except ApiCallError as exc:
                if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                    raise TemplateError(
                        f"Atespace {name} is not empty, so destroy leaves it: {exc.details}. "
                        f"Fix: delete what is left in it (`kubectl ate get actors -n {name}`), "
                        "then run `pulumi destroy` again"
                    ) from None
                raise TemplateError(f"Atespace {name}: {exc}") from None


class Atespace(dyn.Resource, module="gymsubstrate", name="Atespace"):
    """The atespace the templates live in: created if missing, deleted at destroy only when this
    stack created it (`adopted` is False)."""

    adopted: pulumi.Output[bool]

    def __init__(
        self,
        name: str,
        *,
        connection: pulumi.Input[Mapping[str, Any]],
        atespace: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["connection"])
        )
        super().__init__(
            _AtespaceProvider(),
            name,
            {"name": name, "connection": connection, "atespace": atespace, "adopted": None},
            opts,
        )


def token_source(auth_mode: str, *, file: Any = None, value: Any = None) -> Any:
    """The connection's `token` entry for the stack's auth mode (None in mtls mode): a file
    (kind), a value (a borrowed host's `clientToken`, a secret), else $SUBSTRATE_TOKEN."""
    if auth_mode != "jwt":
        return None
    if file is not None:
        return {"file": file}
    if value is not None:
        return {"value": value}
    return {"env": "SUBSTRATE_TOKEN"}
