"""Every shell script we ship or generate passes shellcheck.

The stack's steps run as root on an operator's cluster host or a borrowed machine, and the .ci
scripts on a cold CI machine; a quoting slip there deletes the wrong folder. So shellcheck (at
its default severity, following sourced files) checks the scripts in the repository and every
script the stack model writes, for each stack file, as `pulumi up` would run it.
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from ci_policy import missing

from gym_substrate.nemo._capabilities import runtime_check_script
from gym_substrate.stack import host, install_scripts, scripts
from gym_substrate.stack.config import load_stack_file, stack_file
from gym_substrate.stack.render import render_stack

REPO = Path(__file__).resolve().parents[1]
STACK_FILES = sorted(
    p.name[len("Pulumi.") : -len(".yaml")]
    for p in (REPO / "infra" / "stacks").glob("Pulumi.*.yaml")
)
# Arguments the generators take besides the stack config, with values as the components pass.
EXTRA_ARGS = {
    "src_dir": "/tmp/gym-substrate-build",
    "source_hash": "0" * 64,
    "workload_image": "docker.io/library/python:3.12-slim@sha256:" + "a" * 64,
}


def _shellcheck() -> str:
    path = shutil.which("shellcheck")
    if path is None:
        missing(
            "shellcheck is not installed: .ci/install-deps installs it (apt-get install shellcheck)"
        )
    assert path is not None
    return path


def _check(paths: list[str], *extra: str, cwd: Path = REPO) -> None:
    done = subprocess.run(
        [_shellcheck(), "-x", *extra, *paths], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _shell_scripts() -> list[str]:
    """Tracked files that are shell: by shebang, by `# shellcheck shell=`, or named *.sh."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for name in listed:
        path = REPO / name
        if not path.is_file() or path.suffix in {".py", ".md", ".yaml", ".yml", ".json", ".toml"}:
            continue
        head = path.read_bytes()[:200].decode("utf-8", "replace")
        first = head.splitlines()[0] if head else ""
        shebang = first.startswith("#!") and any(s in first for s in ("bash", "/sh"))
        if shebang or name.endswith(".sh") or "# shellcheck shell=" in head:
            found.append(name)
    return found


def test_the_repositorys_shell_scripts_pass_shellcheck() -> None:
    found = _shell_scripts()
    assert {".ci/run", ".ci/lib.sh", "tests/stack/kind_fakes/_record"} <= set(found), found
    _check(found)


def _generators(module: ModuleType) -> list[Callable[..., str]]:
    return [
        fn
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if name.endswith("_script") and fn.__module__ == module.__name__
    ]


@pytest.mark.parametrize("stack", STACK_FILES)
def test_every_step_script_the_stack_writes_passes_shellcheck(stack: str, tmp_path: Path) -> None:
    """The steps `render` writes for the stack, and every other `*_script` it can make."""
    cfg = load_stack_file(stack_file(REPO, stack))
    render_stack(cfg, tmp_path / "render")
    written = [str(p) for p in sorted((tmp_path / "render").glob("scripts/*.sh"))]
    for fn in _generators(scripts) + _generators(install_scripts) + _generators(host):
        params = inspect.signature(fn).parameters
        args = [
            cfg if p == "cfg" else EXTRA_ARGS[p] for p in params if p == "cfg" or p in EXTRA_ARGS
        ]
        try:
            text = fn(*args)
        except AssertionError:  # a host step asked of a stack without a host
            assert cfg.host is None, fn.__name__
            continue
        path = tmp_path / f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}.sh"
        path.write_text(text)
        written.append(str(path))
    assert len(written) >= 10, written
    _check(written, "--shell=bash", cwd=tmp_path)


def test_the_capability_check_passes_shellcheck(tmp_path: Path) -> None:
    path = tmp_path / "check.sh"
    path.write_text(runtime_check_script(("KILL", "NET_BIND_SERVICE"), 1 << 30))
    _check([str(path)], "--shell=sh", cwd=tmp_path)
