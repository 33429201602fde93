"""Contract tests for exec jobs against the real agent process."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from job_pids import alive, wait_for_pid, wait_gone


def test_string_command_runs_in_shell_and_reports_output(agent: Any, check_schema: Any) -> None:
    resp = agent.exec(command="echo out; echo err >&2; exit 3")
    assert resp.status == 200
    job = resp.json()
    check_schema(job, "Job")
    assert job["state"] == "exited"
    assert job["exit_code"] == 3
    assert job["signal"] is None
    assert job["stdout"] == "out\n"
    assert job["stderr"] == "err\n"
    assert job["stdout_truncated"] is False
    assert job["error"] is None
    assert job["duration_ms"] >= 0


def test_list_command_is_argv_without_shell(agent: Any) -> None:
    job = agent.exec(command=["printf", "%s|", "a b", "$HOME"]).json()
    assert job["stdout"] == "a b|$HOME|"


def test_shell_cwd_env_and_stdin(agent: Any, tmp_path: Path) -> None:
    job = agent.exec(
        command='echo "$0 $(pwd) $FOO"; cat',
        shell="/bin/bash",
        cwd=str(tmp_path),
        env={"FOO": "bar baz"},
        stdin="line1\nline2\n",
    ).json()
    assert job["stdout"] == f"/bin/bash {tmp_path} bar baz\nline1\nline2\n"


def test_large_stdin_is_streamed(agent: Any) -> None:
    data = "x" * (3 * 1024 * 1024)
    job = agent.exec(command="wc -c", stdin=data).json()
    assert job["stdout"].strip() == str(len(data))


def test_agent_token_is_not_leaked_to_commands(agent_factory: Any) -> None:
    secret_agent = agent_factory(env={"SANDBOX_AGENT_TOKEN": "s3cret"})
    headers = {"Authorization": "Bearer s3cret"}
    resp = secret_agent.request(
        "POST", "/v1/exec?wait=8", json_body={"command": "env"}, headers=headers
    )
    assert resp.status == 200
    assert "s3cret" not in resp.json()["stdout"]
    assert "PATH=" in resp.json()["stdout"]


def test_user_by_name_and_uid(agent: Any) -> None:
    job = agent.exec(command="id -u; id -g; id -G", user="nobody").json()
    assert job["state"] == "exited", job
    uid, gid, groups = job["stdout"].split("\n")[:3]
    assert uid == "65534"
    assert "0" not in groups.split(), "root's groups must not leak to the user"
    assert gid != "0"
    job = agent.exec(command=["id", "-u"], user=4321).json()
    assert job["stdout"].strip() == "4321"


def test_unknown_user_is_400(agent: Any) -> None:
    resp = agent.exec(command="true", user="no-such-user-xyz")
    assert resp.status == 400
    assert resp.json()["error"]["code"] == "bad_request"
    assert "no-such-user-xyz" in resp.json()["error"]["message"]


def test_failed_to_start(agent: Any, tmp_path: Path) -> None:
    job = agent.exec(command=["definitely-not-a-command-xyz"]).json()
    assert job["state"] == "failed"
    assert job["exit_code"] is None
    assert "not found" in job["error"]
    job = agent.exec(command="true", cwd=str(tmp_path / "missing")).json()
    assert job["state"] == "failed"
    assert "does not exist" in job["error"]


def test_wait_zero_returns_202_then_get_waits(agent: Any) -> None:
    resp = agent.exec(wait=0, command="sleep 0.3; echo done")
    assert resp.status == 202
    job = resp.json()
    assert job["state"] == "running"
    assert job["exit_code"] is None
    resp = agent.request("GET", f"/v1/exec/{job['id']}?wait=0")
    assert resp.status == 200
    assert resp.json()["state"] == "running"
    resp = agent.request("GET", f"/v1/exec/{job['id']}?wait=8")
    assert resp.status == 200
    assert resp.json()["state"] == "exited"
    assert resp.json()["stdout"] == "done\n"


def test_wait_returns_202_when_job_outlives_it(agent: Any) -> None:
    resp = agent.exec(wait=0.2, command="sleep 5")
    assert resp.status == 202
    job = agent.request("DELETE", f"/v1/exec/{resp.json()['id']}").json()
    assert job["state"] == "killed"


@pytest.mark.parametrize("wait", ["-1", "8.5", "abc", "nan", "inf"])
def test_bad_wait_is_400(agent: Any, wait: str) -> None:
    resp = agent.request("POST", f"/v1/exec?wait={wait}", json_body={"command": "true"})
    assert resp.status == 400
    assert "wait" in resp.json()["error"]["message"]
    resp = agent.request("GET", f"/v1/exec/nope?wait={wait}")
    assert resp.status == 400


def test_unknown_job_is_404(agent: Any) -> None:
    for method in ("GET", "DELETE"):
        resp = agent.request(method, "/v1/exec/no-such-job")
        assert resp.status == 404
        assert resp.json()["error"]["code"] == "not_found"


def test_idempotent_id_runs_once(agent: Any, tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    body = {"id": "idem-1", "command": f"echo run >> {marker}; sleep 0.2; echo ok"}
    first = agent.exec(wait=0, **body)
    again = agent.exec(wait=8, **body)
    third = agent.exec(wait=8, **body)
    assert first.json()["id"] == again.json()["id"] == third.json()["id"] == "idem-1"
    assert again.json()["stdout"] == "ok\n"
    assert marker.read_text() == "run\n", "the same id must never start a second process"
    conflict = agent.exec(id="idem-1", command=f"echo other >> {marker}")
    assert conflict.status == 409
    assert conflict.json()["error"]["code"] == "id_conflict"
    assert marker.read_text() == "run\n"


async def test_concurrent_same_id_starts_one_process(agent: Any, tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    body = {"id": "idem-concurrent", "command": f"echo run >> {marker}"}
    url = f"http://127.0.0.1:{agent.port}/v1/exec?wait=8"
    async with aiohttp.ClientSession() as session:

        async def post() -> dict[str, Any]:
            async with session.post(url, json=body) as resp:
                assert resp.status == 200
                return dict(await resp.json())

        jobs = await asyncio.gather(*(post() for _ in range(16)))
    assert {j["id"] for j in jobs} == {"idem-concurrent"}
    assert marker.read_text() == "run\n"


def test_missing_id_gets_fresh_ids(agent: Any) -> None:
    ids = {agent.exec(command="true").json()["id"] for _ in range(5)}
    assert len(ids) == 5


def test_head_and_tail_truncation(agent: Any, check_schema: Any) -> None:
    # 10,000 numbered lines (58,890 bytes), kept: 1,000 bytes of head and tail together.
    job = agent.exec(command="seq 1 10000; seq 1 3 >&2", max_output_bytes=1000).json()
    check_schema(job, "Job")
    assert job["stdout_truncated"] is True
    assert job["stderr_truncated"] is False
    assert job["stderr"] == "1\n2\n3\n"
    out = job["stdout"]
    assert out.startswith("1\n2\n3\n")
    assert out.endswith("9999\n10000\n")
    assert "truncated" in out
    head, _, tail = out.partition("\n[... sandbox-agent:")
    assert len(head.encode()) + len(tail.split("...]\n", 1)[1].encode()) <= 1000
    assert len(out) < 1000 + 80


def test_large_output_is_bounded_by_default_limit(agent: Any) -> None:
    # 40 MiB of output against a 16 MiB default limit per stream.
    job = agent.exec(command="head -c 41943040 /dev/zero | tr '\\0' a").json()
    assert job["state"] == "exited"
    assert job["stdout_truncated"] is True
    assert 16 * 1024 * 1024 <= len(job["stdout"]) < 16 * 1024 * 1024 + 100


@pytest.mark.slow  # a one-sided bound on a measured time
def test_timeout_kills_whole_process_tree(agent: Any, tmp_path: Path) -> None:
    script = (
        f"cd {tmp_path}; "
        "sleep 300 & echo $! > child; "
        "(sleep 300 & echo $! > grandchild; wait) & "
        "setsid sleep 300 & echo $! > escaped; "
        "(trap '' TERM; sleep 300) & echo $! > stubborn; "
        "sleep 0.2; echo started; wait"
    )
    start = time.monotonic()
    job = agent.exec(command=script, timeout_s=1).json()
    assert job["state"] == "timeout"
    assert job["exit_code"] is None
    assert job["signal"] in (15, 9)
    assert job["stdout"] == "started\n"
    assert time.monotonic() - start < 8
    pids = [int((tmp_path / name).read_text()) for name in ("child", "grandchild", "escaped")]
    pids.append(int((tmp_path / "stubborn").read_text()))
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == [], "a descendant outlived the timed-out job"


def test_delete_kills_and_is_idempotent(agent: Any, tmp_path: Path) -> None:
    job = agent.exec(wait=0, command=f"sleep 300 & echo $! > {tmp_path}/pid; wait").json()
    pid = wait_for_pid(tmp_path / "pid")
    killed = agent.request("DELETE", f"/v1/exec/{job['id']}").json()
    assert killed["state"] == "killed"
    assert killed["signal"] == 15
    again = agent.request("DELETE", f"/v1/exec/{job['id']}")
    assert again.status == 200
    assert again.json()["state"] == "killed"
    assert wait_gone(pid, 5)
    done = agent.exec(command="true").json()
    unchanged = agent.request("DELETE", f"/v1/exec/{done['id']}").json()
    assert unchanged["state"] == "exited"


@pytest.mark.slow
def test_delete_escalates_to_sigkill_after_grace(agent: Any, tmp_path: Path) -> None:
    """A job that ignores SIGTERM is killed with SIGKILL once the 2 s grace is over (the real
    limit: a one-sided bound, it waited at least the grace, never a window)."""
    ready = tmp_path / "ready"
    job = agent.exec(
        wait=0, command=f"trap '' TERM; sleep 300 & touch {ready}; wait; sleep 300"
    ).json()
    deadline = time.monotonic() + 5
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    start = time.monotonic()
    killed = agent.request("DELETE", f"/v1/exec/{job['id']}").json()
    elapsed = time.monotonic() - start
    assert killed["state"] == "killed"
    assert killed["signal"] == 9
    assert elapsed >= 1.9, "SIGKILL came before the grace was over"


def test_background_process_does_not_hold_job_open(agent: Any) -> None:
    job = agent.exec(command="sleep 30 & echo started").json()
    assert job["state"] == "exited"
    assert job["stdout"] == "started\n"


@pytest.mark.parametrize("services", [True, False])
def test_background_services_keep_their_inherited_output(
    agent: Any, tmp_path: Path, services: bool
) -> None:
    """Gym 0.7.0's `exec(preserve_background_services=True)` (nemo_gym/sandbox/api.py,
    `SupportsSandboxBackgroundServices` in providers/base.py): services a command starts must
    outlive it. With `background_services` the agent keeps reading a service's inherited
    stdout after the job ends; without it the pipe is closed and the next write kills the
    service with SIGPIPE, which is the documented default."""
    pidfile = tmp_path / "svc.pid"
    loop = "while :; do echo tick; sleep 0.05; done"
    job = agent.exec(
        command=f"({loop}) & echo $! > {pidfile}; echo up", background_services=services
    ).json()
    assert job["state"] == "exited"
    assert "up\n" in job["stdout"], "the loop may print before it"
    pid = int(pidfile.read_text())
    # Ten times the loop's period after the pipe was closed (0.1 s after the job ended).
    deadline = time.monotonic() + (1.0 if services else 5.0)
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    try:
        assert alive(pid) is services
    finally:
        if alive(pid):
            os.kill(pid, 9)


def test_background_services_do_not_survive_a_timeout(agent: Any, tmp_path: Path) -> None:
    pidfile = tmp_path / "svc.pid"
    job = agent.exec(
        command=f"sleep 300 & echo $! > {pidfile}; sleep 300",
        background_services=True,
        timeout_s=0.5,
    ).json()
    assert job["state"] == "timeout"
    pid = int(pidfile.read_text())
    assert wait_gone(pid, 5), "a timed-out command takes its whole group with it"
    bad = agent.exec(command="true", background_services="yes")
    assert bad.status == 400
    assert "background_services must be true, false or null" in bad.json()["error"]["message"]


async def test_64_concurrent_jobs(agent: Any, tmp_path: Path) -> None:
    """64 jobs run at once: each waits until all 64 have started (a barrier of files), so jobs
    run one after another would never get past the first (event-driven, no elapsed bound)."""
    url = f"http://127.0.0.1:{agent.port}/v1/exec?wait=8"
    barrier = tmp_path / "started"
    barrier.mkdir()
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def run(i: int) -> dict[str, Any]:
            command = (
                f"touch {barrier}/{i}; "
                f"while [ $(ls {barrier} | wc -l) -lt 64 ]; do sleep 0.2; done; echo job-{i}"
            )
            body = {"command": command, "timeout_s": 25}
            async with session.post(url, json=body) as resp:
                assert resp.status == 200
                return dict(await resp.json())

        jobs = await asyncio.gather(*(run(i) for i in range(64)))
    assert [j["state"] for j in jobs] == ["exited"] * 64, "a job waited for the others to end"
    assert [j["stdout"] for j in jobs] == [f"job-{i}\n" for i in range(64)]
    assert all(j["exit_code"] == 0 for j in jobs)
    assert len({j["id"] for j in jobs}) == 64


def test_finished_jobs_remain_readable(agent: Any) -> None:
    job = agent.exec(command="echo keep").json()
    for _ in range(3):
        again = agent.request("GET", f"/v1/exec/{job['id']}").json()
        assert again == job


def test_job_processes_are_reaped(agent: Any) -> None:
    pid = agent.proc.pid
    for _ in range(10):
        agent.exec(command="true")
    children = [
        p for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == pid and not alive(int(p))
    ]
    assert children == [], "finished jobs left zombies behind"


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return -1
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def test_orphans_are_adopted_and_reaped(agent: Any) -> None:
    job = agent.exec(command="sleep 0.8 >/dev/null 2>&1 & echo $!").json()
    assert job["state"] == "exited"
    orphan = int(job["stdout"])
    assert _ppid(orphan) == agent.proc.pid, "the agent is the subreaper of its jobs' orphans"
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{orphan}"), "the orphan was not reaped (zombie left)"


def test_stdin_not_read_by_a_command_that_exits(agent: Any) -> None:
    job = agent.exec(command="exit 0", stdin="x" * (2 * 1024 * 1024)).json()
    assert job["state"] == "exited"
    assert agent.exec(command="echo still-serving").json()["stdout"] == "still-serving\n"
    assert "Traceback" not in agent.log_text()
