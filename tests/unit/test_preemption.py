"""Which preemption candidates the extender keeps (core/preemption.py), the preempt verb over
HTTP in both nodeCacheCapable modes, and the fields the reclaimer reads to stay out of the
scheduler's way.

Upstream shapes: ExtenderPreemptionArgs / ExtenderPreemptionResult / Victims / MetaVictims /
MetaPod in k8s.io/kube-scheduler/extender/v1/types.go (no JSON tags: Go field names); the
victim condition DisruptionTarget/PreemptionByScheduler as PreemptPod in
pkg/scheduler/framework/preemption/preemption.go writes it.
"""

from __future__ import annotations

import json
import random

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.core.fleet import FleetStore
from gpusteward.core.kubewire import WirePod, to_pod
from gpusteward.core.policy import Preemption, parse_policy
from gpusteward.core.preemption import (
    BUSY,
    IDLE,
    PARTLY_IDLE,
    Candidates,
    Row,
    choose,
    choose_plainly,
    shield_for,
)
from gpusteward.core.reclaim.model import Evidence
from gpusteward.extender.app import Extender, create_app
from gpusteward.extender.preempt import PREEMPTER
from gpusteward.extender.view import PlacementView
from tests.factories import H100, NOW, node, pod

SHIELD = Preemption(protect_busy={"training": ["experiment"]})
EVERY = Preemption(protect_busy={"*": ["*"]})


def cand(name: str, victims: int = 1, idle: int = 0, *, shielded: bool = False,
         pdb: int = 0) -> tuple[str, int, int, int, bool]:
    return name, victims, idle, pdb, shielded


def columns(rows: list[tuple[str, int, int, int, bool]]) -> Candidates:
    nodes, victims, idle, pdb, shielded = (list(col) for col in zip(*rows, strict=True))
    return Candidates.counted(nodes, victims, idle, pdb, shielded)


@pytest.mark.parametrize(
    ("candidates", "policy", "kept", "tier"),
    [
        pytest.param([cand("busy"), cand("idle", idle=1)], Preemption(), ("idle",), IDLE,
                     id="idle-node-beats-busy-node"),
        pytest.param([cand("mixed", 2, 1), cand("busy")], Preemption(), ("mixed",),
                     PARTLY_IDLE, id="partly-idle-beats-busy"),
        pytest.param([cand("a", idle=1), cand("b", idle=1), cand("c")], Preemption(),
                     ("a", "b"), IDLE, id="every-idle-node-left-to-the-scheduler"),
        pytest.param([cand("a", 2), cand("b", 3)], Preemption(), ("a", "b"), BUSY,
                     id="only-busy-all-kept"),
        pytest.param([cand("a", 2, 2), cand("b", 2, 1), cand("c", 2, 2, pdb=2)],
                     Preemption(prefer_idle=False), ("a", "b"), PARTLY_IDLE,
                     id="prefer-idle-off-still-fewest-pdb-violations"),
        pytest.param([cand("busy"), cand("idle", idle=1)], Preemption(prefer_idle=False),
                     ("busy", "idle"), BUSY, id="prefer-idle-off-keeps-all"),
        pytest.param([cand("t", shielded=True)], SHIELD, (), None,
                     id="shielded-only-candidate-preemptor-waits"),
        pytest.param([cand("t", shielded=True), cand("b")], SHIELD, ("b",), BUSY,
                     id="shielded-node-dropped-others-kept"),
        pytest.param([cand("idle-pdb", idle=1, pdb=1), cand("busy")], Preemption(), ("busy",),
                     BUSY, id="fewer-pdb-violations-before-idleness"),
        pytest.param([cand("a", idle=1, pdb=1), cand("b", pdb=1)], Preemption(), ("a",), IDLE,
                     id="equal-pdb-violations-then-idleness"),
    ],
)
def test_choice(candidates, policy, kept, tier):
    choice = choose(columns(candidates), policy)
    assert (choice.kept, choice.tier) == (kept, tier)
    assert choose_plainly(rows(candidates), policy) == choice  # the rule as written
    # Only drops: every kept node is one the scheduler proposed, and nothing is lost silently.
    assert set(choice.kept) | set(choice.vetoed) | set(choice.dropped) == \
        {c[0] for c in candidates}


def rows(candidates: list[tuple[str, int, int, int, bool]]) -> list[Row]:
    return [Row(n, v, i, p, s) for n, v, i, p, s in candidates]


@pytest.mark.parametrize("seed", range(200))
def test_the_packed_columns_choose_as_the_rule_reads_row_by_row(seed):
    """``choose`` (packed flags, whole-column operations) against ``choose_plainly`` (rules 1-3
    one row at a time) on random candidates: equal rows (the fast paths), mixed PDB counts,
    shields, victims from 1 to 4, both preferIdle settings."""
    rng = random.Random(seed)
    count = rng.choice([1, 2, 3, 8, 40])
    same_pdb, shields = rng.random() < 0.5, rng.random() < 0.3
    candidates = []
    for i in range(count):
        victims = rng.randint(1, 4)
        candidates.append(cand(f"n{i:02d}", victims, rng.randint(0, victims),
                               pdb=0 if same_pdb else rng.randint(0, 2),
                               shielded=shields and rng.random() < 0.3))
    policy = Preemption(prefer_idle=rng.random() < 0.7)
    assert choose(columns(candidates), policy) == choose_plainly(rows(candidates), policy)


@pytest.mark.parametrize(
    ("preemptor", "victim_class", "policy", "covered"),
    [
        pytest.param("experiment", "training", SHIELD, True, id="named-pair-shielded"),
        pytest.param("batch", "training", SHIELD, False, id="other-preemptor-not-shielded"),
        pytest.param("experiment", "batch", SHIELD, False, id="other-victim-not-shielded"),
        pytest.param("inference", "batch", EVERY, True, id="wildcards-shield-every-busy-pod"),
        pytest.param("inference", None, EVERY, False,
                     id="pod-unknown-to-gpusteward-left-as-proposed"),
        pytest.param("experiment", "training", Preemption(), False, id="no-policy-no-shield"),
    ],
)
def test_shield(preemptor, victim_class, policy, covered):
    assert shield_for(preemptor, policy).covers(victim_class) is covered


def test_protect_busy_names_only_known_classes():
    with pytest.raises(Exception) as e:
        parse_policy({"preemption": {"protectBusy": {"trainin": ["experiment", "nope"]}}})
    text = str(e.value)
    assert "preemption.protectBusy.trainin" in text and "preemption.protectBusy.trainin[1]" in text


# --- the fields the reclaimer reads -----------------------------------------------------------
def test_nominated_node_and_preemption_condition_are_read_from_the_pod():
    wire = msgspec.json.decode(json.dumps({
        "metadata": {"name": "v", "namespace": "ml", "uid": "u"},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"phase": "Running", "nominatedNodeName": "n2", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "default-scheduler: preempting to accommodate a higher priority pod"}]},
    }), type=WirePod)
    p = to_pod(wire, ["nvidia.com/gpu"])
    assert (p.nominated_node, p.preempted) == ("n2", True)
    evicted = msgspec.structs.replace(wire.status.conditions[0], reason="EvictionByEvictionAPI")
    wire.status.conditions = [evicted]
    assert not to_pod(wire, ["nvidia.com/gpu"]).preempted


# --- the verb over HTTP ------------------------------------------------------------------------
POLICY = parse_policy({"preemption": {"protectBusy": {"training": ["experiment"]}}})
RULE_WINDOW = 1800.0  # reclaim.idle.window in the default policy


class FixedEvidence:
    """Stands in for SnapshotReader.evidence (its queries run against a real Prometheus in
    tests/component/test_reclaim_evidence.py)."""

    def __init__(self, peaks: dict[str, float]):
        self.peaks = peaks
        self.calls = 0

    async def evidence(self, pods, now):
        self.calls += 1
        return {RULE_WINDOW: {k: Evidence(RULE_WINDOW, v, 1.0, 8) for k, v in self.peaks.items()}
                }, True, ""


def preemptor(cls: str | None = None) -> dict:
    labels = {"gpusteward.io/class": cls} if cls else {}
    return {"metadata": {"name": "urgent", "namespace": "ml", "uid": "pre", "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "8"}}}]}}


def full_pod(uid: str, name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid},
            "spec": {"nodeName": "x", "containers": []}}


@pytest.fixture
async def client():
    fleet = FleetStore()
    view = PlacementView(POLICY, fleet, clock=lambda: NOW)
    fleet.replace_all([node("h1", H100), node("h2", H100), node("h3", H100)], [
        pod("idle", node="h1", gpus=8),
        pod("busy", node="h2", gpus=8),
        pod("train", node="h3", gpus=8, labels={"gpusteward.io/class": "training"}),
    ])
    extender = Extender(view, telemetry=None,
                        evidence=FixedEvidence({"ml/idle": 0.0, "ml/busy": 90.0,
                                                "ml/train": 90.0}))
    app = create_app(extender, max_body_bytes=64 << 10)
    async with TestClient(TestServer(app)) as c:
        await app[PREEMPTER].refresh()
        yield c


async def post(client, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await client.post("/preempt", data=data)
    return resp.status, json.loads(await resp.read())


def meta(*uids: str, pdb: int = 0) -> dict:
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}


async def test_meta_victims_keep_only_the_idle_candidate_unchanged(client):
    queries = client.server.app[PREEMPTER].source.calls
    status, body = await post(client, {"Pod": preemptor(), "NodeNameToVictims": None,
                                       "NodeNameToMetaVictims": {
                                           "h1": meta("uid-ml-idle", pdb=0),
                                           "h2": meta("uid-ml-busy")}})
    assert status == 200
    assert body == {"NodeNameToMetaVictims": {"h1": {"Pods": [{"UID": "uid-ml-idle"}],
                                                     "NumPDBViolations": 0}}}
    # Answered from the background refresh: the request ran no query of its own.
    assert client.server.app[PREEMPTER].source.calls == queries


async def test_the_decoded_request_is_freed_after_the_reply(client, monkeypatch):
    """The server drops a request's decoded objects once its reply is written, not before
    and not never (app.py: call_soon after the handler)."""
    preempter = client.server.app[PREEMPTER]
    answered = []
    respond = preempter.respond
    monkeypatch.setattr(preempter, "respond", lambda b: answered.append(respond(b)) or answered[-1])
    status, body = await post(client, {"Pod": preemptor(), "NodeNameToMetaVictims": {
        "h1": meta("uid-ml-idle"), "h2": meta("uid-ml-busy")}})
    assert status == 200 and list(body["NodeNameToMetaVictims"]) == ["h1"]
    assert answered[0].spent == []


async def test_full_victims_are_answered_with_meta_victims(client):
    status, body = await post(client, {"Pod": preemptor(), "NodeNameToMetaVictims": None,
                                       "NodeNameToVictims": {
                                           "h1": {"Pods": [full_pod("uid-ml-idle", "idle")],
                                                  "NumPDBViolations": 0},
                                           "h2": {"Pods": [full_pod("uid-ml-busy", "busy")],
                                                  "NumPDBViolations": 0}}})
    assert status == 200
    assert body == {"NodeNameToMetaVictims": {"h1": {"Pods": [{"UID": "uid-ml-idle"}],
                                                     "NumPDBViolations": 0}}}


async def test_a_shielded_busy_training_pod_leaves_no_candidate(client):
    status, body = await post(client, {"Pod": preemptor("experiment"),
                                       "NodeNameToMetaVictims": {"h3": meta("uid-ml-train")}})
    assert (status, body) == (200, {"NodeNameToMetaVictims": {}})
    metrics = (await (await client.get("/metrics")).read()).decode()
    assert 'gpusteward_extender_preemption_answers_total{kept="none"} 1.0' in metrics
    assert 'gpusteward_extender_preemption_dropped_nodes_total{why="protected"} 1.0' in metrics


async def test_unknown_evidence_counts_as_busy(client):
    # "fresh" was bound after the last evidence refresh: busy until judged, so the idle node
    # wins; and being a training pod seen by the watch, it is shielded from an experiment.
    client.server.app[PREEMPTER].fleet.upsert_pod(
        pod("fresh", node="h2", gpus=8, labels={"gpusteward.io/class": "training"}))
    status, body = await post(client, {"Pod": preemptor(), "NodeNameToMetaVictims": {
        "h1": meta("uid-ml-idle"), "h2": meta("uid-ml-fresh")}})
    assert (status, list(body["NodeNameToMetaVictims"])) == (200, ["h1"])
    status, body = await post(client, {"Pod": preemptor("experiment"), "NodeNameToMetaVictims": {
        "h2": meta("uid-ml-fresh")}})
    assert (status, body) == (200, {"NodeNameToMetaVictims": {}})


async def test_unknown_victims_are_left_as_the_scheduler_proposed(client):
    # A pod the watch has not delivered: no class, no evidence -> busy, never shielded.
    status, body = await post(client, {"Pod": preemptor("experiment"),
                                       "NodeNameToMetaVictims": {"h9": meta("who", pdb=2)}})
    assert (status, body) == (200, {"NodeNameToMetaVictims": {
        "h9": {"Pods": [{"UID": "who"}], "NumPDBViolations": 2}}})


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"", "empty body", id="empty"),
        pytest.param(b"{", "malformed JSON", id="not-json"),
        pytest.param({"NodeNameToMetaVictims": {}}, "no Pod", id="no-pod"),
        pytest.param({"Pod": preemptor()}, "neither", id="no-victim-map"),
        pytest.param({"Pod": preemptor(), "nodeNameToMetaVictims": {}}, "PascalCase",
                     id="lowercase-keys"),
        pytest.param({"Pod": preemptor(), "NodeNameToMetaVictims": {"h1": None}},
                     "got `null`", id="null-victims"),
        pytest.param({"Pod": preemptor(), "NodeNameToMetaVictims": {"h1": {"Pods": []}}},
                     "length >= 1 - at `$.NodeNameToMetaVictims[...].Pods`", id="no-victims"),
        pytest.param({"Pod": preemptor(), "NodeNameToMetaVictims": {"h1": {"Pods": [{}]}}},
                     "missing required field `UID`", id="victim-without-uid"),
        pytest.param({"Pod": preemptor(), "NodeNameToVictims": {"h1": {"Pods": [
            {"metadata": {"name": "x"}}]}}}, "no UID", id="full-victim-without-uid"),
        pytest.param({"Pod": preemptor(), "NodeNameToMetaVictims": {"h1": {
            "Pods": [{"UID": "u"}], "NumPDBViolations": "one"}}}, "NumPDBViolations",
                     id="pdb-count-not-a-number"),
    ],
)
async def test_malformed_preemption_args_are_a_400_with_the_reason(client, body, reason):
    status, reply = await post(client, body)
    assert status == 400 and reason in reply["Error"], reply
    status, _ = await post(client, {"Pod": preemptor(), "NodeNameToMetaVictims": {
        "h1": meta("uid-ml-idle")}})
    assert status == 200  # still serving
