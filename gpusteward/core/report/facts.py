"""From the reclaim Snapshot and the range samples to each pod's usage (pure)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from gpusteward.core.cards import TierTable
from gpusteward.core.model import Node, Pod, class_of
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.decide import owner_of
from gpusteward.core.reclaim.model import Snapshot
from gpusteward.core.reclaim.quota import team
from gpusteward.core.reclaim.rules import rule_for
from gpusteward.core.report.model import PodUsage, ReportInput, Series
from gpusteward.core.report.usage import PodFacts, pod_usage
from gpusteward.core.sharing import devices_held, node_physical_gpus, pod_share

UNKNOWN_CARD = "unknown"


class Prices:
    """$ per GPU-hour by GFD product, from the policy's card tiers (None: no price)."""

    def __init__(self, policy: Policy):
        self._tiers = TierTable([(t.name, t.products) for t in policy.card_tiers])
        self._cost = {t.name: t.cost_per_gpu_hour for t in policy.card_tiers}

    def of(self, product: str | None) -> float | None:
        tier = self._tiers.tier_of(product)
        return None if tier is None else self._cost.get(tier)


def pod_usages(inp: ReportInput, policy: Policy) -> list[PodUsage]:
    """Every bound GPU pod, then every pod seen only in the samples (gone inside the window)."""
    snap = inp.snapshot
    prices = Prices(policy)
    by_pod: dict[str, list[Series]] = defaultdict(list)
    for s in inp.series:
        by_pod[s.pod].append(s)
    out = []
    bound = [p for p in snap.pods if p.node is not None]
    for pod in bound:
        facts = _present(pod, snap, policy, prices)
        out.append(pod_usage(facts, by_pod.get(pod.key, []), inp.window))
    known = {p.key for p in bound}
    for key in sorted(set(by_pod) - known):
        facts = _gone(key, by_pod[key], snap.nodes, snap.namespace_labels, policy, prices)
        out.append(pod_usage(facts, by_pod[key], inp.window))
    return out


def _present(pod: Pod, snap: Snapshot, policy: Policy, prices: Prices) -> PodFacts:
    node = snap.nodes.get(pod.node or "")
    rule = rule_for(pod, policy)
    owner = owner_of(pod, snap)
    return PodFacts(
        namespace=pod.namespace, name=pod.name, team=team(pod, snap.namespace_labels),
        card=(node.product if node else None) or UNKNOWN_CARD, node=pod.node or "",
        cls=class_of(pod.labels, pod.annotations, policy.default_class),
        owner=f"{owner.kind}/{owner.name}", gpus=pod_share(pod, node),
        expected_series=devices_held(pod, node),
        start=pod.bound_at or pod.created_at, threshold=rule.threshold_percent,
        min_coverage=rule.min_coverage, price=prices.of(node.product if node else None),
        fault=str(snap.faults.get(pod.key, "")))


def _gone(key: str, series: list[Series], nodes: Mapping[str, Node],
          namespace_labels: Mapping[str, Mapping[str, str]], policy: Policy,
          prices: Prices) -> PodFacts:
    namespace, _, name = key.partition("/")
    node = nodes.get(series[0].node)
    ghost = Pod(namespace=namespace, name=name, uid="", gpus=len(series))
    rule = policy.reclaim.idle
    assert rule.threshold_percent is not None and rule.min_coverage is not None
    return PodFacts(
        namespace=namespace, name=name, team=team(ghost, namespace_labels),
        card=(node.product if node else None) or UNKNOWN_CARD, node=series[0].node,
        cls=policy.default_class, owner=f"Pod/{name}",
        gpus=len({s.gpu for s in series}) * _mean_unit(node), expected_series=len(series),
        start=None, threshold=rule.threshold_percent, min_coverage=rule.min_coverage,
        price=prices.of(node.product if node else None))


def _mean_unit(node: Node | None) -> float:
    """Physical GPUs per series of a pod that is gone: a time-sliced GPU's series is the whole
    GPU shared by its replicas, a MIG instance's is the node's average instance."""
    if node is None or node.gpus <= 0:
        return 1.0
    return node_physical_gpus(node) / node.gpus
