"""The extender's live view: fleet cache + latest telemetry -> node states -> reply fragments.

Watch events rebuild the states of the nodes they touch; each telemetry tick rebuilds them all
(also when Prometheus failed, so readings age into "stale" and their terms turn neutral).

A pod the extender just ranked is expected on its top node until the watch shows where it was
bound: in a burst the scheduler places the next pod before our watch sees the last binding.
Only pods the watch shows pending can be expected, within the node's GPU count; a pod ranked
before the watch delivered it is parked and counts once the watch shows it. The app makes such
an answer wait a moment for the watch (`unwatched`): one stream in resourceVersion order, so the
pod showing means every pod created before it shows too.

GPUs the reclaimer reserved for a waiting pod (core/reclaim/reserve.py: the pod's annotation and
its nomination, on the API object, so every replica sees them) count as taken on their node for
every other pod, like an expected placement, until the reservation ends; the pod they are
reserved for is answered with them free.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gpusteward.core.cards import CARD_TYPES_ANNOTATION, TierTable, parse_card_types
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.fleet import FleetStore
from gpusteward.core.kubewire import WireNode, WirePod, pod_request, to_node, vgpu_asks
from gpusteward.core.model import Node, Telemetry, class_of
from gpusteward.core.nodestate import NodeState, build_node_state
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import reserve
from gpusteward.core.scoring import Demand, class_rules
from gpusteward.extender.scorebook import ScoreBook

# Longer than any watch delay: an expectation neither a binding nor a deletion settled (the
# scheduler bound the pod nowhere, and it stays pending) is forgotten.
INFLIGHT_TTL = 30.0
# Pods ranked before the watch delivered them, waiting to be confirmed (made-up ones never are).
PARKED_MAX = 1024


class PlacementView:
    def __init__(self, policy: Policy, fleet: FleetStore, clock: Callable[[], float] = time.time,
                 dra: DraFleet | None = None):
        self.policy = policy
        self.fleet = fleet
        self.dra = dra  # the DRA join in front of ``fleet``, if the app runs one
        self.clock = clock
        self.tiers = TierTable([(t.name, t.products) for t in policy.card_tiers])
        self.telemetry = Telemetry()
        self.book = ScoreBook(class_rules(policy.classes), policy.default_class)
        # pod uid -> (node, GPUs, when): placements not yet seen through the watch.
        self.inflight: dict[str, tuple[str, int, float]] = {}
        self.built_at = 0.0  # when every node state was last rebuilt
        # pod uid -> (node, when): ranked before our watch showed the pod; no effect until it does
        self.parked: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._exempt = ""  # the pod being answered: its own reservation does not count
        fleet.subscribe(self._on_fleet_change)

    def node_state(self, node: Node) -> NodeState:
        now = self.clock()
        return build_node_state(
            node,
            self.tiers.tier_of(node.product),
            self.fleet.pods_on(node.name),
            self.telemetry.for_node(node.name),
            self.policy.health,
            now,
            float(self.policy.telemetry.stale_after),
            sum(gpus for n, gpus, _ in self.inflight.values() if n == node.name),
            float(self.policy.telemetry.pod_warmup),
            self.reserved_on(node.name, now),
        )

    def reserved_on(self, node: str, now: float) -> int:
        """GPUs reserved on the node for waiting pods other than the one being answered."""
        return sum(r.gpus for p in self.fleet.reserving(node)
                   if p.uid != self._exempt and (r := reserve.held(p, now)) is not None
                   and r.node == node)

    def exempt(self, pod_uid: str) -> str | None:
        """Answering this pod: a reservation it holds stops counting against it (on its node,
        rebuilt); the node, for ``unexempt`` after the answer, or None."""
        pod = self.fleet.pods.get(pod_uid)
        held = None if pod is None else reserve.held(pod, self.clock())
        if held is None:
            return None
        self._exempt = pod_uid
        self._refresh_nodes({held.node})
        return held.node

    def unexempt(self, node: str) -> None:
        self._exempt = ""
        self._refresh_nodes({node})

    def set_telemetry(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.rebuild()

    def rebuild(self) -> None:
        horizon = self.clock() - INFLIGHT_TTL
        self.inflight = {uid: v for uid, v in self.inflight.items() if v[2] >= horizon}
        self.book.replace_states({n.name: self.node_state(n) for n in self.fleet.nodes.values()})
        self.built_at = self.clock()

    def stale_nodes(self) -> int:
        """Nodes scored neutral; all of them once the states are older than staleAfter (the
        refresh that should rebuild them stopped or failed)."""
        if self.clock() - self.built_at > float(self.policy.telemetry.stale_after):
            return len(self.book.states)
        return sum(1 for s in self.book.states.values() if not s.telemetry_known)

    def expect(self, pod_uid: str, node: str) -> None:
        """The scheduler is about to bind this pod, most likely to the node we ranked first.

        Only a pod the watch shows pending and unbound counts, with the GPUs the watch says it
        requests (not what the caller claims), and a node never expects more GPUs than it has:
        a caller inventing pods cannot make nodes look busy."""
        pod = self.fleet.pods.get(pod_uid)
        if pod is None:  # the scheduler may see a new pod before our watch does
            self.parked[pod_uid] = (node, self.clock())
            self.parked.move_to_end(pod_uid)
            if len(self.parked) > PARKED_MAX:
                self.parked.popitem(last=False)
            return
        if pod.node is not None or pod.deleting or pod.gpus <= 0:
            return
        previous = self.inflight.get(pod_uid)
        target = self.fleet.nodes.get(node)
        expected = sum(g for uid, (n, g, _) in self.inflight.items()
                       if n == node and uid != pod_uid)
        if target is None or expected + pod.gpus > target.gpus:
            return
        self.inflight[pod_uid] = (node, pod.gpus, self.clock())
        self._refresh_nodes({node, previous[0]} if previous else {node})

    def unwatched(self, pod: WirePod) -> bool:
        """A GPU pod (by its request, or its claims) the watch has not delivered yet: the
        scheduler saw it first, so our watch is behind, maybe also on the pods placed just
        before it, whose placements then do not count yet (parked). A request the answer will
        refuse (a bad quantity) is not waited for."""
        uid = pod.metadata.uid
        if not uid or uid in self.fleet.pods:
            return False
        if pod.spec.resource_claims:
            return True
        try:
            return sum(pod_request(pod.spec, self.policy.resources).values()) > 0
        except ValueError:
            return False

    def settle(self) -> None:
        """Before an answer: parked pods the watch now shows count as expected, expired ones are
        dropped; expectations of pods deleted or finished while pending end. (A pending pod's
        deletion changes no node, so the fleet tells nobody; a bound one is settled by
        _on_fleet_change.) Without that a deleted pod's GPUs stayed expected for INFLIGHT_TTL,
        keeping the next pods off a node with room."""
        gone = [uid for uid in self.inflight if self._vanished(uid)]
        if gone:
            self._refresh_nodes({self.inflight.pop(uid)[0] for uid in gone})
        if not self.parked:
            return
        horizon = self.clock() - INFLIGHT_TTL
        for uid in [u for u, (_, at) in self.parked.items()
                    if at < horizon or u in self.fleet.pods]:
            node, at = self.parked.pop(uid)
            if at >= horizon:
                self.expect(uid, node)

    def forget(self, pod_uid: str) -> None:
        """Asked about this pod again: its earlier expected placement must not count against it."""
        entry = self.inflight.pop(pod_uid, None)
        if entry is not None:
            self._refresh_nodes({entry[0]})

    def _vanished(self, pod_uid: str) -> bool:
        pod = self.fleet.pods.get(pod_uid)
        return pod is None or pod.deleting

    def _bound(self, pod_uid: str) -> bool:
        pod = self.fleet.pods.get(pod_uid)
        return pod is not None and pod.node is not None

    def _on_fleet_change(self, names: set[str]) -> None:
        for uid in [uid for uid in self.inflight if self._bound(uid)]:
            names.add(self.inflight.pop(uid)[0])
        self._refresh_nodes(names)

    def _refresh_nodes(self, names: set[str]) -> None:
        for name in names:
            node = self.fleet.nodes.get(name)
            self.book.update_state(name, None if node is None else self.node_state(node))

    def demand_of(self, pod: WirePod) -> Demand:
        """Raises ValueError (bad card-types annotation, bad quantity) for a 400 reply."""
        labels = pod.metadata.labels or {}
        annotations = pod.metadata.annotations or {}
        resources = pod_request(pod.spec, self.policy.resources)
        claims = pod.spec.resource_claims or ()
        joined = self.fleet.pods.get(pod.metadata.uid) if claims else None
        if joined is not None:  # DRA claims: what the join says they ask (core/dra.py)
            resources = dict(joined.resources)
        templates = sum(1 for c in claims if c.resource_claim_template_name)
        return Demand(
            claims_unseen=bool(self.dra and templates
                               and self.dra.claims_unseen(pod.metadata.uid, templates)),
            gpus=sum(resources.values()),
            card_patterns=parse_card_types(annotations.get(CARD_TYPES_ANNOTATION)),
            class_name=class_of(labels, annotations, self.policy.default_class),
            resources=tuple(sorted(resources.items())),
            vgpu_asks=vgpu_asks(pod.spec),
        )

    def state_from_request(self, wire: WireNode) -> NodeState:
        """Full-node mode, a node the watch has not delivered yet: judge it from the request."""
        return self.node_state(to_node(wire, self.policy.resources))
