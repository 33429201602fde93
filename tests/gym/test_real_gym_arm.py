"""(f) `gym-substrate arm --driver gym`: rollouts collected by NeMo Gym 0.7.0's own servers.

The command starts a local backend (gVisor), the replay policy as the model, and Gym's servers
(`gym env start`: terminal_bench_2_1, terminus_2_sandboxed_agent, openai_model) in the chroot,
then `gym eval run --no-serve --num-repeats N --concurrency N` collects N rollouts of the
shipped hello task at once. Under the pause policy the provider inside Gym parks each sandbox
while the replay policy "thinks", which the arm sees from outside through ListActors.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest
from gym_helpers import NOTES, TIMINGS, gym_substrate_cli

pytestmark = [pytest.mark.gym, pytest.mark.runsc, pytest.mark.timeout(900)]

MARKER = b"GYM_SUBSTRATE_GYM_ARM_RUN="


def _marked_processes() -> list[str]:
    """Processes still carrying the marker the arm gives everything it starts."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(item.startswith(MARKER) for item in environ):
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:120]!r}")
    return found


def test_gym_arm_pause_collects_rollouts_and_parks_while_thinking(
    gym_chroot: Path, tmp_path: Path
) -> None:
    """Two rollouts through Gym under the pause policy: both verified (reward 1), no failure,
    no actor left, every process of the run gone, and actors PAUSED while the policy thinks.

    real: the provider's idle policy parks with PauseActor (cmd/ateapi/internal/controlapi/
    workflow.go) and ListActors reports the actor PAUSED until a call resumes it.
    """
    out = tmp_path / "arm"
    proc = subprocess.run(
        [
            *gym_substrate_cli(),
            "arm",
            "--driver",
            "gym",
            "--policy",
            "pause",
            "--rollouts",
            "2",
            "--think-s",
            "3",
            "--runtime",
            "gvisor",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    logs = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, logs
    summary = json.loads((out / "summary.json").read_text())["summary"]
    TIMINGS["gym arm (2 rollouts, pause): collection"] = summary["wall_s"]
    TIMINGS["gym arm: Gym's servers ready"] = summary["servers_ready_s"]
    NOTES.append(
        f"gym arm pause x2: rewards {summary['rewards']}, {summary['rollouts_per_min']:.2f} "
        f"rollouts/min, turn p50 {summary['step_p50_s']:.2f} s, resumes {summary['resumes']}"
    )
    assert summary["rollouts_done"] == 2, summary
    assert summary["rewards"] == [1.0, 1.0], (summary, logs)
    assert summary["failures"] == 0, summary["failures_by_kind"]
    assert summary["leaked_actors"] == 0, summary["leaked_actor_ids"]
    assert summary["processes_left"] == 0
    assert not _marked_processes(), _marked_processes()
    # Every recorded turn was served to both rollouts, and the steps are the turns between.
    assert summary["replay"]["turns_served"] == 2 * summary["turns_per_rollout"]
    assert summary["steps_done"] == 2 * (summary["turns_per_rollout"] - 1)
    assert summary["resumes"] >= 2, summary
    assert summary["parks"] >= 2, summary
    for name in ("occupancy.png", "step_latency.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        import matplotlib.image

        assert matplotlib.image.imread(out / name).shape[0] > 100
    with open(out / "occupancy.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows, "no occupancy samples"
    parked_while_thinking = [r for r in rows if int(r["thinking"]) > 0 and int(r["PAUSED"]) > 0]
    assert parked_while_thinking, f"no sample with an actor PAUSED during a think: {rows}"
    assert os.path.isfile(out / "gym" / "rollouts.jsonl")
