"""`gpusteward sandbox down` stops every process the sandbox started, also those started after
`up` finished: `KEEP=1 make demo` starts the reclaimer last, and `sandbox down` used to report
"sandbox stopped" while that reclaimer ran on, orphaned, against an API server that was gone."""

from __future__ import annotations

import json
import sys

import pytest

from gpusteward.sandbox import cluster
from gpusteward.sandbox.cluster import (
    STOP_ORDER,
    Sandbox,
    SandboxConfig,
    stop_from_state,
    stop_order,
)
from gpusteward.sandbox.controllers import STARTERS
from gpusteward.sandbox.procs import SandboxError, pid_alive, stop_pid

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_process_started_after_up_is_on_record_and_stopped_by_sandbox_down(tmp_path):
    box = Sandbox(SandboxConfig(state_dir=tmp_path, detach=True, log=lambda m: None))
    box.run_process("apiserver", SLEEPER, lambda: True)
    box.save()  # where `up` used to write the record, once
    late = box.run_process("reclaimer", SLEEPER, lambda: True)  # what the demo starts last
    pids = json.loads((tmp_path / "state.json").read_text())["pids"]
    assert set(pids) == {"apiserver", "reclaimer"}
    assert stop_from_state(tmp_path)
    assert not any(pid_alive(p) for p in (late.pid, pids["apiserver"]))


def test_a_component_stopped_on_its_own_leaves_the_record(tmp_path):
    box = Sandbox(SandboxConfig(state_dir=tmp_path, detach=True, log=lambda m: None))
    for name in ("extender", "scheduler"):
        box.run_process(name, SLEEPER, lambda: True)
    box.stop_component("extender")
    assert set(json.loads((tmp_path / "state.json").read_text())["pids"]) == {"scheduler"}
    box.stop()
    assert not (tmp_path / "state.json").exists()


def test_every_controller_the_sandbox_can_start_has_a_place_in_the_stop_order():
    assert set(STARTERS) <= set(STOP_ORDER)


def test_the_stop_order_keeps_a_name_it_does_not_know_and_stops_it_first():
    assert stop_order(["etcd", "agent/gpu-0", "newcomer", "reclaimer"]) == [
        "newcomer", "reclaimer", "agent/gpu-0", "etcd"]


def test_a_process_that_outlives_sigkill_stays_on_record_and_down_says_so(tmp_path,
                                                                          monkeypatch):
    box = Sandbox(SandboxConfig(state_dir=tmp_path, detach=True, log=lambda m: None))
    for name in ("reclaimer", "apiserver"):
        box.run_process(name, SLEEPER, lambda: True)
    stuck = box.procs["apiserver"].pid
    monkeypatch.setattr(cluster, "stop_pid", lambda pid: pid != stuck and stop_pid(pid))
    with pytest.raises(SandboxError, match=f"apiserver \\(pid {stuck}\\)"):
        stop_from_state(tmp_path)
    assert json.loads((tmp_path / "state.json").read_text())["pids"] == {"apiserver": stuck}
    monkeypatch.undo()
    assert stop_from_state(tmp_path)
    assert not pid_alive(stuck)
