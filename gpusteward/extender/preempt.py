"""The preempt verb: keep the scheduler's preemption candidates whose victims are the most idle.

The wire format is extender/preemptwire.py; a node left out of the result stops being a
candidate. Each victim is judged by the reclaimer's own idle rule over the reclaimer's own
evidence (adapters/snapshot.py: a fixed set of PromQL queries), fetched in the background every
`reclaim.interval` into extender/victimbook.VictimBook; a request only looks judgements up. The
choice itself is core/preemption.py; this module answers requests and runs the refresh.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from itertools import chain
from operator import attrgetter, or_
from typing import NamedTuple, Protocol

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpusteward.adapters.background import every, running
from gpusteward.core.fleet import FleetStore
from gpusteward.core.kubewire import WirePod, pod_request
from gpusteward.core.model import Pod, class_of
from gpusteward.core.policy import Policy
from gpusteward.core.preemption import Candidates, Choice, Shield, choose, shield_for
from gpusteward.core.reclaim import reserve
from gpusteward.core.reclaim.model import Evidence
from gpusteward.extender.metrics import ExtenderMetrics
from gpusteward.extender.preemptwire import (
    MetaPod,
    MetaVictims,
    PreemptionArgs,
    PreemptionResult,
    decode_preemption_args,
)
from gpusteward.extender.victimbook import VictimBook
from gpusteward.extender.wire import BadRequest

log = logging.getLogger("gpusteward.extender")
_encoder = msgspec.json.Encoder()


class Answered(NamedTuple):
    """A reply, and what the request decoded to: freeing that, 15,000 objects at 5,000
    candidates, takes 0.25 ms the scheduler need not wait for, so the server drops `spent`
    (`spent.clear()`) after the reply is written."""

    body: bytes
    spent: list[object]


class EvidenceSource(Protocol):
    async def evidence(self, pods: tuple[Pod, ...],
                       now: float) -> tuple[dict[float, dict[str, Evidence]], bool, str]: ...


class PreemptionMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.answers = Counter(
            "gpusteward_extender_preemption_answers_total",
            "Preempt calls by the tier of the candidates kept (idle, partly-idle, busy; none: "
            "every candidate shielded by protectBusy, the preemptor waits).",
            ["kept"], registry=registry)
        self.dropped = Counter(
            "gpusteward_extender_preemption_dropped_nodes_total",
            "Candidate nodes left out of preempt answers, by why (protected: a busy victim "
            "shielded by protectBusy, a victim inside its class's minRuntime or its workload's "
            "reclaimCooldown, or GPUs the "
            "preemptor needs reserved there for another waiting pod; ranked: more PDB "
            "violations or less idle than others).",
            ["why"], registry=registry)
        self.evidence_ok = Gauge(
            "gpusteward_extender_preemption_evidence_ok",
            "1 when the last idle-evidence refresh succeeded; 0: every victim counts as busy.",
            registry=registry)


class Preempter:
    def __init__(self, policy: Policy, fleet: FleetStore, source: EvidenceSource | None,
                 registry: CollectorRegistry, clock: Callable[[], float] = time.time):
        self.policy = policy
        self.fleet = fleet
        self.source = source
        self.clock = clock
        self.book = VictimBook(policy)
        self.metrics = PreemptionMetrics(registry)

    async def refresh(self) -> None:
        """One evidence refresh: the reclaimer's queries, then every bound GPU pod judged."""
        evidence: dict[float, dict[str, Evidence]] = {}
        ok, problem = False, "no Prometheus configured"
        pods = tuple(self.fleet.pods.values())
        if self.source is not None:
            evidence, ok, problem = await self.source.evidence(pods, self.clock())
        if not ok:
            log.warning("no idle evidence for preemption, every victim counts as busy: %s",
                        problem)
        self.metrics.evidence_ok.set(1 if ok else 0)
        self.book.rebuild(pods, evidence)

    def respond(self, body: bytes) -> Answered:
        """Decode and answer one request. A large request makes thousands of short-lived
        containers, none in a reference cycle: with the cycle collector running, they were
        promoted through its generations until a full collection over the whole watch cache
        (tens of ms at 5,000 nodes) landed inside a request. Paused here, they are freed by
        reference counting as usual; nothing else runs meanwhile (no await in between)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self.answer(decode_preemption_args(body))
        finally:
            if enabled:
                gc.enable()

    def answer(self, args: PreemptionArgs) -> Answered:
        """The reply to args, whose victim map it reuses (the nodes left out are removed)."""
        assert args.Pod is not None
        preemptor = class_of(args.Pod.metadata.labels or {}, args.Pod.metadata.annotations or {},
                             self.policy.default_class)
        shield = shield_for(preemptor, self.policy.preemption)
        if args.NodeNameToMetaVictims is not None:
            echo = args.NodeNameToMetaVictims
            full: dict[str, dict[str, WirePod]] = {}
        else:
            assert args.NodeNameToVictims is not None
            full = {node: {_uid(node, p.metadata.uid): p for p in v.Pods}
                    for node, v in args.NodeNameToVictims.items()}
            echo = {node: MetaVictims([MetaPod(u) for u in full[node]], v.NumPDBViolations)
                    for node, v in args.NodeNameToVictims.items()}
        pods = list(map(_PODS, echo.values()))
        candidates = Candidates(list(echo), *self.book.idle_flags(pods, list(map(len, pods))),
                                list(map(_PDB, echo.values())))
        if shield:
            candidates.shielded = [self._shielded(p, shield, full.get(n, {}))
                                   for n, p in zip(candidates.nodes, pods, strict=True)]
        self._shelter(candidates, pods)
        self._reserved(candidates, pods, args.Pod)
        choice = choose(candidates, self.policy.preemption)
        self._count(choice)
        # The request's map less what was left out is the kept nodes in the request's order.
        left_out = list(map(echo.pop, chain(choice.vetoed, choice.dropped)))
        return Answered(_encoder.encode(PreemptionResult(echo)), [args, full, pods, left_out])

    def _shielded(self, victims: list[MetaPod], shield: Shield,
                  pods: Mapping[str, WirePod]) -> bool:
        book = self.book
        uids = list(map(_UID, victims))
        return not book.shielded(shield).isdisjoint(uids) or any(
            shield.covers(book.class_of_unjudged(u, self.fleet, pods.get(u)))
            for u in uids if u not in book.classes)

    def _shelter(self, candidates: Candidates, pods: list[list[MetaPod]]) -> None:
        """Veto the candidates with a victim inside its class's minRuntime or its workload's
        reclaimCooldown, like a shielded one: the scheduler then preempts elsewhere, or the
        preemptor waits."""
        if not self.book.shelters:
            return
        inside = self.book.inside_shelter(set(map(_UID, chain.from_iterable(pods))),
                                          self.fleet, self.clock())
        if not inside:
            return
        hit = [not inside.isdisjoint(map(_UID, p)) for p in pods]
        shielded = candidates.shielded
        candidates.shielded = hit if shielded is None else list(map(or_, shielded, hit))

    def _reserved(self, candidates: Candidates, pods: list[list[MetaPod]],
                  preemptor: WirePod) -> None:
        """Veto the candidates where the victims' GPUs would not make room for the preemptor
        beside what is reserved there for another waiting pod (core/reclaim/reserve.py): the
        extender's filter keeps the preemptor off those GPUs, and a nomination there would
        hold back the very pod they were freed for."""
        if not self.fleet.any_reserving:
            return
        now, fleet, uid = self.clock(), self.fleet, preemptor.metadata.uid
        try:
            need = sum(pod_request(preemptor.spec, self.policy.resources).values())
        except ValueError as e:  # an unreadable quantity
            raise BadRequest(f"the preemptor's GPU request: {e}") from e
        hit = []
        for node, victims in zip(candidates.nodes, pods, strict=True):
            held = sum(r.gpus for p in fleet.reserving(node) if p.uid != uid
                       and (r := reserve.held(p, now)) is not None and r.node == node)
            known = fleet.nodes.get(node)
            if not held or known is None:
                hit.append(False)
                continue
            used = sum(p.gpus for p in fleet.pods_on(node) if not p.deleting)
            freed = sum(fleet.pods[v.UID].gpus for v in victims if v.UID in fleet.pods)
            hit.append(known.gpus - used + freed - held < need)
        shielded = candidates.shielded
        candidates.shielded = hit if shielded is None else list(map(or_, shielded, hit))

    def _count(self, choice: Choice) -> None:
        self.metrics.answers.labels(choice.tier or "none").inc()
        if choice.vetoed:
            self.metrics.dropped.labels("protected").inc(len(choice.vetoed))
        if choice.dropped:
            self.metrics.dropped.labels("ranked").inc(len(choice.dropped))


_UID, _PODS, _PDB = attrgetter("UID"), attrgetter("Pods"), attrgetter("NumPDBViolations")


def _uid(node: str, uid: str) -> str:
    if not uid:
        raise BadRequest(f"a victim on node {node!r} has no UID")
    return uid


# --- HTTP --------------------------------------------------------------------------------------
PREEMPTER = web.AppKey("preempter", Preempter)


def install(app: web.Application, policy: Policy, fleet: FleetStore,
            source: EvidenceSource | None, metrics: ExtenderMetrics) -> None:
    """Hold the Preempter for POST /preempt (routed, limited and counted in app.py like the
    other verbs) and refresh its evidence every reclaim.interval in the background."""
    app[PREEMPTER] = Preempter(policy, fleet, source, metrics.registry)
    app.cleanup_ctx.append(_background)


def _crashed() -> None:  # a bug here must not stop scheduling: log it and go on
    log.exception("preemption evidence refresh crashed")


async def _background(app: web.Application) -> AsyncIterator[None]:
    preempter = app[PREEMPTER]
    async with running(every(float(preempter.policy.reclaim.interval), preempter.refresh,
                             _crashed)):
        yield
