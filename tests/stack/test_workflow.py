"""The users' kind-smoke workflow: both architectures, up -> smoke -> destroy (always)."""

from __future__ import annotations

import yaml
from stack_harness import REPO


def test_kind_smoke_workflow() -> None:
    doc = yaml.safe_load((REPO / ".github" / "workflows" / "kind-smoke.yml").read_text())
    job = doc["jobs"]["kind-smoke"]
    assert set(job["strategy"]["matrix"]["runner"]) == {"ubuntu-24.04", "ubuntu-24.04-arm"}
    runs = [(s.get("name", ""), s.get("run", ""), s.get("if")) for s in job["steps"]]
    text = [r for _, r, _ in runs]
    up = next(i for i, r in enumerate(text) if "pulumi up --yes" in r)
    smoke = next(i for i, r in enumerate(text) if "gym-substrate smoke --config" in r)
    destroy = next(i for i, r in enumerate(text) if "pulumi destroy --yes" in r)
    assert up < smoke < destroy
    assert runs[destroy][2] == "always()"
    assert "pulumi stack output providerConfig --show-secrets" in text[up]
    assert job["env"]["STACK"] == "kind-gvisor"
