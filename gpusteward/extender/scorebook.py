"""Pre-encoded filter and prioritize reply fragments, per (demand, node).

Scoring work belongs to the refresh, not the request: when telemetry or the watch cache changes,
node states are rebuilt here and the fragments of every recently seen demand are recomputed, so a
request only looks fragments up and joins bytes. A demand seen for the first time is computed
once for all nodes; nodes that change between refreshes are recomputed one by one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from enum import IntEnum

from gpusteward.core.nodestate import NodeState
from gpusteward.core.scoring import ClassRule, Demand, filter_node, score_node
from gpusteward.extender import wire


class FilterOutcome(IntEnum):
    """Which list of a filter reply a node goes into; the value indexes the reply's lists."""

    PASSED = 0  # NodeNames, or Nodes in full-node mode
    FAILED = 1  # FailedNodes
    UNRESOLVABLE = 2  # FailedAndUnresolvableNodes


class Fragments:
    """Everything one node contributes to a reply for one demand, encoded once: every field
    but name, outcome (a FilterOutcome value) and score holds JSON bytes ready to join."""

    __slots__ = ("name", "quoted", "outcome", "failure", "entry", "score", "priority_json")

    def __init__(self, state: NodeState, demand: Demand, rule: ClassRule):
        self.name = state.name
        self.quoted = wire.encode_str(state.name)
        fit = filter_node(state, demand)
        outcome = (FilterOutcome.PASSED if fit.ok else FilterOutcome.FAILED
                   if fit.resolvable else FilterOutcome.UNRESOLVABLE)
        # The plain int: an enum member as a tuple index leaves CPython's specialised path,
        # +8% on the names-mode filter reply at 1,000 nodes.
        self.outcome: int = outcome.value
        # `"name":"reason"`, ready to join into FailedNodes or FailedAndUnresolvableNodes.
        self.failure = b"" if fit.ok else self.quoted + b":" + wire.encode_str(fit.reason)
        # What a node-names filter reply lists for this node, in the list of its outcome.
        self.entry = self.quoted if fit.ok else self.failure
        self.score = score_node(state, demand, rule)
        # `{"Host":"name","Score":n}`, one entry of a prioritize reply.
        self.priority_json = wire.host_priority(state.name, self.score)


class DemandTable:
    def __init__(self, demand: Demand, rule: ClassRule, states: Mapping[str, NodeState]):
        self.demand = demand
        self.rule = rule
        self.by_node = {name: Fragments(s, demand, rule) for name, s in states.items()}

    def update(self, state: NodeState | None, name: str) -> None:
        if state is None:
            self.by_node.pop(name, None)
        else:
            self.by_node[name] = Fragments(state, self.demand, self.rule)


class ScoreBook:
    def __init__(self, rules: Mapping[str, ClassRule], default_class: str, max_demands: int = 256):
        self._rules = rules
        self._default = default_class
        self._max = max_demands
        self.states: dict[str, NodeState] = {}
        self._tables: OrderedDict[Demand, DemandTable] = OrderedDict()

    def rule_for(self, class_name: str) -> ClassRule:
        return self._rules.get(class_name) or self._rules[self._default]

    def table(self, demand: Demand) -> DemandTable:
        table = self._tables.get(demand)
        if table is None:
            table = DemandTable(demand, self.rule_for(demand.class_name), self.states)
            self._tables[demand] = table
            if len(self._tables) > self._max:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(demand)
        return table

    def replace_states(self, states: dict[str, NodeState]) -> None:
        """A new telemetry sample or a re-list: rebuild every live demand's fragments."""
        self.states = states
        for demand, table in list(self._tables.items()):
            self._tables[demand] = DemandTable(demand, table.rule, states)

    def update_state(self, name: str, state: NodeState | None) -> None:
        if state is None:
            self.states.pop(name, None)
        else:
            self.states[name] = state
        for table in self._tables.values():
            table.update(state, name)

    def fragments_for_unlisted(self, state: NodeState, demand: Demand) -> Fragments:
        """A node known only from the request (full-node mode): computed on the spot."""
        return Fragments(state, demand, self.rule_for(demand.class_name))
