"""The background prebuild (gpusteward.sandbox.prebuild) and the per-controller build lock it
relies on: a build of one controller never waits for another's."""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpusteward.sandbox import controllers, prebuild


def test_a_failed_build_is_reported_and_the_rest_still_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def build(name: str) -> Callable[[], None]:
        def run() -> None:
            if name == "keda":
                raise RuntimeError("go build of keda failed")
            built.append(name)
        return run

    monkeypatch.setattr(prebuild, "BUILDS", {n: build(n) for n in prebuild.ORDER})
    assert prebuild.prebuild() == ["keda"]
    assert built == [n for n in prebuild.ORDER if n != "keda"]


def test_the_default_order_is_the_suites_and_leaves_out_thanos() -> None:
    assert prebuild.ORDER[:3] == ("prometheus", "renderers", "sandbox")
    assert prebuild.ORDER.index("jobset") < prebuild.ORDER.index("trainer")  # Trainer needs it
    assert "thanos" not in prebuild.ORDER and "thanos" in prebuild.BUILDS
    assert set(prebuild.ORDER) - {"prometheus", "renderers", "sandbox", "coredns"} == set(
        controllers.CONTROLLERS)


def test_unknown_names_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        prebuild.main(["kueue", "nope"])
    assert stop.value.code == 2
    assert "unknown: nope" in capsys.readouterr().err


def test_a_controller_builds_while_another_holds_its_own_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controllers, "cache_root", lambda: tmp_path)

    def fake_build(go: str, cwd: Path, packages: list[str], ldflags: str, bin_dir: Path,
                   names: list[str], what: str, tags: str = "") -> float:
        bin_dir.mkdir()
        for name in names:
            (bin_dir / name).write_text("#!/bin/sh\n")
            (bin_dir / name).chmod(0o755)
        return 0.0

    monkeypatch.setattr(controllers, "go_build_into", fake_build)
    root = tmp_path / "controllers"
    root.mkdir()
    go_version = subprocess.run([controllers._go(), "version"], check=True, capture_output=True,
                                text=True).stdout.strip()
    key = controllers._key(go_version, controllers.CONTROLLERS["kueue"])
    stale = root / f".tmp-{key}-killed"  # a killed build's
    stale.mkdir()
    with open(controllers.lock_path("keda"), "a") as held:  # KEDA building elsewhere meanwhile
        fcntl.flock(held, fcntl.LOCK_EX)
        done: list[Path] = []
        builder = threading.Thread(target=lambda: done.append(
            controllers.ensure_controller("kueue", log=lambda _m: None)))
        builder.start()
        builder.join(timeout=30)
        assert done and os.access(done[0], os.X_OK), "kueue waited for KEDA's lock"
        assert done[0].parent.name == key
    assert not stale.exists()
