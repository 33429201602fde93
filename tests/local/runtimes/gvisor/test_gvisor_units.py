"""Pure checks of the gVisor layer's building blocks (no runsc, no root needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gym_substrate.local.runtimes.base import RuntimeConfig
from gym_substrate.local.runtimes.gvisor.bundle import masks_for, write_actor_id, write_bundle
from gym_substrate.local.runtimes.gvisor.freezer import FreezeTier, parse_frozen_memory
from gym_substrate.local.runtimes.gvisor.net import NetError, host_if_name, netns_name
from gym_substrate.local.runtimes.gvisor.runsc import check_container_id


def test_bundle_carries_the_workarounds_and_safety_settings(tmp_path: Path) -> None:
    run_ate = tmp_path / "run-ate"
    write_actor_id(run_ate, "actor-1")
    write_bundle(
        tmp_path / "bundle",
        rootfs=Path("/"),
        args=["/usr/bin/python3", "-m", "sandbox_agent"],
        env=[("A", "b")],
        netns_path=Path("/run/netns/gt1-w0"),
        run_ate_dir=run_ate,
        etc_dir=tmp_path / "etc",
        mask_dirs=["/tmp"],
        mask_files=["/etc/shadow"],
    )
    spec = json.loads((tmp_path / "bundle" / "config.json").read_text())
    # Workaround 2: the netns is named in the spec, never entered with `ip netns exec`.
    assert {"type": "network", "path": "/run/netns/gt1-w0"} in spec["linux"]["namespaces"]
    # readonly: true would switch --overlay2 off (EROFS); writes stay in sentry memory.
    assert spec["root"] == {"path": "/", "readonly": False}
    mounts = {m["destination"]: m for m in spec["mounts"]}
    resolv = Path(mounts["/etc/resolv.conf"]["source"]).read_text()
    assert resolv == "nameserver 127.0.0.1\n"
    assert mounts["/run/ate"]["source"] == str(run_ate)
    assert "ro" in mounts["/run/ate"]["options"]
    assert (run_ate / "actor-id").read_text() == "actor-1"  # no trailing newline, as atelet
    assert mounts["/tmp"]["type"] == "tmpfs"
    assert Path(mounts["/etc/shadow"]["source"]).read_text() == ""
    assert spec["process"]["env"][1:] == ["A=b"]
    assert spec["process"]["args"] == ["/usr/bin/python3", "-m", "sandbox_agent"]


def test_masks_hide_state_but_never_the_interpreter(tmp_path: Path) -> None:
    state = tmp_path / "state"
    venv = state / "venv"
    venv.mkdir(parents=True)
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    dirs, _ = masks_for([snaps, state], keep_visible=[venv / "bin" / "python"])
    assert str(snaps.resolve()) in dirs or any(str(snaps.resolve()).startswith(d) for d in dirs)
    assert not any(str(venv.resolve()).startswith(d + "/") for d in dirs if d != "/")
    # Nested candidates collapse into the outer one.
    dirs, _ = masks_for([snaps, snaps / "x"])
    assert len([d for d in dirs if d.startswith(str(snaps.resolve()))]) <= 1


def test_container_ids_can_never_be_prefixes_of_each_other() -> None:
    assert check_container_id("gt1-ns-a.0123abcd")
    for bad in (
        "gt1-a",
        "gt1-a.123",
        "gt1-a.0123abcde",
        "-x.0123abcd",
        "a/b.0123abcd",
        "gt1-a.0123abcd\n",
    ):
        with pytest.raises(ValueError, match="8 hex digits"):
            check_container_id(bad)


def test_names_fit_linux_limits() -> None:
    assert netns_name("gs1a2b3c", 3) == "gs1a2b3c-w3"
    assert host_if_name("gs1a2b3c", 127) == "gs1a2b3ch127"
    with pytest.raises(NetError, match="15 characters"):
        host_if_name("abcdefghijk", 12345)


def test_runtime_rejects_bad_config(tmp_path: Path) -> None:
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime

    with pytest.raises(ValueError, match="lowercase letters or digits"):
        GvisorRuntime(RuntimeConfig(tmp_path, "Bad-Prefix", 1))
    with pytest.raises(ValueError, match="compression"):
        GvisorRuntime(RuntimeConfig(tmp_path, "gt1", 1, {"gvisor.compression": "zip"}))


def test_frozen_memory_sizes_are_parsed_and_bad_ones_named() -> None:
    assert parse_frozen_memory("512M") == 512 * 2**20
    assert parse_frozen_memory("2GiB") == 2 * 2**30
    assert parse_frozen_memory("1048576") == 2**20
    assert parse_frozen_memory("0") == 0
    for bad in ("-1G", "lots", "", "nanM"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_frozen_memory(bad)


def test_a_bad_pause_tier_or_freezer_is_named() -> None:
    with pytest.raises(ValueError, match="gvisor.pause_tier 'sleep' is not one of"):
        FreezeTier(None, {"gvisor.pause_tier": "sleep"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gvisor.freezer 'ice' is not one of"):
        FreezeTier(None, {"gvisor.freezer": "ice"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not a size"):
        FreezeTier(None, {"gvisor.frozen_memory": "a lot"})  # type: ignore[arg-type]


def test_up_names_a_bad_frozen_memory_before_starting(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gym_substrate.cli.local import local

    result = CliRunner().invoke(
        local, ["up", "--state-dir", str(tmp_path / "state"), "--frozen-memory", "lots"]
    )
    assert result.exit_code != 0
    assert "--frozen-memory: frozen memory 'lots' is not a size" in result.output
    assert not (tmp_path / "state").exists()  # refused before anything was made


def test_a_freeze_that_does_not_settle_is_thawed_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cgroup v1 stays FREEZING while a task cannot be frozen (seen once in 60 runs under load):
    each attempt that does not settle is thawed before the next, and the last leaves it thawed."""
    from gym_substrate.local.runtimes.gvisor import cgfreeze

    monkeypatch.setattr(cgfreeze, "_FREEZE_SETTLE_S", 0.01)
    monkeypatch.setattr(cgfreeze.time, "sleep", lambda seconds: None)  # the retries' backoff
    knob = tmp_path / "freezer.state"
    reads: list[str] = []
    settles_after = {"thaws": 2}

    class Stubborn(cgfreeze.CgroupFreezer):
        def frozen(self) -> bool:
            state = self.knob.read_text().strip()
            reads.append(state)
            return state == "FROZEN" and reads.count("THAWED") >= settles_after["thaws"]

    knob.write_text("THAWED")
    Stubborn(1, tmp_path).freeze()  # settles on the third attempt
    assert knob.read_text() == "FROZEN"
    assert reads.count("THAWED") == 2

    reads.clear()
    settles_after["thaws"] = 99  # never settles
    with pytest.raises(cgfreeze.FreezeError, match="did not become FROZEN"):
        Stubborn(1, tmp_path).freeze()
    assert knob.read_text() == "THAWED"  # not left half frozen
    assert reads.count("THAWED") == 4


def test_without_nftables_the_freeze_tier_switches_itself_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freeze tier keeps worker IPs with an nftables map; without `nft` PauseActor
    checkpoints, and the runtime's warning (printed by `local up`) says so and how to fix it."""
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime, runtime

    freeze = {"gvisor.pause_tier": "freeze"}
    assert GvisorRuntime(RuntimeConfig(tmp_path, "gt1", 1, freeze)).tier.enabled is (
        shutil.which("nft") is not None
    )
    real_which = shutil.which
    monkeypatch.setattr(
        runtime.shutil, "which", lambda name: None if name == "nft" else real_which(name)
    )
    missing = GvisorRuntime(RuntimeConfig(tmp_path, "gt2", 1, freeze))
    assert missing.tier.enabled is False
    warning = missing.warning()
    assert warning is not None
    assert "PauseActor checkpoints" in warning
    assert "apt-get install nftables" in warning
