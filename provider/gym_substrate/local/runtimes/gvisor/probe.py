"""Does gVisor work on this machine? Answered once per process by starting a trivial sandbox.

Checking only for the binary would let ``--runtime auto`` pick gVisor on machines where runsc
is installed but cannot start (no root, a platform that hangs, a broken cgroup setup); a real
``runsc run /bin/true`` is the only check that tells the truth. It costs ~0.2 s, once.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from gym_substrate.local.runtimes.gvisor.host import find_cgroups, remove_cgroups

__all__ = ["PROBE_DIR", "gvisor_problem"]

PROBE_DIR = Path("/run/gym-substrate")
_TOOLS = ("ip", "ss", "unshare", "mount", "sh")


def _probe_sandbox() -> str | None:
    runsc = shutil.which("runsc")
    assert runsc is not None
    token = secrets.token_hex(4)
    prefix = f"gsprobe{token}"
    work = PROBE_DIR / f"probe-{token}"
    cid = f"{prefix}-probe.{token}"
    try:
        (work / "bundle").mkdir(parents=True)
        spec = {
            "ociVersion": "1.0.0",
            "process": {
                "terminal": False,
                "user": {"uid": 0, "gid": 0},
                "args": ["/bin/true"],
                "env": ["PATH=/usr/bin:/bin"],
                "cwd": "/",
            },
            "root": {"path": "/", "readonly": False},
            "hostname": "runsc",
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]
            },
        }
        (work / "bundle" / "config.json").write_text(json.dumps(spec))
        try:
            proc = subprocess.run(
                [
                    runsc,
                    f"--root={work / 'state'}",
                    "--network=none",
                    "--overlay2=root:memory",
                    "run",
                    f"--bundle={work / 'bundle'}",
                    cid,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "a trivial runsc sandbox did not finish within 60 s (does the platform hang?)"
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            return f"a trivial runsc sandbox failed: {lines[-1] if lines else proc.returncode}"
        return None
    finally:
        subprocess.run(
            [runsc, f"--root={work / 'state'}", "delete", "--force", cid],
            capture_output=True,
            timeout=30,
            check=False,
        )
        remove_cgroups(find_cgroups(prefix))
        shutil.rmtree(work, ignore_errors=True)


@functools.cache
def gvisor_problem() -> str | None:
    """Why the gVisor runtime cannot run here, or None when it can (cached per process)."""
    if not sys.platform.startswith("linux"):
        return "gVisor needs Linux"
    if shutil.which("runsc") is None:
        return "runsc is not installed (apt-get install -t bookworm-backports runsc)"
    if os.geteuid() != 0:
        return "runsc sandboxes with networking need root"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing host tools: {', '.join(missing)} (apt-get install iproute2 util-linux)"
    try:
        return _probe_sandbox()
    except OSError as exc:
        return f"could not probe runsc: {exc}"
