"""Write what a stack would apply, without Pulumi or a cluster (`gym-substrate render`).

For GitOps users and for review: the Kubernetes objects (`kubernetes/`), the ActorTemplate
messages the stack creates through ateapi (`templates/`, in the proto's JSON mapping that
`kubectl ate create actor-template -f` reads), the release installer's SubstrateInstall document
and the shell steps. Values only `pulumi up` produces are written in a form that says what they
stand for: the WorkerPool names the release's worker image by tag (the `worker-image` step pins
it to its digest), a kind or host template names the workload by its configured tag and the
agent image as built at `up` (so its name's hash differs from the one `up` creates); what cannot
be written at all (the microVM SandboxConfig's checksums) is listed in SKIPPED.txt.

The templates are written for the stack's ateapi era (`stack/api_era.py`), each file's first
line says which; when the era is read from the server at `up` (`existing` without an era, a
`substrate.source` commit without `substrate.apiEra`), they are written in the current era's form
and the line says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gym_substrate.stack import host, install_scripts, objects, observability, scripts
from gym_substrate.stack.api_era import ApiEra
from gym_substrate.stack.ateapi import era_template
from gym_substrate.stack.config import StackConfig, WorkloadConfig, stack_file

__all__ = ["STACKS", "render_stack", "shipped_stack_file"]

STACKS = ("kind-gvisor", "kind-microvm", "host-gvisor", "host-microvm", "existing")


def shipped_stack_file(stack: str) -> Path:
    """`infra/stacks/Pulumi.<stack>.yaml` of the checkout around the working directory, else of
    the checkout this package runs from."""
    for base in (Path.cwd(), *Path.cwd().parents):
        if (base / "Pulumi.yaml").is_file() and (base / "infra" / "stacks").is_dir():
            return stack_file(base, stack)
    return stack_file(Path(__file__).resolve().parents[3], stack)


def _file_name(index: int, obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    ns = f"{meta['namespace']}-" if meta.get("namespace") else ""
    return f"{index:02d}-{obj['kind'].lower()}-{ns}{meta['name']}.yaml".replace(":", "-")


def render_stack(cfg: StackConfig, out: Path) -> tuple[list[Path], list[str]]:
    """Write the stack's static objects and scripts under `out`; return (files, skipped)."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    skipped: list[str] = []

    def write(rel: str, text: str) -> None:
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)

    if cfg.existing is not None:
        return written, _render_existing(cfg, write)
    s = cfg.substrate
    worker = (
        s.image(f"ateom-{cfg.runtime}")
        if s.prebuilt
        else f"ko://github.com/agent-substrate/substrate/cmd/ateom-{cfg.runtime}"
    )
    objs: list[dict[str, Any]] = [objects.local_registry_hosting(cfg), objects.pool_namespace(cfg)]
    if cfg.runtime == "microvm":
        skipped.append(
            f"SandboxConfig {cfg.sandbox_config_name}: its asset sha256 values come from staging "
            "the kata assets at `pulumi up`"
        )
    objs.append(objects.worker_pool(cfg, worker))
    objs.extend(objects.nodeport_services(cfg))
    if cfg.observability.enabled:
        objs.extend(observability.observability_objects(cfg))
    for i, obj in enumerate(objs):
        write(f"kubernetes/{_file_name(i, obj)}", yaml.safe_dump(obj, sort_keys=False))
    registry = f"localhost:{cfg.cluster.registry_port}"
    agent = f"{registry}/gym-substrate/sandbox-agent@sha256:<built at up>"
    _write_templates(cfg, write, lambda wl: (wl.image, agent))
    skipped.append(
        "ActorTemplates are created through ateapi at `pulumi up` with the workload pinned by "
        "digest and the agent image as built then; templates/ shows them with the configured "
        "tag, so their names (a hash of the content) differ from the created ones"
    )
    if cfg.observability.enabled:
        write(
            "dashboards/sandbox-lifecycle.json", json.dumps(observability.dashboard(cfg), indent=2)
        )
    write("kind-config.yaml", yaml.safe_dump(scripts.kind_config(cfg), sort_keys=False))
    write("substrate-install.yaml", yaml.safe_dump(objects.install_document(cfg), sort_keys=False))
    steps: dict[str, str] = {}
    if cfg.host is not None:
        steps["00-host-prep-root.sh"] = host.prep_root_script(cfg)
        steps["01-host-install-tools.sh"] = host.install_tools_script(cfg)
        steps["02-host-sshd-priority.sh"] = host.sshd_priority_script(cfg)
    steps["10-kind-create.sh"] = scripts.kind_create_script(cfg)
    steps["20-substrate-source.sh"] = install_scripts.source_script(cfg)
    steps["21-substrate-install.sh"] = install_scripts.install_script(cfg)
    steps["22-worker-image.sh"] = install_scripts.worker_image_script(cfg)
    steps["23-ca.sh"] = install_scripts.ca_script(cfg)
    if cfg.runtime == "microvm":
        steps["30-runtime-node-label.sh"] = install_scripts.node_label_script(cfg)
        steps["31-runtime-microvm-assets.sh"] = install_scripts.microvm_assets_script(cfg)
    steps["40-pool-wait.sh"] = scripts.pool_wait_script(cfg)
    steps["90-substrate-uninstall.sh"] = install_scripts.uninstall_script(cfg)
    steps["91-kind-delete.sh"] = scripts.kind_delete_script(cfg)
    if cfg.host is not None:
        steps["95-host-wipe.sh"] = host.wipe_script(cfg)
        steps["96-host-revert-root.sh"] = host.revert_root_script(cfg)
    for name, text in steps.items():
        write(f"scripts/{name}", "#!/usr/bin/env bash\n" + text)
    write("SKIPPED.txt", "".join(f"- {s}\n" for s in skipped))
    return written, skipped


def _write_templates(
    cfg: StackConfig,
    write: Callable[[str, str], None],
    images: Callable[[WorkloadConfig], tuple[str, str]],
) -> None:
    era = cfg.substrate.api_era
    head = "".join(f"# {line}\n" for line in _era_lines(era))
    for i, wl in enumerate(cfg.workloads):
        image, agent = images(wl)
        message = objects.actor_template(cfg, wl, image=image, agent_image=agent)
        meta = message["metadata"]
        body = era_template(message, era.era) if era.era else message
        write(
            f"templates/{i:02d}-{meta['atespace']}-{meta['name']}.yaml",
            head + yaml.safe_dump(body, sort_keys=False),
        )


def _era_lines(era: ApiEra) -> list[str]:
    lines = [era.describe()]
    if era.era is None:
        lines.append("Shown in the current era's form; `up` converts it for the server's era.")
    return lines


def _render_existing(cfg: StackConfig, write: Callable[[str, str], None]) -> list[str]:
    """Target `existing` pins every image in its config, so every object and template it
    creates renders exactly; there is no kind config, installer document or script."""
    assert cfg.existing is not None
    assert cfg.agent.image is not None
    agent = cfg.agent.image
    objs: list[dict[str, Any]] = [
        objects.pool_namespace(cfg),
        objects.worker_pool(cfg, cfg.existing.worker_image),
        *objects.nodeport_services(cfg),
    ]
    if cfg.observability.enabled:
        objs.extend(observability.observability_objects(cfg))
        write(
            "dashboards/sandbox-lifecycle.json", json.dumps(observability.dashboard(cfg), indent=2)
        )
    for i, obj in enumerate(objs):
        write(f"kubernetes/{_file_name(i, obj)}", yaml.safe_dump(obj, sort_keys=False))
    _write_templates(cfg, write, lambda wl: (wl.image, agent))
    skipped = [
        f"SandboxConfig {cfg.sandbox_config_name}, the ate-system namespace and the CA bundle: "
        "the cluster's Substrate install provides them (the stack only reads them)"
    ]
    write("SKIPPED.txt", "".join(f"- {s}\n" for s in skipped))
    return skipped
