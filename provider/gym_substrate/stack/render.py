"""Write what a stack would apply, without Pulumi or a cluster (`gym-substrate render`).

For GitOps users and for review. Objects that need a value only `pulumi up` produces (image
digests, the ateom image, staged microVM asset checksums) are rendered where a stand-in keeps
them meaningful (the WorkerPool keeps Substrate's own `ko://` reference, which `ko resolve`
replaces) and listed as skipped otherwise, so nothing silently differs from what Pulumi applies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gym_substrate.stack import host, objects, scripts
from gym_substrate.stack.config import StackConfig, stack_file

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
    ko_ateom = f"ko://github.com/agent-substrate/substrate/cmd/ateom-{cfg.runtime}"
    objs: list[dict[str, Any]] = [objects.local_registry_hosting(cfg), objects.pool_namespace(cfg)]
    if cfg.runtime == "gvisor":
        objs.append(objects.sandbox_config(cfg))
    else:
        skipped.append(
            "SandboxConfig microvm: its asset sha256 values come from staging the "
            "kata assets at `pulumi up`"
        )
    objs.append(objects.worker_pool(cfg, ko_ateom))
    objs.extend(objects.nodeport_services(cfg))
    if cfg.observability.enabled:
        objs.extend(objects.observability_objects(cfg))
    for i, obj in enumerate(objs):
        write(f"kubernetes/{_file_name(i, obj)}", yaml.safe_dump(obj, sort_keys=False))
    for wl in cfg.workloads:
        skipped.append(
            f"ActorTemplate for workload {wl.name!r}: its name and image carry the "
            "digests of images built at `pulumi up`"
        )
    if cfg.observability.enabled:
        write("dashboards/sandbox-lifecycle.json", json.dumps(objects.dashboard(cfg), indent=2))
    write("kind-config.yaml", yaml.safe_dump(scripts.kind_config(cfg), sort_keys=False))
    steps: dict[str, str] = {}
    if cfg.host is not None:
        steps["00-host-prep-root.sh"] = host.prep_root_script(cfg)
        steps["01-host-install-tools.sh"] = host.install_tools_script(cfg)
        steps["02-host-sshd-priority.sh"] = host.sshd_priority_script(cfg)
    steps["10-kind-create.sh"] = scripts.kind_create_script(cfg)
    steps["20-substrate-build.sh"] = scripts.substrate_build_script(cfg)
    steps["21-substrate-install.sh"] = scripts.substrate_install_script(cfg)
    if cfg.runtime == "microvm":
        steps["30-runtime-node-label.sh"] = scripts.node_label_script(cfg)
        steps["31-runtime-microvm-assets.sh"] = scripts.microvm_assets_script(cfg)
    steps["40-pool-wait.sh"] = scripts.pool_wait_script(cfg)
    steps["90-substrate-delete.sh"] = scripts.substrate_delete_script(cfg)
    steps["91-kind-delete.sh"] = scripts.kind_delete_script(cfg)
    if cfg.host is not None:
        steps["95-host-wipe.sh"] = host.wipe_script(cfg)
        steps["96-host-revert-root.sh"] = host.revert_root_script(cfg)
    for name, text in steps.items():
        write(f"scripts/{name}", "#!/usr/bin/env bash\n" + text)
    write("SKIPPED.txt", "".join(f"- {s}\n" for s in skipped))
    return written, skipped


def _render_existing(cfg: StackConfig, write: Callable[[str, str], None]) -> list[str]:
    """Target `existing` pins every image in its config, so every object it applies renders,
    templates included; there is no kind config and no script."""
    assert cfg.existing is not None
    objs: list[dict[str, Any]] = [
        objects.pool_namespace(cfg),
        objects.worker_pool(cfg, cfg.existing.ateom_image),
        *(objects.prebuilt_actor_template(cfg, wl) for wl in cfg.workloads),
        *objects.nodeport_services(cfg),
    ]
    if cfg.observability.enabled:
        objs.extend(objects.observability_objects(cfg))
        write("dashboards/sandbox-lifecycle.json", json.dumps(objects.dashboard(cfg), indent=2))
    for i, obj in enumerate(objs):
        write(f"kubernetes/{_file_name(i, obj)}", yaml.safe_dump(obj, sort_keys=False))
    skipped = [
        f"SandboxConfig {cfg.sandbox_config_name}, the ate-system namespace and the CA bundle: "
        "the cluster's Substrate install provides them (the stack only reads them)"
    ]
    write("SKIPPED.txt", "".join(f"- {s}\n" for s in skipped))
    return skipped
