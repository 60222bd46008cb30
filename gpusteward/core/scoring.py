"""Filter and score one node for one pod: the whole placement formula lives here.

Filter (first failing rule wins, each with a reason the scheduler logs):
  * the node has no GPU resource or no product label        -> unresolvable
  * the pod names card types and the product matches none   -> unresolvable (preemption cannot
    change a node's card)
  * the node offers less of a GPU resource the pod asks for  -> unresolvable (a MIG profile, a
    shared GPU: kube-scheduler rejects it too, so it must not take the best score)
  * healthy free GPUs < GPUs requested                      -> failed (resolvable: pods may leave)
  Health is only held against a node when its telemetry is fresh: missing telemetry never fails
  scheduling.

Score: a weighted mean of four terms, each clamped to [0, 1], with the class's weights

    raw   = (w_card*card + w_cool*coolness + w_pack*packing + w_health*health) / sum(w)
    score = round(10 * raw)          (an integer 0..10, what the extender API expects)

  card      pod patterns p_0..p_{n-1}: 1 - i/n for the first p_i the product matches;
            otherwise the class's preferred tiers t_0..t_{m-1}: 1 - j/m for the node's tier t_j,
            0 for other tiers; 0.5 when neither pod nor class states a preference.
  coolness  1 - mean GPU utilization of the node, where GPUs of pods bound since the last
            sample, and of pods just placed here whose binding has not arrived yet, count as
            100 % busy (burst correction).                           Unknown: 0.5 (neutral).
  packing   u = (allocated + in flight + requested) / allocatable after placing the pod;
            binpack: u, spread: 1 - u.
  health    1 - faulty GPUs / GPUs.                                  Unknown: 0.5 (neutral).
  Load and health count physical GPUs: a time-sliced node's allocatable is GPUs x replicas, but
  each GPU reports once and a lost one takes all its replicas away (core/sharing.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import assert_never

import msgspec

from gpusteward.core import hami
from gpusteward.core.cards import preference_rank
from gpusteward.core.nodestate import NodeState
from gpusteward.core.policy import Placement, Weights, WorkloadClass
from gpusteward.core.sharing import replicas

NEUTRAL = 0.5
MAX_PRIORITY = 10


class Demand(msgspec.Struct, frozen=True):
    """What the pod being scheduled asks for; the cache key for precomputed replies."""

    gpus: int
    card_patterns: tuple[str, ...]
    class_name: str
    # (resource name, count) behind `gpus`, sorted; empty: not known, `gpus` alone is checked.
    resources: tuple[tuple[str, int], ...] = ()
    # DRA: claims made from the pod's templates that the watch has not shown yet (core/dra.py).
    claims_unseen: bool = False
    # A pod HAMi places: each container's cores and memory per vGPU (core/hami.Ask).
    vgpu_asks: tuple[hami.Ask, ...] = ()


class ClassRule(msgspec.Struct, frozen=True):
    preferred_tiers: tuple[str, ...]
    placement: Placement
    weights: Weights


class NodeFit(msgspec.Struct, frozen=True):
    """Whether a node can take the pod; if not, why, and whether preemption could change that."""

    ok: bool
    resolvable: bool = True
    reason: str = ""

    @classmethod
    def failed(cls, reason: str) -> NodeFit:
        """Not now: pods leaving the node (preemption among them) could make room."""
        return cls(ok=False, resolvable=True, reason=reason)

    @classmethod
    def unresolvable(cls, reason: str) -> NodeFit:
        """Never, whatever leaves the node: preemption must not try it."""
        return cls(ok=False, resolvable=False, reason=reason)


FITS = NodeFit(ok=True)


def filter_node(state: NodeState, demand: Demand) -> NodeFit:
    if demand.claims_unseen:  # the scheduler waits for them too; it retries the pod
        return NodeFit.failed("its ResourceClaims are not in gpusteward's watch yet")
    if demand.gpus == 0:
        return FITS  # not a GPU pod: not ours to judge
    node = state.node
    if node.gpus <= 0:
        return NodeFit.unresolvable("node has no allocatable GPUs")
    if demand.card_patterns:
        if node.product is None:
            return NodeFit.unresolvable("node has no nvidia.com/gpu.product label")
        if preference_rank(node.product, demand.card_patterns) is None:
            wanted = ",".join(demand.card_patterns)
            return NodeFit.unresolvable(f"card {node.product} not accepted (pod wants {wanted})")
    if demand.gpus > node.gpus:
        return NodeFit.unresolvable(f"pod needs {demand.gpus} GPUs, node has {node.gpus}")
    if node.resources:
        for name, count in demand.resources:
            if node.resources.get(name, 0) < count:
                return NodeFit.unresolvable(f"pod needs {count} {name}, node has "
                                            f"{node.resources.get(name, 0)}")
    if state.healthy_free < demand.gpus:
        return NodeFit.failed(_capacity_reason(state, demand))
    if demand.vgpu_asks:
        return _slice_fit(state, demand.vgpu_asks)
    return FITS


def _slice_fit(state: NodeState, asks: tuple[hami.Ask, ...]) -> NodeFit:
    """A pod HAMi places: only on a node HAMi registered, where each vGPU it asks finds a GPU
    with the slot, cores and memory (HAMi's own Fit, core/hami.py), so that gpusteward's filter
    never keeps a node HAMi's must refuse (docs/install.md, "HAMi")."""
    if not state.node.vgpus:
        return NodeFit.unresolvable("HAMi has not registered this node's GPUs")
    if hami.place(state.device_loads(), asks) is None:
        wanted = ", ".join(f"{a.vgpus} x {a.cores}% cores" for a in asks)
        return NodeFit.failed(f"no GPU has the cores and memory the pod asks ({wanted})")
    return FITS


def _capacity_reason(state: NodeState, demand: Demand) -> str:
    reason = f"pod needs {demand.gpus} healthy free GPUs, node has {state.healthy_free}"
    if state.unhealthy_free:
        reason += f" (unhealthy: {state.health_reason})"
    if state.node.withheld:
        taints = sorted({str(w.taint) for w in state.node.withheld})
        reason += f" ({len(state.node.withheld)} DRA devices tainted {', '.join(taints)})"
    if state.reserved:
        reason += f" ({state.reserved} reserved for a waiting pod)"
    return reason


def card_term(state: NodeState, demand: Demand, rule: ClassRule) -> float:
    if demand.card_patterns:
        rank = preference_rank(state.node.product, demand.card_patterns)
        return 0.0 if rank is None else 1.0 - rank / len(demand.card_patterns)
    if not rule.preferred_tiers:
        return NEUTRAL
    if state.tier not in rule.preferred_tiers:
        return 0.0
    return 1.0 - rule.preferred_tiers.index(state.tier) / len(rule.preferred_tiers)


def coolness_term(state: NodeState) -> float:
    return NEUTRAL if state.util is None else _clamp(1.0 - state.util)


def packing_term(state: NodeState, demand: Demand, placement: Placement) -> float:
    used = _clamp((state.allocated + state.inflight + state.reserved + demand.gpus)
                  / max(state.node.gpus, 1))
    match placement:
        case Placement.BINPACK:
            return used
        case Placement.SPREAD:
            return 1.0 - used
    assert_never(placement)


def health_term(state: NodeState) -> float:
    if state.faulty is None:
        return NEUTRAL
    return _clamp(1.0 - state.faulty / max(state.node.gpus / replicas(state.node), 1))


def raw_score(state: NodeState, demand: Demand, rule: ClassRule) -> float:
    w = rule.weights
    terms: Sequence[tuple[float, float]] = (
        (w.card, card_term(state, demand, rule)),
        (w.coolness, coolness_term(state)),
        (w.packing, packing_term(state, demand, rule.placement)),
        (w.health, health_term(state)),
    )
    total = sum(weight for weight, _ in terms)
    if total <= 0:
        return NEUTRAL
    return _clamp(sum(weight * term for weight, term in terms) / total)


def to_priority(raw: float) -> int:
    """Normalise a raw score in [0, 1] to the extender's integer 0..10 (half rounds up)."""
    return int(_clamp(raw) * MAX_PRIORITY + 0.5)


def score_node(state: NodeState, demand: Demand, rule: ClassRule) -> int:
    if demand.gpus == 0:
        return 0  # not a GPU pod: the same score everywhere changes nothing
    return to_priority(raw_score(state, demand, rule))


def _clamp(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def class_rules(classes: Mapping[str, WorkloadClass]) -> dict[str, ClassRule]:
    return {
        name: ClassRule(tuple(c.preferred_tiers), c.placement, c.weights)
        for name, c in classes.items()
    }
