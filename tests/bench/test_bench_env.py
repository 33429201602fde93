"""`gym-substrate bench env` runs end to end and reports every row with its baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gym_substrate.cli import main


def test_bench_env_json_on_the_process_runtime() -> None:
    args = ["bench", "env", "--runtime", "process", "--steps", "20", "--vector-steps", "10"]
    result = CliRunner().invoke(main, [*args, "--num-envs", "2", "--vector", "sync", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["where"] == "local, runtime process"
    rows = {row["name"]: row for row in report["results"]}
    assert list(rows) == [
        "provider.exec ×1",
        "SandboxEnv ×1",
        "provider.exec ×2",
        "SyncVectorEnv ×2",
    ]
    assert [rows[n]["steps"] for n in rows] == [20, 20, 20, 20]
    assert all(row["errors"] == 0 and row["steps_per_s"] > 0 for row in rows.values())
    assert report["target"]["applies"] is False


def test_bench_env_rejects_a_config_without_a_substrate_block(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.yaml"
    config.write_text("sandbox:\n  docker: {}\n")
    result = CliRunner().invoke(main, ["bench", "env", "--config", str(config)])
    assert result.exit_code == 2
    assert "must hold exactly one provider key, `substrate`" in result.output


def test_bench_env_rejects_a_bad_provider_config(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.yaml"
    config.write_text(
        "sandbox:\n  substrate:\n    connection: {api: '127.0.0.1:9', router: 'http://127.0.0.1:9'"
        ", tls: {plaintext: true}}\n    exec: {poll_wait_s: 60}\n"
    )
    result = CliRunner().invoke(main, ["bench", "env", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "exec.poll_wait_s: must be <= 8" in result.output


def test_bench_env_with_the_stack_down_says_why(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.yaml"
    config.write_text(
        "sandbox:\n  substrate:\n    connection: {api: '127.0.0.1:9', router: 'http://127.0.0.1:9'"
        ", tls: {plaintext: true}, request_timeout_s: 0.2}\n"
        "    create: {retry: {deadline: 0.3}}\n    lifecycle: {ledger: null}\n"
    )
    args = ["bench", "env", "--config", str(config), "--steps", "10", "--vector", "sync"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "baseline: provider.exec, 1 sandbox failed" in result.output
    # the provider's first call checks the template (GetActorTemplate), says it was that, and
    # names the key to fix when nothing listens at the API address
    assert "GetActorTemplate: UNAVAILABLE" in result.output
    assert "fix connection.api" in result.output


def test_bench_env_against_a_configured_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_substrate.envs.backend import running_local_backend

    with running_local_backend(runtime="process", workers=2, default_rootfs="host") as backend:
        connection = backend.connection()
        monkeypatch.setenv("ENVTEST_SUBSTRATE_API", connection["api"])
        config = tmp_path / "sandbox.yaml"
        config.write_text(
            "sandbox:\n"
            "  substrate:\n"
            "    connection:\n"
            "      api: ${oc.env:ENVTEST_SUBSTRATE_API}\n"
            f"      router: {connection['router']}\n"
            "      tls: {plaintext: true}\n"
            "    create: {template: local/sandbox}\n"
            f"    lifecycle: {{ledger: {tmp_path / 'ledger'}}}\n"
        )
        args = ["bench", "env", "--config", str(config), "--steps", "10", "--vector-steps", "10"]
        result = CliRunner().invoke(main, [*args, "--num-envs", "1", "--vector", "sync", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["where"] == "stack from sandbox.yaml"
    assert [row["errors"] for row in report["results"]] == [0, 0, 0, 0]
