"""Notifications: what a notice says (core/reclaim/notice.py), the two payloads
(adapters/webhook.py), and the outbox's once-only, retrying, bounded delivery
(reclaimer/outbox.py) to a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from gpusteward.adapters.errors import SettingsError
from gpusteward.adapters.webhook import Webhooks, payload, read_url
from gpusteward.core.policy import PolicyError, parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import Owner
from gpusteward.core.reclaim.notice import from_cycle
from gpusteward.core.times import HOUR, stamp
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from gpusteward.reclaimer.outbox import PENDING, SENT, Entry, Outbox
from gpusteward.sandbox.receiver import Receiver
from tests.unit.test_reclaim_decide import NOW, POLICY, gpu_pod, snapshot, warned


def cycle_notices(pods, results, owners=None):
    snap = snapshot(pods, owners=owners)
    decided = plan(snap, POLICY)
    return decided, from_cycle(decided, results(decided), snap.owners, POLICY, NOW)


def test_a_warning_says_the_evidence_the_deadline_and_how_to_snooze():
    _, [n] = cycle_notices([gpu_pod("p", annotations={"gpusteward.io/idle-since": stamp(NOW)})],
                           lambda d: ["done"] * len(d.actions))
    assert (n.event, n.workload, n.pod, n.team) == ("warned", "ml/Pod/p", "ml/p", "ml")
    assert (n.peak_percent, n.coverage, n.window_seconds) == (1.0, 1.0, 1800.0)
    assert n.deadline == NOW + 900  # the default grace
    assert n.snooze == ("kubectl annotate --overwrite -n ml pod/p "
                        "gpusteward.io/reclaim-snooze-until=8h")
    assert "start it again from its manifest" in n.restore
    assert n.id == f"warned/p/{stamp(NOW + 900)}"


def test_reclaimed_and_blocked_name_the_workload_and_how_to_get_it_back():
    owner = Owner("Deployment", "ml", "serve", ("p",))
    _, [n] = cycle_notices([warned("p")], lambda d: ["done"], {"p": owner})
    assert (n.event, n.workload, n.id) == ("reclaimed", "ml/Deployment/serve", "reclaimed/p")
    assert n.restore == ("kubectl annotate --overwrite -n ml deployment/serve "
                         "gpusteward.io/restore=true")
    _, [b] = cycle_notices([warned("p")], lambda d: ["blocked"])
    assert (b.event, b.id) == ("blocked", "blocked/p")


@pytest.mark.parametrize("result", ["skipped", "stale", "fenced", "error", "forbidden"])
def test_nothing_is_notified_for_what_was_not_carried_out(result):
    assert cycle_notices([warned("p")], lambda d: [result])[1] == []


def _notice():
    return cycle_notices([gpu_pod("p", annotations={"gpusteward.io/idle-since": stamp(NOW)})],
                         lambda d: ["done"])[1][0]


def test_the_json_payload_carries_every_field_with_rfc3339_times():
    body = json.loads(payload(_notice(), "json"))
    assert body["event"] == "warned" and body["workload"] == "ml/Pod/p"
    assert body["time"] == stamp(NOW) and body["deadline"] == stamp(NOW + 900)
    assert {"peakPercent", "coverage", "windowSeconds", "snooze", "restore", "id"} <= set(body)


def test_the_slack_payload_is_an_incoming_webhook_text_message():
    body = json.loads(payload(_notice(), "slack"))
    assert set(body) == {"text", "blocks"}
    assert "`ml/Pod/p`" in body["text"] and "peak 1.0% over 1800s" in body["text"]
    assert "gpusteward.io/reclaim-snooze-until=8h" in body["text"]
    assert body["blocks"][0]["text"] == {"type": "mrkdwn", "text": body["text"]}


def test_a_url_file_that_is_missing_or_holds_no_url_is_named_not_shown(tmp_path):
    policy = parse_policy({"notifications": {"sinks": [
        {"name": "ops", "urlFile": str(tmp_path / "missing")}]}})
    with pytest.raises(SettingsError, match="'ops': urlFile .*missing cannot be read"):
        read_url(policy.notifications.sinks[0])
    (tmp_path / "bad").write_text("hooks.example/secret-token")
    sink = msgspec.structs.replace(policy.notifications.sinks[0], url_file=str(tmp_path / "bad"))
    with pytest.raises(SettingsError, match="does not hold one http") as e:
        read_url(sink)
    assert "secret-token" not in str(e.value)


def test_sinks_are_checked_with_their_paths():
    with pytest.raises(PolicyError) as e:
        parse_policy({"notifications": {"sinks": [
            {"name": "a", "urlFile": "https://hooks.example/T0/B0/x"},
            {"name": "a", "format": "teams"}], "timeout": "2h"}})
    assert {k.keys for k in e.value.errors} == {
        ("notifications", "sinks", 0, "urlFile"), ("notifications", "sinks", 1, "name"),
        ("notifications", "sinks", 1, "format"), ("notifications", "timeout")}


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def receiver():
    r = Receiver()
    r.hang_for = 3
    yield r
    r.close()


def outbox(tmp_path, receiver, **settings):
    url = receiver.url_file(tmp_path)
    policy = parse_policy({"notifications": {"sinks": [
        {"name": "ops", "urlFile": str(url)},
        {"name": "chat", "format": "slack", "urlFile": str(url), "events": ["reclaimed"]}],
        "timeout": "1s", **settings}})
    clock = Clock()
    box = Outbox(policy.notifications, Webhooks(1.0), None, ReclaimerMetrics(), clock)
    return box, clock


async def nothing() -> None:
    pass


async def test_each_notice_reaches_each_sink_that_wants_it_once(tmp_path, receiver):
    box, _ = outbox(tmp_path, receiver)
    n = _notice()
    box.offer([n])
    box.offer([n])  # the same transition again (another cycle, another replica): once
    await box.round(nothing)
    await box.round(nothing)
    assert [b["id"] for b in receiver.bodies()] == [n.id]
    assert receiver.keys == [n.id]
    assert box.metrics.notices.labels("ops", "warned", "sent")._value.get() == 1
    await box.deliver.close()


@pytest.mark.parametrize("mode", ["fail", "hang"])
async def test_a_failing_receiver_gets_the_message_later_with_backoff(tmp_path, receiver,
                                                                      mode):
    box, clock = outbox(tmp_path, receiver)
    receiver.mode = mode
    box.offer([_notice()])
    await box.round(nothing)
    await box.round(nothing)  # within the backoff: not tried again
    assert receiver.attempts == 1 and receiver.bodies() == []
    assert box.metrics.notice_errors.labels("ops")._value.get() == 1
    assert box.metrics.notices_pending.labels("ops")._value.get() == 1
    receiver.mode = "ok"
    clock.now += 1.5
    await box.round(nothing)
    assert len(receiver.bodies()) == 1
    assert box.metrics.notices_pending.labels("ops")._value.get() == 0
    await box.deliver.close()


async def test_a_message_undelivered_for_retry_for_is_given_up_and_counted(tmp_path, receiver):
    box, clock = outbox(tmp_path, receiver, retryFor="1m")
    receiver.mode = "fail"
    box.offer([_notice()])
    await box.round(nothing)
    clock.now += 2 * HOUR
    receiver.mode = "ok"
    await box.round(nothing)
    assert receiver.bodies() == []
    assert box.metrics.notices.labels("ops", "warned", "failed")._value.get() == 1
    await box.deliver.close()


async def test_a_full_queue_drops_and_counts_never_waits(tmp_path, receiver):
    box, _ = outbox(tmp_path, receiver, queueSize=1)
    first = _notice()
    second = msgspec.structs.replace(first, id="other")
    box.offer([first, second])
    assert box.metrics.notices.labels("ops", "warned", "dropped")._value.get() == 1
    await asyncio.wait_for(box.round(nothing), 10)
    assert [b["id"] for b in receiver.bodies()] == [first.id]
    await box.deliver.close()


async def test_messages_waiting_for_a_receiver_long_down_are_bounded(tmp_path, receiver):
    box, _ = outbox(tmp_path, receiver, queueSize=2)
    receiver.mode = "fail"
    first = _notice()
    for i in range(3):
        box.offer([msgspec.structs.replace(first, id=f"n{i}")])
        await box.round(nothing)
    assert box.metrics.notices.labels("ops", "warned", "dropped")._value.get() == 1
    assert box.metrics.notices_pending.labels("ops")._value.get() == 2
    await box.deliver.close()


def test_a_delivery_state_this_version_does_not_know_reads_as_settled():
    """The outbox ConfigMap keeps each delivery's state word; one a newer reclaimer wrote (or a
    hand edit) decodes to a stand-in that is neither pending nor sent, and is written back as
    it was read."""
    raw = msgspec.json.encode([{"key": "ops/n1", "sink": "ops", "state": "bounced", "at": NOW},
                               {"key": "ops/n2", "sink": "ops", "state": "pending", "at": NOW}])
    later, waiting = msgspec.json.decode(raw, type=list[Entry])
    assert later.state not in (PENDING, SENT) and waiting.state is PENDING
    written = msgspec.json.decode(msgspec.json.encode([later, waiting]))
    assert [e["state"] for e in written] == ["bounced", "pending"]
