"""`gym-substrate bench provider` runs end to end and reports each figure with its baseline."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gym_substrate.cli import main


def test_bench_provider_json_reports_the_provider_and_the_router_against_their_baselines() -> None:
    """Both overheads are measured against a baseline taken in the same run: the provider's
    exec against the same exec posted by hand through the router, and the router hop (its
    per-request ResumeActor round trip to the API server included) against the agent's own
    answer to the same request."""
    args = ["bench", "provider", "--runtime", "process", "--execs", "5", "--cycles", "1"]
    result = CliRunner().invoke(main, [*args, "--transfer-mib", "1", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["runtime"] == "process"
    assert (figures["execs"], figures["cycles"], figures["transfer_mib"]) == (5, 1, 1)
    for key in ("exec_p50_ms_provider", "exec_p50_ms_direct", "readyz_p50_ms_router"):
        assert figures[key] > 0, key
    assert figures["readyz_p50_ms_agent"] > 0
    added = figures["readyz_p50_ms_router"] - figures["readyz_p50_ms_agent"]
    assert abs(figures["router_added_ms_p50"] - added) < 1e-6


def test_bench_provider_rejects_counts_below_one() -> None:
    result = CliRunner().invoke(main, ["bench", "provider", "--execs", "0"])
    assert result.exit_code == 2
    assert "--execs, --cycles and --transfer-mib must be >= 1" in result.output
