"""(b) Every method and capability of our provider through Gym's own facades.

    python facades.py async   # nemo_gym.sandbox.AsyncSandbox
    python facades.py sync    # nemo_gym.sandbox.Sandbox (private event loop on a daemon thread)

The provider comes from configs/substrate.yaml through Gym's resolver, as Gym's servers get it.
Paths live under /tmp/gymt-<random>: a gVisor sandbox's /tmp is its own tmpfs, and with the
process runtime it is a fresh folder on the host.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import hashlib
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

from common import Steps, check, provider_config
from nemo_gym.sandbox import AsyncSandbox, Sandbox, SandboxSpec, SandboxStatus, create_provider
from nemo_gym.sandbox.providers import base

MODE = sys.argv[1] if len(sys.argv) > 1 else "async"
CFG = provider_config()
W = f"/tmp/gymt-{uuid.uuid4().hex[:10]}"
LOCAL = Path(tempfile.mkdtemp(prefix="gymt-local-"))
SPEC = SandboxSpec(
    workdir=W,
    env={"K": "v", "SHARED": "spec"},
    files={f"{W}/a.txt": "gym\n", f"{W}/sub/b.txt": "bee\n"},
    metadata={"test": "gym-facades"},
    ports=[80],
    resources={"cpu": 1, "memory_mib": 512},
    # Gym's stock terminal-bench and mini-swe configs carry this OpenSandbox option.
    provider_options={"resource_requests": {"cpu": 0.5, "memory_mib": 512}},
)
steps = Steps()


def blob(name: str, size: int) -> tuple[Path, str]:
    path = LOCAL / name
    data = os.urandom(size)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def new_provider() -> object:
    return create_provider(CFG)


# ---------------------------------------------------------------------------------------- async


async def async_main() -> None:
    capabilities = {
        name: isinstance(new_provider(), getattr(base, name))
        for name in (
            "SupportsSandboxPauseResume",
            "ConnectableProvider",
            "SupportsSandboxEndpoint",
            "SupportsSandboxPty",
            "SupportsSandboxBackgroundServices",
        )
        if hasattr(base, name)
    }
    steps.extra["capabilities"] = capabilities

    async def caps() -> str:
        for name in (
            "SupportsSandboxPauseResume",
            "ConnectableProvider",
            "SupportsSandboxEndpoint",
        ):
            check(capabilities.get(name) is True, f"not {name}")
        return json.dumps(capabilities)

    await steps.arun("capabilities", caps)

    box = AsyncSandbox(CFG)
    seen: dict[str, str] = {}

    async def setup(sandbox: AsyncSandbox) -> None:
        r = await sandbox.exec("cat a.txt sub/b.txt; pwd; echo $K")
        seen["setup"] = r.stdout or ""
        check(r.return_code == 0, repr(r))

    async def start_with_setup() -> str:
        check(hasattr(AsyncSandbox, "start_with_setup"), "Gym 0.7.0 has no start_with_setup")
        await box.start_with_setup(SPEC, setup)
        check(seen["setup"] == f"gym\nbee\n{W}\nv\n", f"setup saw {seen['setup']!r}")
        return f"sandbox {box._handle.sandbox_id}; spec.files uploaded by the facade; setup ran"

    await steps.arun("start_with_setup", start_with_setup)

    async def setup_failure_stops() -> str:
        failing = AsyncSandbox(CFG)
        handle_box: dict[str, object] = {}

        async def bad(sandbox: AsyncSandbox) -> None:
            handle_box["h"] = sandbox._handle
            raise RuntimeError("setup failed on purpose")

        try:
            await failing.start_with_setup(SandboxSpec(), bad)
        except RuntimeError as exc:
            check("on purpose" in str(exc), str(exc))
        else:
            raise AssertionError("start_with_setup did not raise")
        probe = new_provider()
        try:
            state = await probe.status(handle_box["h"])
        finally:
            await probe.aclose()
        check(state == SandboxStatus.STOPPED, f"sandbox after a failed setup: {state}")
        return "failed setup -> sandbox stopped (status STOPPED from a fresh provider)"

    await steps.arun("start_with_setup_failure_stops", setup_failure_stops)

    async def exec_results() -> str:
        r = await box.exec("echo out; echo err >&2; exit 3")
        check(
            (r.return_code, r.stdout, r.stderr, r.error_type) == (3, "out\n", "err\n", None),
            repr(r),
        )
        r = await box.exec("pwd; echo $K $SHARED", env={"SHARED": "call"})
        check(r.stdout == f"{W}\nv call\n", repr(r))
        r = await box.exec("pwd", cwd="sub")
        check(r.stdout == f"{W}/sub\n", f"relative cwd: {r!r}")
        r = await box.exec("pwd", cwd="/")
        check(r.stdout == "/\n", repr(r))
        r = await box.exec("echo default-timeout", timeout_s=None)
        check(r.return_code == 0, repr(r))
        r = await box.exec("id -u", user="root")
        check(r.stdout == "0\n", f"user=root: {r!r}")
        return "exit codes, stdout/stderr, env merge, cwd (absolute, relative), user"

    await steps.arun("exec", exec_results)

    async def exec_timeout() -> str:
        r = await box.exec("sleep 30", timeout_s=1)
        check((r.return_code, r.error_type) == (125, "timeout"), repr(r))
        check("timed out" in (r.stderr or ""), f"timeout stderr {r.stderr!r}")
        timeout_stderr = r.stderr
        r = await box.exec("echo never", timeout_s=0)
        check((r.return_code, r.error_type) == (125, "timeout"), f"timeout_s=0: {r!r}")
        r = await box.exec("echo still-alive")
        check(r.stdout == "still-alive\n", repr(r))
        return f"125/timeout, stderr {timeout_stderr!r}"

    await steps.arun("exec_timeout", exec_timeout)

    async def transfer() -> str:
        src, digest = blob("big.bin", 3 * 1024 * 1024 + 17)
        await box.upload(src, f"{W}/big.bin")
        r = await box.exec("sha256sum big.bin")
        check(r.stdout.split()[0] == digest, f"sandbox sha {r.stdout!r}")
        out = LOCAL / "big.back"
        await box.download(f"{W}/big.bin", out)
        check(sha(out) == digest, "download differs")
        await box.upload(src, "rel/up.bin")  # relative: under the workdir
        r = await box.exec(f"test -f {W}/rel/up.bin && echo yes")
        check(r.stdout == "yes\n", f"relative upload target: {r!r}")
        await box.download("a.txt", LOCAL / "a.txt")
        check((LOCAL / "a.txt").read_text() == "gym\n", "relative download")
        missing = LOCAL / "missing.out"
        try:
            await box.download(f"{W}/no-such-file", missing)
        except Exception as exc:  # noqa: BLE001
            check(not missing.exists(), "a failed download left a file")
            return f"3 MiB both ways; missing file -> {type(exc).__name__}: {exc}"
        raise AssertionError("downloading a missing file did not raise")

    await steps.arun("upload_download", transfer)

    async def concurrent_uploads() -> str:
        files = [blob(f"c{i}.bin", 256 * 1024 + i) for i in range(8)]
        await asyncio.gather(*(box.upload(p, f"{W}/conc/{p.name}") for p, _ in files))
        r = await box.exec("sha256sum conc/*.bin")
        got = {line.split()[1].rsplit("/", 1)[1]: line.split()[0] for line in r.stdout.splitlines()}
        check(got == {p.name: d for p, d in files}, f"sandbox has {got}")
        return "8 concurrent uploads to one handle, all intact"

    await steps.arun("concurrent_uploads", concurrent_uploads)

    async def status_endpoint() -> str:
        check(await box.status() == SandboxStatus.RUNNING, "not RUNNING")
        ep = await box.endpoint(80)
        check(isinstance(ep, base.SandboxEndpoint), repr(ep))
        check("ate-target-actor" in ep.headers, repr(ep))
        return f"RUNNING; endpoint {ep.endpoint} ate-target-actor={ep.headers['ate-target-actor']}"

    await steps.arun("status_endpoint", status_endpoint)

    async def pause_resume() -> str:
        await box.exec("echo kept > kept.txt")
        await box.pause()
        state = await box.status()
        check(state == SandboxStatus.PAUSED, f"after pause: {state}")
        await box.resume()
        check(await box.status() == SandboxStatus.RUNNING, "after resume")
        r = await box.exec("cat kept.txt; echo $K")
        check(r.stdout == "kept\nv\n", repr(r))
        return "PAUSED, then RUNNING with files and env intact"

    await steps.arun("pause_resume", pause_resume)

    other_by_id: dict[str, AsyncSandbox] = {}

    async def serialize_connect() -> str:
        desc = json.loads(json.dumps(await box.serialize()))
        other = await AsyncSandbox.connect(desc, provider=new_provider())
        r = await other.exec("cat a.txt; pwd; echo $K")
        check(r.stdout == f"gym\n{W}\nv\n", f"connect(descriptor): {r!r}")
        await other.disconnect()
        # Gym's terminus and opencode sandboxed agents reattach by id alone.
        by_id = await AsyncSandbox.connect(
            {"sandbox_id": box._handle.sandbox_id}, provider=new_provider()
        )
        r = await by_id.exec("pwd; echo $K")
        check(r.stdout == f"{W}\nv\n", f"connect({{sandbox_id}}) lost workdir/env: {r!r}")
        other_by_id["box"] = by_id
        return f"descriptor keys {sorted(desc)}; by id: workdir and env restored"

    await steps.arun("serialize_connect", serialize_connect)

    async def disconnect() -> str:
        try:
            await box.disconnect()
        except RuntimeError as exc:
            check("connect" in str(exc), str(exc))
        else:
            raise AssertionError("disconnect() of a started (not connected) sandbox did not raise")
        r = await box.exec("echo alive")
        check(r.stdout == "alive\n", "the sandbox died with a disconnect")
        return "disconnect() keeps the sandbox; refused for the owner"

    await steps.arun("disconnect", disconnect)

    async def stop_twice() -> str:
        await box.stop()
        await box.stop()
        check(await box.status() == SandboxStatus.STOPPED, "facade status after stop")
        # The agent's connected copy stops after the owner did (terminus does exactly this).
        by_id = other_by_id["box"]
        await by_id.stop()
        await by_id.stop()
        probe = new_provider()
        try:
            await probe.close(box._handle)  # provider-level close of a gone sandbox
            await probe.close(box._handle)
            state = await probe.status(box._handle)
        finally:
            await probe.aclose()
        check(state == SandboxStatus.STOPPED, f"provider status {state}")
        return "facade stop x2, connected copy stop x2, provider close x2: no error"

    await steps.arun("stop_twice", stop_twice)

    async def create_failure() -> str:
        failing = AsyncSandbox(CFG)
        try:
            await failing.start(SandboxSpec(image="registry.invalid/not-mapped:1"))
        except base.SandboxCreateError as exc:
            return f"{type(exc).__name__} (a SandboxCreateError): {exc}"
        raise AssertionError("an unmapped image did not fail create()")

    await steps.arun("create_failure", create_failure)

    async def bad_option() -> str:
        failing = AsyncSandbox(CFG)
        try:
            await failing.start(SandboxSpec(provider_options={"no_such_option": 1}))
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        raise AssertionError("an unknown provider option was accepted")

    await steps.arun("unknown_provider_option", bad_option)


# ----------------------------------------------------------------------------------------- sync


def sync_main() -> None:
    box = Sandbox(CFG)

    def start() -> str:
        box.start(SPEC)
        r = box.exec("cat a.txt sub/b.txt; pwd; echo $K")
        check(r.stdout == f"gym\nbee\n{W}\nv\n", repr(r))
        return "started; spec.files, workdir and env in place"

    steps.run("start", start)

    def exec_results() -> str:
        r = box.exec("echo out; echo err >&2; exit 7", env={"X": "1"})
        check((r.return_code, r.stdout, r.stderr) == (7, "out\n", "err\n"), repr(r))
        r = box.exec("sleep 30", timeout_s=1)
        check((r.return_code, r.error_type) == (125, "timeout"), repr(r))
        check("timed out" in (r.stderr or ""), repr(r))
        r = box.exec("pwd", cwd="sub", user="root")
        check(r.stdout == f"{W}/sub\n", repr(r))
        return "exit code, streams, timeout, relative cwd"

    steps.run("exec", exec_results)

    def transfer() -> str:
        src, digest = blob("s.bin", 1024 * 1024 + 3)
        box.upload(src, f"{W}/s.bin")
        out = LOCAL / "s.back"
        box.download(f"{W}/s.bin", out)
        check(sha(out) == digest, "roundtrip differs")
        return "1 MiB roundtrip"

    steps.run("upload_download", transfer)

    def threaded_uploads() -> str:
        files = [blob(f"t{i}.bin", 128 * 1024 + i) for i in range(6)]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda f: box.upload(f[0], f"{W}/thr/{f[0].name}"), files))
        r = box.exec("sha256sum thr/*.bin")
        got = {line.split()[1].rsplit("/", 1)[1]: line.split()[0] for line in r.stdout.splitlines()}
        check(got == {p.name: d for p, d in files}, f"sandbox has {got}")
        return "6 uploads from 6 threads into one sync handle"

    steps.run("concurrent_uploads", threaded_uploads)

    def pause_resume() -> str:
        check(box.status() == SandboxStatus.RUNNING, "not RUNNING")
        box.pause()
        check(box.status() == SandboxStatus.PAUSED, f"after pause: {box.status()}")
        box.resume()
        check(box.status() == SandboxStatus.RUNNING, "after resume")
        r = box.exec("cat a.txt")
        check(r.stdout == "gym\n", repr(r))
        return "PAUSED -> RUNNING"

    steps.run("pause_resume", pause_resume)

    def endpoint() -> str:
        ep = box.endpoint(80)
        check("ate-target-actor" in ep.headers, repr(ep))
        return ep.endpoint

    steps.run("endpoint", endpoint)

    def stop_twice() -> str:
        box.stop()
        box.stop()
        check(box.status() == SandboxStatus.STOPPED, "after stop")
        return "stop x2"

    steps.run("stop_twice", stop_twice)

    def context_manager() -> str:
        with Sandbox(CFG).start(SandboxSpec(env={"CM": "1"})) as cm:
            r = cm.exec("echo $CM")
            check(r.stdout == "1\n", repr(r))
        check(cm.status() == SandboxStatus.STOPPED, "not stopped by __exit__")
        return "with Sandbox(...).start(...) stops at exit"

    steps.run("context_manager", context_manager)

    def create_failure() -> str:
        failing = Sandbox(CFG)
        try:
            failing.start(SandboxSpec(image="registry.invalid/not-mapped:1"))
        except base.SandboxCreateError as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            failing.stop()
        raise AssertionError("an unmapped image did not fail")

    steps.run("create_failure", create_failure)


if MODE == "async":
    asyncio.run(async_main())
else:
    sync_main()
gc.collect()
steps.extra["mode"] = MODE
steps.finish()
