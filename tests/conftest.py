"""Shared test plumbing: marker-driven skips that name what is missing.

On CI (`CI=true`, set by the CI runner) `.ci/run` installs runsc and starts Docker, so a test
marked `runsc` or `docker` whose component is missing there fails instead of skipping: a skip
in CI would hide a broken install step.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ci_policy import ON_CI as _ON_CI
from fast_lane import FAST_MODULES
from sleep_guard import LIMIT_S, watch_sleeps


def _runsc_problem() -> str | None:
    if shutil.which("runsc") is None:
        return "runsc (gVisor) is not installed; run .ci/install-deps"
    if os.geteuid() != 0:
        return "runsc sandboxes need root"
    return None


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "the docker CLI is not installed; run .ci/install-deps"
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    if probe.returncode != 0:
        return "no Docker engine answers (start dockerd, as .ci/run does)"
    return None


# Built root filesystems live in one fixed folder shared by every test session and checkout on
# the machine (as .ci/gym-env's chroot): the Debian rootfs is debootstrapped once per machine,
# never per test or per tmp state folder. Backends and `local up` subprocesses inherit this.
CACHE_ROOT = os.environ.get("GYM_SUBSTRATE_CACHE") or "/var/cache/gym-substrate"
ROOTFS_CACHE = os.path.join(CACHE_ROOT, "rootfs")
os.environ.setdefault("GYM_SUBSTRATE_ROOTFS_DIR", ROOTFS_CACHE)


def _rootfs_problem() -> str | None:
    if os.geteuid() != 0:
        return "building the Debian sandbox rootfs needs root (debootstrap)"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt install debootstrap; .ci/install-deps does)"
    return None


def _cluster_problem() -> str | None:
    if not os.environ.get("GYM_SUBSTRATE_STACK_CONFIG"):
        return "no live Substrate cluster (set GYM_SUBSTRATE_STACK_CONFIG to a providerConfig file)"
    return None


_CHECKS = {
    "runsc": (_runsc_problem, True),
    "docker": (_docker_problem, True),
    "rootfs": (_rootfs_problem, True),
    "cluster": (_cluster_problem, False),
}


_problems: dict[str, str | None] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the fast lane's tests (`pytest -m fast`; the list is in fast_lane.py). A test of a
    fast module that is marked `slow` (a real limit, a one-sided bound on a measured time) stays
    out of the lane."""
    tests = Path(__file__).resolve().parent
    for item in items:
        if (
            item.path.is_relative_to(tests)
            and item.path.relative_to(tests).as_posix() in FAST_MODULES
            and item.get_closest_marker("slow") is None
        ):
            item.add_marker(pytest.mark.fast)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, (check, required_on_ci) in _CHECKS.items():
        if item.get_closest_marker(marker) is None:
            continue
        if marker not in _problems:
            _problems[marker] = check()
        problem = _problems[marker]
        if problem is None:
            continue
        if _ON_CI and required_on_ci:
            pytest.fail(f"CI must provide {marker}: {problem}", pytrace=False)
        pytest.skip(problem)


@pytest.fixture(autouse=True)
def _no_long_sleep_in_the_fast_lane(request: pytest.FixtureRequest) -> Iterator[None]:
    """A `fast` test whose code really sleeps more than 50 ms at once fails (sleep_guard.py).

    It patches through a MonkeyPatch of its own, not the `monkeypatch` fixture: an autouse
    fixture that requested it would set it up before every other fixture of every test, so a
    test's patches would be undone only after its fixtures' teardown (a backend then closed a
    store a test had replaced)."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch, watch_sleeps(patch.setattr) as long:
        yield
    if long:
        pytest.fail(
            f"the fast lane sleeps at most {LIMIT_S * 1000:g} ms at a time for real, this test "
            f"slept {', '.join(long)}: inject a clock and sleep, or mark the test slow",
            pytrace=False,
        )


# The Go-built toolchain (Pulumi, its Kubernetes provider, a control plane) takes about half an
# hour to build on a cold 2-core machine, and the tests that need it run late in the session.
# Starting `.ci/build-tools` when the session starts lets it use the CPU the earlier tests leave
# idle (they mostly wait on real limits and on sandboxes); it runs niced, and the live tests then
# find the tools built, or wait on build-tools' own lock for what is left. When everything is
# cached it is done in about a second.
_TOOLCHAIN_BUILD: subprocess.Popen[bytes] | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    global _TOOLCHAIN_BUILD
    if not any(item.get_closest_marker("pulumi_cli") for item in session.items):
        return
    log_file = Path(CACHE_ROOT) / "build-tools.log"
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log = log_file.open("wb")
    except OSError:
        return  # the live tests build what they need themselves, and say so if they cannot
    script = Path(__file__).resolve().parent.parent / ".ci" / "build-tools"
    with log:
        _TOOLCHAIN_BUILD = subprocess.Popen(
            ["nice", "-n", "19", "bash", str(script)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A session that ends first (a failure with -x, Ctrl-C) leaves no build running."""
    build = _TOOLCHAIN_BUILD
    if build is None or build.poll() is not None:
        return
    os.killpg(build.pid, signal.SIGTERM)
    try:
        build.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()
