"""Notifications against the sandbox's real API server: a receiver on 127.0.0.1 gets exactly
one message per transition — also when it hangs or fails for a while, and across a leader
killed mid-way — and no cycle waits for it (docs/operations.md, "Notifications")."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.records import ConfigMapRecords
from gpusteward.adapters.webhook import Webhooks
from gpusteward.core.policy import parse_policy
from gpusteward.reclaimer.outbox import Entry, Outbox
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.procs import Proc, free_port
from gpusteward.sandbox.receiver import Receiver
from tests.e2e.kube import cycle_until, gone, gpu_pod, reasons
from tests.e2e.test_reclaim import _leader, guarded


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def sent_for(receiver: Receiver, namespace: str) -> list[tuple[str, str]]:
    """(event, id) of the messages taken about this namespace's workloads, in order."""
    return [(b["event"], b["id"]) for b in receiver.bodies() if b["namespace"] == namespace]


def with_sink(policy_yaml: dict, url_file, **settings) -> dict:
    return {**policy_yaml, "notifications": {
        "sinks": [{"name": "e2e", "urlFile": str(url_file)}], **settings}}


async def nothing() -> None:
    pass


def cycles_within(metrics, seconds: float) -> float:
    """Cycles that took at most ``seconds`` (a bucket of the cycle-duration histogram)."""
    le = "+Inf" if seconds == float("inf") else str(seconds)
    return next(s.value for m in metrics.cycle.collect() for s in m.samples
                if s.name.endswith("_bucket") and s.labels["le"] == le)


async def test_a_hanging_then_failing_receiver_gets_each_message_once_and_no_cycle_waits(
        sandbox, ns, reclaimer, receiver, tmp_path):
    receiver.mode, receiver.hang_for = "hang", 60
    raw = yaml.safe_load(Path(sandbox.cfg.policy).read_text())
    policy = parse_policy(with_sink(raw, receiver.url_file(tmp_path), timeout="8s"))
    rec = await reclaimer("enforce", policy=policy)
    records = f"e2e-{ns.name}-notifications"
    rec.outbox = Outbox(policy.notifications, Webhooks(8.0), ConfigMapRecords(
        rec.reader.api, "kube-system", records, Entry), rec.metrics)
    delivering = asyncio.create_task(rec.outbox.run(nothing))
    try:
        ns.create_pod(gpu_pod("idle", 1, node="h100-0", util="0"))
        ns.running("idle")
        await cycle_until(rec, "an attempt at the warning", lambda: receiver.attempts >= 1)
        receiver.mode = "fail"  # the hung attempt times out; the next ones get a 500
        await cycle_until(rec, "eviction", lambda: gone(ns, "idle"))
        failed = rec.metrics.notice_errors.labels("e2e")
        await cycle_until(rec, "the hung attempt timed out and a 500 after it",
                          lambda: failed._value.get() >= 2)
        # Every cycle ran while the receiver hung or failed: none took the 8 s timeout.
        assert cycles_within(rec.metrics, 5.0) == cycles_within(rec.metrics, float("inf"))
        assert sent_for(receiver, ns.name) == []
        stored = json.loads(ns.api.get(f"/api/v1/namespaces/kube-system/configmaps/{records}")
                            ["data"]["records"])
        assert {e["state"] for e in stored} == {"pending"}
        receiver.mode = "ok"
        async with asyncio.timeout(60):  # the outbox runs on this loop: wait without blocking it
            while len(sent_for(receiver, ns.name)) < 2:
                await asyncio.sleep(0.5)
        await asyncio.sleep(3)
        [warned, reclaimed] = sent_for(receiver, ns.name)
        assert (warned[0], reclaimed[0]) == ("warned", "reclaimed")
        body = next(b for b in receiver.bodies() if b["id"] == warned[1])
        assert body["workload"] == f"{ns.name}/Pod/idle" and body["deadline"]
        assert body["peakPercent"] is not None and body["windowSeconds"] == 15
        assert "gpusteward.io/reclaim-snooze-until=8h" in body["snooze"]
    finally:
        delivering.cancel()
        await rec.outbox.deliver.close()


def test_one_message_per_transition_across_a_leader_killed_mid_way(sandbox, ns, receiver,
                                                                    tmp_path):
    receiver.mode = "fail"
    raw = yaml.safe_load(Path(sandbox.cfg.policy).read_text())
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(with_sink(raw, receiver.url_file(tmp_path),
                                                    timeout="2s")))
    load_policy(policy_file)
    lease = f"e2e-{ns.name}"
    records = f"/api/v1/namespaces/kube-system/configmaps/{lease}-notifications"
    ports = [free_port(), free_port()]
    procs = []
    for i, port in enumerate(ports):
        argv = [f"--policy={policy_file}" if a.startswith("--policy=") else a
                for a in sandbox.reclaimer_argv(port, name=lease)]
        procs.append(Proc(f"reclaimer-{i}", argv, tmp_path / f"reclaimer-{i}.log").start())
    try:
        wait_for("one leader", lambda: sorted(_leader(p) for p in ports) == [0.0, 1.0],
                 timeout=60)
        ns.create_pod(gpu_pod("idle", 1, node="a100-1", util="0"))
        ns.running("idle")

        def pending_warning() -> bool:
            try:
                entries = json.loads(sandbox.api().get(records)["data"]["records"])
            except Exception:  # not written yet
                return False
            return any(e["notice"] and e["notice"]["namespace"] == ns.name for e in entries
                       if e["state"] == "pending")

        wait_for("the warning recorded as pending", pending_warning, timeout=90)
        leader = procs[[_leader(p) for p in ports].index(1.0)]
        os.killpg(leader.pid, signal.SIGKILL)
        receiver.mode = "ok"
        wait_for("the warning and the reclaim delivered",
                 lambda: len(sent_for(receiver, ns.name)) >= 2, timeout=120)
        time.sleep(6)  # more cycles and rounds of the new leader: nothing more comes
        events = sent_for(receiver, ns.name)
        assert [e for e, _ in events] == ["warned", "reclaimed"], events
        assert len({i for _, i in events}) == 2
        assert gone(ns, "idle")
    finally:
        for p in procs:
            p.stop()


def test_a_sink_whose_url_file_is_missing_stops_the_reclaimer_at_start(sandbox, tmp_path):
    raw = yaml.safe_load(Path(sandbox.cfg.policy).read_text())
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(with_sink(raw, tmp_path / "absent")))
    argv = [f"--policy={policy_file}" if a.startswith("--policy=") else a
            for a in sandbox.reclaimer_argv(free_port(), name="e2e-nourl")]
    proc = Proc("reclaimer", argv, tmp_path / "reclaimer.log").start()
    wait_for("the reclaimer to exit", lambda: not proc.alive(), timeout=60)
    assert proc._popen is not None and proc._popen.returncode == 2
    assert "notifications sink 'e2e': urlFile" in proc.log.read_text()
    assert "cannot be read" in proc.log.read_text()


async def test_a_pdb_blocking_for_many_cycles_is_told_once(sandbox, ns, reclaimer, receiver,
                                                           tmp_path):
    guarded(ns, "guarded", "h100-1")
    raw = yaml.safe_load(Path(sandbox.cfg.policy).read_text())
    policy = parse_policy(with_sink(raw, receiver.url_file(tmp_path)))
    rec = await reclaimer("enforce", policy=policy)
    rec.outbox = Outbox(policy.notifications, Webhooks(5.0), None, rec.metrics)
    try:
        await cycle_until(rec, "three blocked evictions", lambda: reasons(ns, "guarded").count(
            "GPUReclaimBlocked") >= 3)
        await rec.outbox.round(nothing)
        # Young, the pod's due marks were cleared (minPodAge), so it was warned afresh first.
        assert [e for e, _ in sent_for(receiver, ns.name)] == ["warned", "blocked"]
        [body] = [b for b in receiver.bodies() if b["event"] == "blocked"]
        assert body["pod"] == f"{ns.name}/guarded"
    finally:
        await rec.outbox.deliver.close()
