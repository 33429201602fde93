"""Driving one Gym arm: the run's folder, Gym's config, its servers, the collection, teardown.

Kept apart from `gym`, which says what a Gym arm is (its config, the task and recording it
runs): this module starts and watches Gym's processes, and `_gym_records` turns what they left
into the arm's records. It reads the task folder (`load_task`) and reports progress
(`GymProgress`), which `gym` re-exports. Every process carries `MARKER` in its environment,
so teardown finds them all, Ray's daemons included, on success, failure and Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._arm_records import Sample
from gym_substrate.lab.experiments._arm_run import (
    actor_names,
    delete_leaked,
    open_atespace,
    status_counts,
)
from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._gym_env import (
    AGENT,
    INSIDE_TASK,
    INSIDE_WORK,
    MARKER,
    READY_LINE,
    RESOURCES,
    SERVER_CONFIGS,
    SERVER_DIRS,
    GymEnv,
    count_lines,
    free_port,
    stop_processes,
)
from gym_substrate.lab.experiments._gym_records import GymRunFacts, gym_result
from gym_substrate.lab.experiments._vocab import PHASES
from gym_substrate.lab.experiments.backend import merged_kwargs


@dataclass
class GymProgress:
    """What the terminal shows while a Gym arm runs."""

    name: str
    stage: str  # "starting servers" | "collecting" | "stopping"
    elapsed_s: float
    rollouts_done: int
    rollouts_total: int
    statuses: dict[str, int]
    phases: dict[str, int]
    failures: int


def load_task(folder: Path) -> dict[str, Any]:
    """A terminal-bench style task folder: task.json (Gym's task row) and tests/test.sh."""
    file = folder / "task.json"
    if not file.is_file() or not (folder / "tests" / "test.sh").is_file():
        raise ExperimentError(
            f"--gym-task {folder}: needs task.json (the task row: responses_create_params, "
            "task_name, docker_image) and tests/test.sh (the verifier)"
        )
    try:
        task = json.loads(file.read_text())
    except ValueError as exc:
        raise ExperimentError(f"--gym-task {file}: not valid JSON ({exc})") from exc
    if not isinstance(task, dict) or not all(
        k in task for k in ("responses_create_params", "task_name", "docker_image")
    ):
        raise ExperimentError(
            f"--gym-task {file}: needs responses_create_params, task_name and docker_image"
        )
    return task


PROCESS_RUNTIME = (
    "--driver gym needs gVisor sandboxes on the local backend (the task writes to /app, "
    "/tests and /logs of its sandbox, and the process runtime gives a sandbox a "
    "read-only root but for its working folder and /tmp): "
    "runsc is not usable here ({reason}); use --runtime gvisor on a host "
    "where runsc works, or --config FILE for a cluster"
)


def provider_kwargs(config: Any, target: Any, inside_work: str, image: str) -> dict[str, Any]:
    """The `sandbox: substrate:` block Gym's provider gets: the target's, with the arm's idle
    policy and a ledger in the run's folder, and the task's image mapped to our template."""
    kwargs = merged_kwargs(
        target.provider_kwargs,
        lifecycle={
            "idle_policy": config.policy,
            "idle_after_s": config.idle_after_s,
            "ledger": f"{inside_work}/ledger.jsonl",
            **({} if config.on_crash is None else {"on_crash": config.on_crash}),
        },
    )
    create = dict(kwargs.get("create") or {})
    templates = dict(create.get("image_templates") or {})
    templates[image] = str(create.get("template") or "local/sandbox")
    create["image_templates"] = templates
    kwargs["create"] = create
    return kwargs


def gym_config(
    config: Any, store: Any, policy_url: str, inside_work: str, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The run's gym.yaml: the replay policy as the model, our provider as the sandbox, and the
    few server settings a 2-core host and a task image's bare shell need."""
    return {
        "policy_base_url": policy_url,
        "policy_api_key": "replay",
        "policy_model_name": store.models[0],
        "skip_venv_if_present": True,
        "uv_venv_dir": f"{inside_work}/venvs",
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "nemo_gym_log_dir": f"{inside_work}/logs",
        RESOURCES: {
            "resources_servers": {
                "terminal_bench_2_1": {
                    "sandbox_config": {
                        "env": {
                            "EXECD_API_GRACE_SHUTDOWN": "50ms",  # the stock config's
                            # A task image's root has an empty home; the local template's
                            # Debian root has root's stock dotfiles, which every login shell
                            # would run (Terminus types into `bash --login`): keep the shell
                            # as bare as in a task image.
                            "HOME": "/tmp",
                        }
                    }
                }
            }
        },
        AGENT: {
            "responses_api_agents": {
                AGENT: {
                    "resources_server": {"name": RESOURCES},
                    # 4 uvicorn workers importing Harbor and litellm is minutes on 2 cores.
                    "num_workers": 1,
                }
            }
        },
        "sandbox": {
            "default_metadata": {"sandbox-api": "substrate", "experiment": config.name},
            "substrate": kwargs,
        },
    }


class GymRun:
    """One Gym arm on one target: the processes it started and what it saw of them."""

    def __init__(
        self,
        config: Any,
        target: Any,
        env: GymEnv,
        folder: Path,
        on_progress: Callable[[GymProgress], None] | None,
        on_note: Callable[[str], None] | None,
    ) -> None:
        if target.runtime == "process":
            raise ExperimentError(PROCESS_RUNTIME.format(reason=target.runtime_reason))
        self.config, self.target, self.env = config, target, env
        self.on_progress, self.on_note = on_progress, on_note
        self.work = (folder / "gym").resolve()
        self.task_dir = config.task.resolve()
        self.inside_work = INSIDE_WORK if env.chroot else str(self.work)
        self.marker = uuid.uuid4().hex
        self.procs: list[subprocess.Popen[bytes]] = []
        self.samples: list[Sample] = []
        self.failures: list[str] = []
        self.proc_env = {
            MARKER: self.marker,
            "XDG_STATE_HOME": f"{self.inside_work}/state",
            # litellm (imported by Harbor) otherwise fetches its model cost map from GitHub.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        self.config_args: list[str] = []
        self.binds: list[tuple[Path, str]] = []
        self.replayer: Any = None

    def _say(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)

    def _prepare(self, scratch: Path) -> dict[str, Any]:
        """The run's folder: logs, state, the servers' venv links and tasks.jsonl; the task."""
        work, env = self.work, self.env
        for sub in ("logs", "state"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        self.binds = [(work, INSIDE_WORK), (self.task_dir, INSIDE_TASK), (scratch, "/tmp")]
        for server_dir in SERVER_DIRS:
            venv = work / "venvs" / server_dir / ".venv"
            venv.parent.mkdir(parents=True, exist_ok=True)
            if not venv.is_symlink():
                venv.symlink_to(env.prefix)  # resolved by Gym's processes, inside the chroot
        task = dict(load_task(self.task_dir))
        task["task_folder"] = INSIDE_TASK if env.chroot else str(self.task_dir)
        (work / "tasks.jsonl").write_text(json.dumps(task) + "\n")
        return task

    async def run(self) -> Any:
        """Serve the replay policy, run Gym against it, stop everything; the `ArmResult`."""
        import yaml
        from aiohttp import web

        from gym_substrate.lab.experiments.replay import REPLAYER, create_app

        # The chroot's /tmp (Ray's session files) must lie outside the work folder: Ray packs
        # the working directory for its workers, and a /tmp inside it packs itself until the
        # disk fills.
        scratch = Path(tempfile.mkdtemp(prefix="gym-substrate-gym-tmp-"))
        task = self._prepare(scratch)
        config = self.config
        replay = create_app(config.store, config.think, seed=config.seed)
        self.replayer = replay[REPLAYER]
        runner = web.AppRunner(replay, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            policy_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
            kwargs = provider_kwargs(
                config, self.target, self.inside_work, str(task["docker_image"])
            )
            yaml_text = yaml.safe_dump(
                gym_config(config, config.store, policy_url, self.inside_work, kwargs),
                sort_keys=False,
            )
            (self.work / "gym.yaml").write_text(yaml_text)
            for path in [
                *(f"{self.env.site}/{c}" for c in SERVER_CONFIGS),
                f"{self.inside_work}/gym.yaml",
            ]:
                self.config_args += ["--config", path]
            facts = await self._drive(kwargs)
        finally:
            stop_processes(self.procs, self.marker)
            await runner.cleanup()
            shutil.rmtree(scratch, ignore_errors=True)
        # 3. What happened, as the synthetic arm's records.
        result = gym_result(config, self.target, self.env, task, self.work, self.replayer, facts)
        log = [asdict(s) for s in self.replayer.log]
        (self.work / "replay-log.json").write_text(json.dumps(log, indent=1))
        return result

    async def _drive(self, kwargs: dict[str, Any]) -> GymRunFacts:
        """Gym's servers, then all rollouts at once, then teardown; what was seen meanwhile."""
        from gym_substrate.lab.experiments._instrument import Instrument, instrumented_provider

        config = self.config
        started = time.monotonic()
        load_start = os.getloadavg()[0]
        async with instrumented_provider(kwargs, Instrument()) as provider:
            atespace = self.target.atespace
            baseline = await open_atespace(provider, atespace)
            # 1. Gym's servers.
            servers_s = await self._wait_for_servers(started)
            self._say(
                f"gym: servers ready after {servers_s:.0f} s; collecting {config.rollouts} rollouts"
            )
            # 2. The rollouts, all at once.
            t0, wall_s, op_log = await self._collect(provider, baseline)
            self._say(f"gym: collection ended after {wall_s:.0f} s; stopping Gym's servers")
            statuses = self.samples[-1].statuses if self.samples else {}
            self._report("stopping", time.monotonic() - t0, statuses)
            left = await asyncio.to_thread(stop_processes, self.procs, self.marker)
            if left:
                self.failures.append(f"processes left after SIGKILL: {len(left)}")
            leaked = await self._leaked(provider, baseline)
            await delete_leaked(provider, atespace, leaked)
        return GymRunFacts(
            t0, wall_s, servers_s, load_start, op_log, leaked, left, self.samples, self.failures
        )

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start one Gym command in its environment, logging to <name>.log in the run folder."""
        env, work = self.env, self.work
        full = env.argv(argv, env=self.proc_env, binds=self.binds, cwd=self.inside_work)
        (work / f"{name}.cmd").write_text(" ".join(full) + "\n")
        with open(work / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(
                full,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env.process_env(self.proc_env),
                cwd=str(work),
            )
        self.procs.append(proc)
        return proc

    def _tail(self, name: str, size: int = 3000) -> str:
        path = self.work / f"{name}.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return text[-size:]

    def _done_files(self) -> list[Path]:
        """Gym's output files: rollouts.jsonl and its failure files, a line per rollout done."""
        return [self.work / "rollouts.jsonl", *sorted(self.work.glob("rollouts*failures*.jsonl"))]

    def _report(self, stage: str, elapsed: float, statuses: dict[str, int]) -> None:
        if self.on_progress is None:
            return
        phases = self.samples[-1].phases if self.samples else dict.fromkeys(PHASES, 0)
        self.on_progress(
            GymProgress(
                self.config.name,
                stage,
                elapsed,
                count_lines(self._done_files()),
                self.config.rollouts,
                statuses,
                phases,
                len(self.failures) + sum(self.replayer.errors.values()),
            )
        )

    async def _wait_for_servers(self, started: float) -> float:
        """Start `gym env start` and wait for its ready line; the seconds that took."""
        config, work = self.config, self.work
        self._say(f"gym: starting Gym's servers ({self.env.describe}); logs in {work}")
        server = self._start("env-start", ["gym", "env", "start", *self.config_args])
        while READY_LINE not in self._tail("env-start", 200_000):
            if server.poll() is not None:
                raise ExperimentError(
                    f"`gym env start` exited ({server.returncode}) before its servers were "
                    f"ready; its log ({work / 'env-start.log'}) ends:\n{self._tail('env-start')}"
                )
            if time.monotonic() - started > config.servers_timeout_s:
                raise ExperimentError(
                    f"Gym's servers were not ready in {config.servers_timeout_s:.0f} s; "
                    f"the log ({work / 'env-start.log'}) ends:\n{self._tail('env-start')}"
                )
            self._report("starting servers", time.monotonic() - started, {})
            await asyncio.sleep(1)
        return time.monotonic() - started

    def _phases(self) -> dict[str, int]:
        """Rollouts by phase, as far as the replay policy and Gym's output files tell."""
        rollouts, replayer = self.config.rollouts, self.replayer
        counts = dict.fromkeys(PHASES, 0)
        begun = sum(1 for s in replayer.log if s.turn == 0) + replayer.thinking
        begun = min(begun, rollouts)
        finished = min(count_lines(self._done_files()), rollouts)
        counts["thinking"] = replayer.thinking
        counts["creating"] = max(0, rollouts - begun)
        counts["executing"] = max(0, begun - finished - replayer.thinking)
        return counts

    async def _collect(
        self, provider: Any, baseline: set[str]
    ) -> tuple[float, float, list[Any] | None]:
        """`gym eval run` of N repeats at concurrency N, sampled until it exits or times out:
        (when it started, its wall seconds, the control plane's operation log)."""
        config, inside_work = self.config, self.inside_work
        atespace = self.target.atespace
        with self.target.operation_log() as operations:
            t0 = time.monotonic()
            collect = self._start(
                "eval-run",
                [
                    "gym", "eval", "run", "--no-serve", *self.config_args,
                    "--agent", AGENT,
                    "--input", f"{inside_work}/tasks.jsonl",
                    "--output", f"{inside_work}/rollouts.jsonl",
                    "--limit", "1",
                    "--num-repeats", str(config.rollouts),
                    "--concurrency", str(config.rollouts),
                ],
            )  # fmt: skip

            async def sample_once() -> None:
                try:
                    statuses = await status_counts(provider, atespace, baseline)
                except Exception:  # a lost sample is not worth failing the arm for
                    return
                self.samples.append(Sample(time.monotonic() - t0, statuses, self._phases()))
                self._report("collecting", time.monotonic() - t0, statuses)

            while collect.poll() is None:
                await sample_once()
                if time.monotonic() - t0 > config.collect_timeout_s:
                    self.failures.append("gym eval run timeout")
                    break
                await asyncio.sleep(config.sample_interval_s)
            wall_s = time.monotonic() - t0
            await sample_once()
            op_log = list(operations) if operations is not None else None
        if collect.returncode not in (0, None):
            self.failures.append(f"gym eval run exit {collect.returncode}")
        return t0, wall_s, op_log

    async def _leaked(self, provider: Any, baseline: set[str]) -> list[str]:
        """The arm's actors still there once the deletes Gym makes on background threads have
        had 30 s to land."""
        atespace = self.target.atespace
        deadline = time.monotonic() + 30
        while True:
            leaked = sorted(await actor_names(provider, atespace) - baseline)
            if not leaked or time.monotonic() > deadline:
                return leaked
            await asyncio.sleep(0.5)
