"""Real `pulumi preview` / `up` / smoke / `destroy` through the Automation API.

These need the Pulumi CLI (no package registry ships it) and, for `up`, Docker plus internet
egress for kind, ko and Substrate's images; here they skip and say why. Set
GYM_SUBSTRATE_STACK_CONFIG to a path to opt into the live run: the stack's providerConfig is
written there, so the provider's cluster tests can use the same stack.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stack_harness import REPO, SSH_KEY, STACKS


@pytest.fixture(autouse=True)
def _keep_stack_files() -> Iterator[None]:
    """`pulumi stack init` writes an encryption salt (and our secret) into the repo's stack file;
    put the committed text back afterwards."""
    files = {p: p.read_text() for p in (REPO / "infra" / "stacks").glob("Pulumi.*.yaml")}
    yield
    for path, text in files.items():
        path.write_text(text)


def _stack(name: str, backend: Path) -> Any:
    from pulumi import automation as auto

    env = {
        "PULUMI_BACKEND_URL": f"file://{backend}",
        "PULUMI_CONFIG_PASSPHRASE": "",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
    }
    stack = auto.create_or_select_stack(
        stack_name=name, work_dir=str(REPO), opts=auto.LocalWorkspaceOptions(env_vars=env)
    )
    if name.startswith("host"):
        stack.set_config("sshPrivateKey", auto.ConfigValue(SSH_KEY, secret=True))
    return stack


@pytest.mark.pulumi_cli
@pytest.mark.parametrize("name", STACKS)
def test_preview_registers_the_components(name: str, tmp_path: Path) -> None:
    stack = _stack(name, tmp_path)
    result = stack.preview()
    created = result.change_summary.get("create", 0)
    assert created >= 20, result.change_summary


@pytest.mark.pulumi_cli
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_kind_up_smoke_destroy(tmp_path: Path) -> None:
    target = Path(os.environ["GYM_SUBSTRATE_STACK_CONFIG"])
    stack = _stack("kind-gvisor", tmp_path)
    try:
        up = stack.up(on_output=print)
        outputs = up.outputs
        assert outputs["kubeconfig"].secret
        target.write_text(outputs["providerConfig"].value)
        smoke = subprocess.run(
            [str(Path(sys.executable).parent / "gym-substrate"), "smoke", "--config", str(target)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    finally:
        stack.destroy(on_output=print)
