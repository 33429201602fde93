"""schemathesis against agent/openapi.json, with the agent inside bubblewrap.

Every operation, in schemathesis' coverage, fuzzing and stateful phases (the stateful phase
follows the document's links: exec -> get/kill, upload -> get/head/stat), with a fixed seed and
a bounded number of examples per operation. It fails on any 5xx and on any answer the document
does not describe (status, content type, headers, body schema), on auth the agent ignores, and
on a 400 to a schema-valid request (schemathesis_hooks.py). Two checks are left out on purpose:
`use_after_free` (DELETE /v1/exec/{id} kills a job, it does not remove it: the job stays
readable, as the contract says) and `positive_data_acceptance` (replaced by the hook, which
knows the 400s that depend on the sandbox, such as an unknown user name).

Generated commands really run, as generated users, and uploads really write: hence the sandbox
(conftest._BWRAP_ARGS), in which the host is read-only and /tmp is private.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SEED = 14
# 200 in .ci/run; a full run for a report sets GYM_SUBSTRATE_SCHEMATHESIS_EXAMPLES (1000: ~15,000
# requests).
EXAMPLES_PER_OPERATION = int(os.environ.get("GYM_SUBSTRATE_SCHEMATHESIS_EXAMPLES", "200"))
TOKEN = "schemathesis-token"
HOOKS_DIR = Path(__file__).resolve().parent
OPENAPI_FILE = HOOKS_DIR.parents[1] / "agent" / "openapi.json"


def _status_classes(har: Path) -> dict[str, int]:
    entries = json.loads(har.read_text())["log"]["entries"]
    counts = collections.Counter(f"{entry['response']['status'] // 100}xx" for entry in entries)
    return dict(sorted(counts.items()))


_INTERPRETER_CRASH = "AST constructor recursion depth mismatch"


# pytest-timeout's 300 s is for the bounded run; a full run scales it (and the subprocess limit).
_SCALE = max(1, EXAMPLES_PER_OPERATION // 200)


@pytest.mark.timeout(300 * _SCALE)
def test_schemathesis_finds_nothing(
    agent_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], openapi: dict[str, Any]
) -> None:
    # No actor id: with one, most generated requests would carry another in X-Sandbox-Actor-Id
    # and stop at 409 (test_agent_serving covers the guard).
    agent = agent_factory(sandbox=True, env={"SANDBOX_AGENT_TOKEN": TOKEN})
    har = tmp_path / "requests.har"
    cli = Path(sys.executable).with_name("schemathesis")
    argv = [
        str(cli),
        "run",
        str(OPENAPI_FILE),
        *("--url", f"http://127.0.0.1:{agent.port}"),
        *("--header", f"Authorization: Bearer {TOKEN}"),
        *("--phases", "examples,coverage,fuzzing,stateful"),
        *("--seed", str(SEED), "--max-examples", str(EXAMPLES_PER_OPERATION)),
        *("--checks", "all", "--exclude-checks", "use_after_free,positive_data_acceptance"),
        *("--workers", "1", "--generation-database", "none", "--request-timeout", "20"),
        *("--report", "har", "--report-har-path", str(har), "--no-color"),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(HOOKS_DIR),
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
    }
    try:
        for _ in range(2):
            run = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=env,
                timeout=280 * _SCALE,
                cwd=tmp_path,
            )
            output = run.stdout + run.stderr
            # CPython 3.11 can crash inside hypothesis' ast.parse of a lambda's source ("AST
            # constructor recursion depth mismatch", gone in 3.12): schemathesis failed to run,
            # it found nothing. Once more with the same seed then; any failure after that counts.
            if run.returncode == 0 or _INTERPRETER_CRASH not in output or "Failures:" in output:
                break
        assert agent.request("GET", "/readyz").status == 200, "the agent survived"
    finally:
        agent.stop()
    counts = _status_classes(har)
    with capsys.disabled():
        total = sum(counts.values())
        print(f"\nschemathesis (seed {SEED}): {total} requests by status class: {counts}")
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    assert counts.get("5xx", 0) == 0
    assert counts.get("2xx", 0) > 500, "the generated traffic must also succeed, not only fail"
    assert total >= EXAMPLES_PER_OPERATION * len(
        [op for ops in openapi["paths"].values() for op in ops]
    )
    log = agent.log_text()
    assert "Traceback" not in log
    assert "internal error" not in log
