"""The preempt verb's column passes (core/preemption.choose, VictimBook.idle_flags, the reply
built from the request's own map) against a row-by-row reading of the rules, on randomized
requests with a fixed seed: the same choice and the same reply bytes.

The reference reply is what the verb answered before its passes were columnar: each node's
victims intersected with the idle set one node at a time, then the kept nodes re-encoded from
the decoded request. Request shape: ExtenderPreemptionArgs with NodeNameToMetaVictims
(MetaVictims {Pods []*MetaPod{UID}, NumPDBViolations}) in k8s.io/kube-scheduler/extender/v1
types.go, Go field names as JSON keys.
"""

from __future__ import annotations

import json
import random

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import Preemption, parse_policy
from gpusteward.core.preemption import BUSY, IDLE, PARTLY_IDLE, Candidates, choose
from gpusteward.extender.preempt import Preempter
from gpusteward.extender.preemptwire import PreemptionResult, decode_preemption_args

TIERS = (IDLE, PARTLY_IDLE, BUSY)


def rank(victims: int, idle: int) -> int:
    return 2 - (idle > 0) - (idle >= victims)


def reference_choice(rows: list[tuple[str, int, int, int, bool]], prefer_idle: bool):
    """Rules 1-3 of core/preemption.py, one row at a time: (kept, tier, vetoed, dropped)."""
    vetoed = [r[0] for r in rows if r[4]]
    open_ = [r for r in rows if not r[4]]
    if not open_:
        return (), None, set(vetoed), set()
    fewest = min(r[3] for r in open_)
    fewest_pdb = [r for r in open_ if r[3] == fewest]
    if prefer_idle:
        best = min(rank(r[1], r[2]) for r in fewest_pdb)
        kept = [r for r in fewest_pdb if rank(r[1], r[2]) == best]
    else:
        kept = fewest_pdb
        best = max(rank(r[1], r[2]) for r in kept)
    names = [r[0] for r in kept]
    return tuple(names), TIERS[best], set(vetoed), {r[0] for r in open_} - set(names)


def random_rows(rng: random.Random) -> list[tuple[str, int, int, int, bool]]:
    same_size = rng.random() < 0.5
    pdb = rng.choice([0, 0, 1, None])  # None: a count per node
    rows = []
    for i in range(rng.randint(1, 40)):
        victims = 2 if same_size else rng.randint(0, 4)  # 0: vacuously all idle, core allows it
        idle = rng.choice([0, victims, rng.randint(0, victims)])
        rows.append((f"n{i}", victims, idle, rng.randint(0, 2) if pdb is None else pdb,
                     rng.random() < 0.1))
    return rows


@pytest.mark.parametrize("prefer_idle", [True, False])
def test_choose_matches_the_rules_row_by_row(prefer_idle):
    rng = random.Random(15)
    for _ in range(2000):
        rows = random_rows(rng)
        nodes, victims, idle, pdb, shielded = (list(c) for c in zip(*rows, strict=True))
        choice = choose(Candidates.counted(nodes, victims, idle, pdb, shielded),
                        Preemption(prefer_idle=prefer_idle))
        kept, tier, vetoed, dropped = reference_choice(rows, prefer_idle)
        assert (choice.kept, choice.tier) == (kept, tier), rows
        assert (set(choice.vetoed), set(choice.dropped)) == (vetoed, dropped), rows


# --- the whole verb: same reply bytes as the per-node reading --------------------------------
CLASSES = ("training", "batch", "experiment")
POLICIES = {
    "default": parse_policy({}),
    "prefer-idle-off": parse_policy({"preemption": {"preferIdle": False}}),
    "shield": parse_policy({"preemption": {"protectBusy": {"training": ["experiment"]}}}),
}


def random_request(rng: random.Random) -> tuple[bytes, set[str], dict[str, str]]:
    """A request body, the idle UIDs and every judged pod's class."""
    same_size = rng.choice([None, 1, 2, 3, 4])  # as many victims on every node: packed slices
    pdb = rng.choice([0, 0, 1, None])
    uids = [f"uid-{i}" for i in range(rng.randint(1, 120))]
    idle = {u for u in uids if rng.random() < rng.choice([0.0, 0.3, 0.6, 1.0])}
    classes = {u: rng.choice(CLASSES) for u in uids}
    victims = {}
    for i in range(rng.randint(0, 40)):
        pods = rng.sample(uids, min(len(uids), same_size or rng.randint(1, 4)))
        if rng.random() < 0.05:  # a victim listed twice, and one gpusteward does not know
            pods = [pods[0], *pods]
        if rng.random() < 0.1:
            pods[-1] = f"unknown-{i}"
        victims[f"node-{i}"] = {"Pods": [{"UID": u} for u in pods],
                                "NumPDBViolations": rng.randint(0, 2) if pdb is None else pdb}
    preemptor = {"metadata": {"name": "p", "namespace": "ml", "uid": "p", "labels": {
        "gpusteward.io/class": rng.choice(CLASSES)}}, "spec": {"containers": []}}
    body = json.dumps({"Pod": preemptor, "NodeNameToMetaVictims": victims},
                      separators=(",", ":") if rng.random() < 0.5 else None).encode()
    return body, idle, classes


def reference_reply(p: Preempter, body: bytes) -> bytes:
    args = decode_preemption_args(body)
    echo = args.NodeNameToMetaVictims
    assert echo is not None and args.Pod is not None
    book = p.book
    preemptor = (args.Pod.metadata.labels or {}).get("gpusteward.io/class", "")
    protected = {v for v, ps in p.policy.preemption.protect_busy.items() if preemptor in ps}
    rows = []
    for node, v in echo.items():
        uids = [m.UID for m in v.Pods]
        shielded = any(u not in book.idle and book.classes.get(u) in protected for u in uids)
        rows.append((node, len(uids), sum(u in book.idle for u in uids), v.NumPDBViolations,
                     shielded))
    kept = reference_choice(rows, p.policy.preemption.prefer_idle)[0] if rows else ()
    return msgspec.json.encode(PreemptionResult({node: echo[node] for node in kept}))


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
def test_reply_bytes_match_the_per_node_reading(policy):
    rng = random.Random(1515)
    p = Preempter(policy, FleetStore(), None, CollectorRegistry())
    kept_some = 0
    for _ in range(400):
        body, p.book.idle, p.book.classes = random_request(rng)
        p.book._shielded = {}
        reply = p.respond(body).body
        assert reply == reference_reply(p, body), body
        kept_some += reply != b'{"NodeNameToMetaVictims":{}}'
    assert kept_some > 100  # the comparison covered real choices, not only empty replies
