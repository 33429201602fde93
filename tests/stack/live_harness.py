"""The real toolchain for the live stack tests: the Go-built Pulumi CLI, language host and
Kubernetes provider, and a test cluster from `.ci/test-cluster`.

Nothing here is a fake: `Pulumi` runs the real `pulumi` binary against a file backend with a
passphrase secrets provider, with plugins installed from the local build only, so nothing is
downloaded at run time. On CI (`CI=true`) a component that cannot be had fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ci_policy import build_tools, missing
from stack_harness import CRD_DIR, REPO

# What the live stack tests run: engine + language host, the Kubernetes provider, and the
# control plane with kwok for the test cluster.
TOOLS = ("pulumi", "kubernetes", "kubectl", "etcd", "kwok", "kube")
KUBERNETES_PLUGIN = "4.25.0"  # pinned in pyproject.toml (pulumi-kubernetes==) and tools.env
CONTEXT = "kwok-gym-substrate"  # the context .ci/test-cluster writes
# For the stacks' live runs, the static agent build (PyInstaller and staticx from PyPI, minutes)
# is a stand-in that prints the path of a small executable, as the real script's last stdout
# line does.
BUILD_STATIC = """#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build/sandbox-agent
printf '#!/bin/sh\\necho stand-in agent\\n' > build/sandbox-agent/sandbox-agent
chmod +x build/sandbox-agent/sandbox-agent
echo "build-static (stand-in): done" >&2
echo build/sandbox-agent/sandbox-agent
"""


def toolchain() -> Path:
    """`.ci/build-tools`' bin dir with every tool in TOOLS (built now if missing: minutes on a
    cold machine, under a second when cached)."""
    bin_dir, build = build_tools(*TOOLS)
    need = ("pulumi", "pulumi-language-python", "pulumi-resource-kubernetes", "kubectl", "kwokctl")
    absent = [t for t in need if not (bin_dir / t).exists()]
    if build.returncode != 0 or absent:
        missing(
            f".ci/build-tools {' '.join(TOOLS)} failed (missing: {', '.join(absent) or '-'}):\n"
            + build.stderr[-3000:]
        )
    return bin_dir


@dataclass
class KwokCluster:
    """A cluster from `.ci/test-cluster up --substrate` (see that script for what runs)."""

    dir: Path
    kubeconfig: Path
    bin: Path

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def exists(self, *args: str) -> bool:
        result = self.kubectl("get", *args, check=False)
        if result.returncode == 0:
            return True
        assert "NotFound" in result.stderr, result.stderr
        return False


def kwok_cluster(base: Path, bin_dir: Path, ca: Path | None = None) -> Iterator[KwokCluster]:
    """Start a test cluster with the WorkerPool/SandboxConfig CRDs (the repo's, written from
    upstream's types) and stand-ins of what a Substrate install leaves, publishing `ca` as its
    servicedns trust bundle; stop it afterwards and fail if any of its processes is left."""
    script = str(REPO / ".ci" / "test-cluster")
    extra = ["--ca", str(ca)] if ca is not None else []
    up = subprocess.run(
        [script, "up", "--dir", str(base), "--nodes", "3", "--substrate", str(CRD_DIR), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        if up.returncode != 0:
            pytest.fail(f".ci/test-cluster up failed:\n{up.stderr[-4000:]}", pytrace=False)
        yield KwokCluster(base, Path(up.stdout.strip().splitlines()[-1]), bin_dir)
    finally:
        down = subprocess.run(
            [script, "down", "--dir", str(base)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if down.returncode != 0:
            pytest.fail(f".ci/test-cluster down failed:\n{down.stderr[-4000:]}", pytrace=False)


@dataclass
class Pulumi:
    """The real CLI on a copy of the project (Pulumi.yaml, infra/), so `pulumi stack init` and
    `config set` write into a temp dir instead of the repo's stack files."""

    bin: Path
    project: Path
    home: Path
    timings: dict[str, float] = field(default_factory=dict)
    # What a test adds to (or overrides in) the environment, e.g. fakes first on PATH.
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        return {
            **os.environ,
            # The language host (sdk v3.79.0) ignores Pulumi.yaml's toolchain options: the venv's
            # python must be the one it finds. The tools dir is not on PATH: the engine finds
            # the language host beside the pulumi binary, and plugins only in PULUMI_HOME.
            "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]),
            "PULUMI_PYTHON_CMD": sys.executable,
            "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
            "PULUMI_HOME": str(self.home),
            "PULUMI_SKIP_UPDATE_CHECK": "1",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_CONFIG_PASSPHRASE": "gym-substrate-live-test",
            **self.extra_env,
        }

    def run(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 900,
        step: str | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        result = subprocess.run(
            [str(self.bin / "pulumi"), *args, "--non-interactive"],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=stdin,
        )
        if step:
            self.timings[step] = round(time.monotonic() - start, 1)
        if check and result.returncode != 0:
            raise AssertionError(
                f"pulumi {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-6000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def config(self, path: str, value: str) -> None:
        self.run("config", "set", "--path", path, value)

    def steps(self, preview_json: str) -> list[tuple[str, str]]:
        """(op, resource name) for each step of `pulumi preview --json`, except `same`."""
        doc = json.loads(preview_json)
        steps = doc.get("steps", [])
        return [(s["op"], s["urn"].rsplit("::", 1)[-1]) for s in steps if s["op"] != "same"]


def pulumi_project(base: Path, bin_dir: Path, stack: str) -> Pulumi:
    """A logged-in file backend, the Kubernetes plugin installed from the local build, and
    `stack` initialised from the repo's stack file."""
    project = base / "project"
    (project / "infra" / "stacks").mkdir(parents=True)
    shutil.copy(REPO / "Pulumi.yaml", project)
    shutil.copy(REPO / "infra" / "__main__.py", project / "infra")
    shutil.copy(REPO / "infra" / "stacks" / f"Pulumi.{stack}.yaml", project / "infra" / "stacks")
    # The dynamic provider's launcher (sdk v3.79.0's pulumi-resource-pulumi-python) resolves
    # Pulumi.yaml's `virtualenv: .venv` against its working directory, infra/, where the engine
    # starts it, and the engine's value overrides any from the environment.
    (project / "infra" / ".venv").symlink_to(sys.prefix)
    (base / "state").mkdir()
    cli = Pulumi(bin_dir, project, base / "pulumi-home")
    cli.run("login", f"file://{base / 'state'}")
    cli.run(
        "plugin",
        "install",
        "resource",
        "kubernetes",
        KUBERNETES_PLUGIN,
        "--file",
        str(bin_dir / "pulumi-resource-kubernetes"),
    )
    cli.run("stack", "init", stack)
    return cli
