"""`gym-substrate render`: every stack renders without Pulumi, and what it writes is valid."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from stack_harness import REPO, STACKS

from gym_substrate.cli import main
from gym_substrate.stack import objects


@pytest.mark.parametrize("stack", STACKS)
def test_render_writes_every_static_object(stack: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["render", "--stack", stack, "--out", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    files = [Path(f) for f in report["files"]]
    assert all(f.is_file() for f in files)
    kinds: dict[str, dict[str, object]] = {}
    for f in sorted((tmp_path / "kubernetes").glob("*.yaml")):
        obj = yaml.safe_load(f.read_text())
        kinds.setdefault(obj["kind"], obj)
        if obj["apiVersion"] != "ate.dev/v1alpha1":
            kubernetes_validate.validate(obj, "1.36.0", strict=True)
    assert {"WorkerPool", "Service", "Namespace", "ConfigMap", "Deployment"} <= set(kinds)
    pool = kinds["WorkerPool"]
    runtime = stack.split("-")[1]
    assert pool["spec"]["workerImage"] == (  # type: ignore[index]
        f"ghcr.io/agent-substrate/substrate/ateom-{runtime}:v0.3.0"
    )
    # gVisor's SandboxConfig is the release's (its installer applies it); microVM's is skipped.
    assert "SandboxConfig" not in kinds
    assert "ActorTemplate" not in kinds
    assert any("ActorTemplates are created through ateapi" in s for s in report["skipped"])
    assert any("SandboxConfig" in s for s in report["skipped"]) == (runtime == "microvm")
    (template,) = (tmp_path / "templates").glob("*.yaml")
    message = yaml.safe_load(template.read_text())
    assert message["containers"][0]["image"] == "python:3.12-slim"
    assert message["volumes"][0]["name"] == "sandbox-agent"
    install = yaml.safe_load((tmp_path / "substrate-install.yaml").read_text())
    assert install["kind"] == "SubstrateInstall"
    assert install["images"]["tag"] == "v0.3.0"
    assert (tmp_path / "SKIPPED.txt").read_text().count("- ") == len(report["skipped"])
    dash = json.loads((tmp_path / "dashboards" / "sandbox-lifecycle.json").read_text())
    assert dash["title"] == "Sandbox lifecycle"
    kind_cfg = yaml.safe_load((tmp_path / "kind-config.yaml").read_text())
    assert kind_cfg["featureGates"]["PodCertificateRequest"] is True
    host_steps = {"00-host-prep-root.sh", "96-host-revert-root.sh", "95-host-wipe.sh"}
    written = {f.name for f in (tmp_path / "scripts").iterdir()}
    assert (host_steps <= written) == stack.startswith("host")
    assert {"20-substrate-source.sh", "21-substrate-install.sh", "90-substrate-uninstall.sh"} <= (
        written
    )


def test_render_table_output_and_stack_file(tmp_path: Path) -> None:
    path = REPO / "infra" / "stacks" / "Pulumi.kind-gvisor.yaml"
    result = CliRunner().invoke(main, ["render", "--stack-file", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "kubernetes/" in result.output
    assert "skipped" in result.output


def test_render_reports_a_bad_stack_file(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(
        "config:\n  gym-substrate:runtime: kata\n  gym-substrate:workloads:\n"
        "    - {name: py, image: python:3.12}\n"
    )
    result = CliRunner().invoke(
        main, ["render", "--stack-file", str(bad), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 1
    assert "gym-substrate:runtime: unknown value 'kata'" in result.output
    assert not (tmp_path / "out").exists()


def test_render_reports_unwritable_out_and_malformed_stack_file(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(
        main, ["render", "--stack", "kind-gvisor", "--out", str(blocker / "out")]
    )
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert f"cannot write into {blocker / 'out'}" in result.output
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config: [unclosed\n")
    result = CliRunner().invoke(
        main, ["render", "--stack-file", str(bad), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 1, result.output
    assert f"{bad}: not valid YAML" in result.output.replace("\n", "")


def test_render_needs_exactly_one_stack_source(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["render", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "exactly one of --stack or --stack-file" in result.output


# Run in a fresh interpreter where every Pulumi package is unimportable, as in a wheel installed
# without the `infra` extra: a None entry in sys.modules makes `import pulumi` (and pulumi.x)
# raise ImportError.
_WITHOUT_PULUMI = """
import sys
for name in ("pulumi", "pulumi_kubernetes", "paramiko"):
    sys.modules[name] = None
try:
    import gym_substrate.stack.components
except ImportError:
    pass
else:
    raise SystemExit("the poison did not block pulumi")
import gym_substrate.stack.config, gym_substrate.stack.objects, gym_substrate.stack.scripts
from gym_substrate.cli import main
main(["render", "--stack", "kind-gvisor", "--out", sys.argv[1], "--json"])
"""


def test_render_runs_without_pulumi(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", _WITHOUT_PULUMI, str(tmp_path)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert any(f.endswith("-workerpool-sandboxes-sandbox-pool.yaml") for f in report["files"])


def test_wheel_ships_manifests_where_the_lookup_expects_them() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    mapping = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert mapping["manifests"] == "gym_substrate/stack/manifests"
    package_dir = Path(objects.__file__).resolve().parent
    installed = REPO / "provider" / mapping["manifests"]
    assert installed.parent == package_dir
    assert objects.manifests_dir() == REPO / "manifests"
