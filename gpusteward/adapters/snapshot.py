"""Read one reclaim Snapshot: a fixed set of LISTs from the API server and a fixed set of PromQL
queries (2 freshness queries + 2 per idle window + 6 for GPU faults), whatever the number of
pods.

Evidence must reach the present: besides the fleet-wide probe (the newest sample of any GPU),
each GPU's own newest sample is read, and a pod whose stalest GPU has not been sampled for
longer than the rule allows (``Rule.fresh_within``) is unknown whatever its window's coverage:
one node's exporter stopping leaves its GPUs' last minutes missing, and the pod may have started
working in exactly those minutes."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.dra import KINDS as DRA_KINDS
from gpusteward.adapters.dra import read as read_dra
from gpusteward.adapters.errors import KubeRefused, TelemetryUnavailable
from gpusteward.adapters.faults import gpu_faults
from gpusteward.adapters.kube import list_raw
from gpusteward.adapters.owners import Link, OwnerChains, link_of
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promql import (
    exact_range,
    gpu_labels,
    keeping,
    newest_sample,
    per_pod_util,
    utilization,
)
from gpusteward.adapters.unitaudit import UnitAudit
from gpusteward.core.attribution import Attribution, is_per_pod
from gpusteward.core.cards import TierTable
from gpusteward.core.dcgm import gpu_id
from gpusteward.core.dra import DEFAULT_DRIVER
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.fleet import FleetStore
from gpusteward.core.health import Fault, pod_faults
from gpusteward.core.kubewire import (
    Meta,
    QuantityError,
    WireNode,
    WirePod,
    WirePodGroup,
    to_node,
    to_pod,
)
from gpusteward.core.model import Node, Pod
from gpusteward.core.owners import BUILT_IN, BUILT_IN_RESOURCES
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.model import Evidence, PastAction, Snapshot
from gpusteward.core.reclaim.rules import peak_of, windows
from gpusteward.core.reclaim.selfservice import restore_asks
from gpusteward.core.vocabulary import SOURCE_LABEL, Concept, Unit, Vocabulary


class Spec(msgspec.Struct):
    replicas: int | None = None
    suspend: bool | None = None
    parallelism: int | None = None
    # Decoded only for a restore request (core/reclaim/selfservice.py).
    template: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class Workload(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: Spec = msgspec.field(default_factory=Spec)


class NamespaceObj(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)


log = logging.getLogger("gpusteward.reclaimer")

# The Workload API's PodGroups (Kubernetes 1.36, GenericWorkload): their minCount.
PODGROUPS_PATH = "/apis/scheduling.k8s.io/v1alpha2/podgroups"
# The owners listed once a cycle, across namespaces (core.owners BUILT_IN_RESOURCES).
WORKLOAD_PATHS = {kind: f"/apis/{BUILT_IN_RESOURCES[kind][0]}/{BUILT_IN_RESOURCES[kind][1]}"
                  for kind in ("ReplicaSet", "Deployment", "StatefulSet", "Job")}


def listed_links(owned: Mapping[str, list[Workload]]) -> list[Link]:
    return [link_of(kind, BUILT_IN[kind], "v1", w.metadata, spec=w.spec)
            for kind, items in owned.items() for w in items]


def _decode(raws: Iterable[msgspec.Raw], typ: type) -> list[Any]:
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(typ)
    return [decoder.decode(r) for r in raws]


class SnapshotReader:
    def __init__(self, api: client.ApiClient, prometheus: PrometheusClient, policy: Policy,
                 clock: Callable[[], float] = time.time, dra_driver: str = DEFAULT_DRIVER):
        self.api = api
        self.dra_driver = dra_driver
        self.prometheus = prometheus
        self.policy = policy
        self.clock = clock
        self.tiers = TierTable([(t.name, t.products) for t in policy.card_tiers])
        self.catalog = kinds.Catalog.of(policy.reclaim.owner_actions.kinds)
        self.api_calls = 0
        self.who: Attribution | None = None  # the last read's attribution (the report's too)
        self.audit = UnitAudit(prometheus, policy.telemetry.node_labels,
                               float(policy.reclaim.idle.window or 0))
        self.doubted = 0  # series the last evidence read doubted

    async def read(self, recent: Sequence[PastAction] = ()) -> Snapshot:
        now = self.clock()
        wires, wire_nodes, ns_labels, owned = await self._lists()
        names = self.policy.resources
        pods, nodes, by_uuid, tainted = await self._join_dra(
            [to_node(w, names) for w in wire_nodes],
            [p for p in (_pod(w, names) for w in wires) if p is not None])
        chains = OwnerChains(self.api, self.catalog)
        owners = await chains.resolve(pods, wires, listed_links(owned))
        queued = await chains.kueue_demand(names)
        min_counts = await self._min_counts(pods)
        self.api_calls += chains.api_calls
        # Every pod's node, the exporters' too: an older exporter's series name its pod, not
        # its node (core.attribution.node_of).
        pod_nodes = {w.metadata.name: w.spec.node_name for w in wires if w.spec.node_name}
        # The decoded LIST goes before the evidence answers arrive, so that the cycle's peak
        # memory is the larger of the two, not their sum (20,000 pods: 310 -> 2xx MB).
        del wires, wire_nodes, chains
        self.who = self.attribution(nodes, pods, pod_nodes, by_uuid)
        evidence, ok, problem = await self.evidence(pods, now, self.who)
        telemetry: dict[str, Fault] = {}
        if ok:
            try:
                telemetry = await gpu_faults(self.prometheus, self.policy, self.who)
            except TelemetryUnavailable as e:  # no reclaim on evidence that may hide a fault
                ok, problem = False, f"GPU fault series unreadable: {e}"
        faults = pod_faults(pods, nodes, self.policy.health, telemetry, tainted)
        return Snapshot(
            now=now, pods=pods, nodes=nodes, owners=owners,
            namespace_labels=ns_labels,
            evidence=evidence, telemetry_ok=ok, telemetry_problem=problem,
            recent_actions=tuple(recent),
            tiers={n.name: self.tiers.tier_of(n.product) for n in nodes.values()},
            restore_asks=restore_asks(owned, ns_labels, names),
            kueue=queued, doubted_series=self.doubted, faults=faults, min_counts=min_counts,
        )

    async def _min_counts(self, pods: Iterable[Pod]) -> dict[str, int]:
        """Each gang PodGroup's minCount ("PodGroup ns/name", as gangs.gang_of names it), read
        only where a waiting pod names a PodGroup. Where the API is not served (before 1.36,
        or GenericWorkload off) or not readable, none: a waiting gang then needs all of its
        waiting pods placed, the stricter demand."""
        if not any(p.pod_group and p.node is None for p in pods):
            return {}
        try:
            raws = await self._list(PODGROUPS_PATH)
            groups = _decode(raws, WirePodGroup)
        except (KubeRefused, msgspec.ValidationError) as e:
            log.warning("PodGroups unreadable, a waiting gang needs all its waiting pods "
                        "placed: %s", e)
            return {}
        return {f"PodGroup {g.metadata.namespace}/{g.metadata.name}": g.min_count
                for g in groups if g.min_count is not None}

    async def _lists(self) -> tuple[list[WirePod], list[WireNode], dict[str, dict[str, str]],
                                    dict[str, list[Workload]]]:
        """The LISTs decoded: pods, nodes, namespace labels and the built-in workloads. Each
        raw page holds every byte the API server sent (managedFields included) and is freed
        on return, once its objects are decoded."""
        pods_raw, nodes_raw, ns_raw, *workloads = await asyncio.gather(
            self._list("/api/v1/pods"), self._list("/api/v1/nodes"),
            self._list("/api/v1/namespaces"),
            *(self._list(path) for path in WORKLOAD_PATHS.values()))
        ns_labels = {n.metadata.name: n.metadata.labels or {}
                     for n in _decode(ns_raw, NamespaceObj)}
        owned = dict(zip(WORKLOAD_PATHS, (_decode(w, Workload) for w in workloads), strict=True))
        return _decode(pods_raw, WirePod), _decode(nodes_raw, WireNode), ns_labels, owned

    async def _join_dra(self, nodes: list[Node], pods: list[Pod],
                        ) -> tuple[tuple[Pod, ...], dict[str, Node], dict[str, str],
                                   dict[str, Fault]]:
        """Nodes and GPU pods with their DRA devices (core/dra.py), DRA GPU UUID -> pod, and
        pod -> the fault a taint on its devices declares."""
        store = FleetStore()
        dra = DraFleet(store, self.dra_driver)
        self.api_calls += len(DRA_KINDS)
        await read_dra(self.api, dra)
        dra.replace_all(nodes, pods)
        by_uuid = {d.uuid: p.key for p in store.pods.values() for d in dra.devices_of(p.uid)
                   if d.uuid}
        return (tuple(store.pods.values()), dict(store.nodes), by_uuid,
                dra.faults(self.policy.health))

    async def _list(self, path: str) -> list[msgspec.Raw]:
        self.api_calls += 1
        items, _ = await list_raw(self.api, path)
        return items

    def attribution(self, nodes: Iterable[str], pods: Iterable[Pod],
                    pod_nodes: Mapping[str, str] | None = None,
                    by_uuid: Mapping[str, str] | None = None) -> Attribution:
        t = self.policy.telemetry
        return Attribution.of(t.node_labels, t.honor_labels, nodes, pods, pod_nodes, by_uuid)

    async def evidence(self, pods: tuple[Pod, ...], now: float, who: Attribution | None = None,
                       ) -> tuple[dict[float, dict[str, Evidence]], bool, str]:
        needed = sorted(windows(self.policy, tuple(p for p in pods if p.node)))
        who = who or self.attribution({p.node for p in pods if p.node}, pods)
        try:
            # names read: those with samples in the longest window (and a scrape's margin)
            await self.prometheus.check_names(max(needed, default=0.0)
                                              + float(self.policy.telemetry.scrape_interval))
            words = self.prometheus.present  # one set of names for every query of this read
            age = await self._telemetry_age(now, words)
            if age > float(self.policy.telemetry.stale_after):
                return {}, False, f"newest GPU sample is {age:.0f}s old"
            newest, doubted, *answers = await asyncio.gather(
                self._newest(words), self.audit.series(now),
                *(self._window(w, words) for w in needed))
        except TelemetryUnavailable as e:
            return {}, False, str(e)
        self.doubted = len(doubted)
        doubts = {(who.node(s) or "", gpu_id(s)) for s in doubted}
        scrape = float(self.policy.telemetry.scrape_interval)
        return {w: per_pod(w, peaks, counts, w / scrape, who, newest, now, doubts)
                for w, (peaks, counts) in zip(needed, answers, strict=True)}, True, ""

    async def _telemetry_age(self, now: float, present: Vocabulary) -> float:
        result = await self.prometheus.query(newest_sample(present))
        words = self.prometheus.vocabulary  # every name looked for
        if not result:
            raise TelemetryUnavailable(
                f"no utilization series ({' or '.join(words.names(Concept.UTILIZATION))}) and "
                f"no engine activity ({' or '.join(words.names(Concept.ENGINE_ACTIVITY))}, "
                "MIG) at all")
        return now - float(result[0]["value"][1])

    async def _newest(self, present: Vocabulary) -> dict[GpuKey, float]:
        """Each GPU's newest sample time, keyed as the evidence series are."""
        result = await self.prometheus.query(newest_query(self.policy.telemetry.node_labels,
                                                          present))
        return {_gpu_key(s["metric"]): float(s["value"][1]) for s in result}

    async def _window(self, window: float, present: Vocabulary
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        peak_q, count_q = evidence_queries(
            window, self.policy.telemetry.node_labels, present,
            exact_range(window, bool(self.prometheus.left_closed)))
        peaks, counts = await asyncio.gather(self.prometheus.query(peak_q),
                                             self.prometheus.query(count_q))
        return peaks, counts


def _by_gpu(node_labels: Sequence[str]) -> str:
    return keeping(["UUID", *gpu_labels(node_labels)])


def newest_query(node_labels: Sequence[str], vocabulary: Vocabulary) -> str:
    """Each GPU's newest sample time (``timestamp`` inside the aggregation, so it is still each
    sample's time), over the same series and labels as the evidence queries. A series whose
    exporter stopped has no sample within Prometheus' lookback and is absent: no time at all."""
    return _per_gpu(node_labels, vocabulary, _timestamp, None)


def evidence_queries(window: float, node_labels: Sequence[str], vocabulary: Vocabulary,
                     span: str | None = None) -> tuple[str, str]:
    """(peak utilization %, samples) per GPU and metric name over the window, keeping its UUID,
    node, index, pod and the name it came under: the same series in both, so per_pod can pair
    them by their whole label set, and join a GPU's names. The per-pod series of shared GPUs
    (the agent's, HAMi's: adapters.promql.per_pod_util) come along, labelled ``vgpu``.
    ``span``: the range selector's text, where the caller needs other than whole seconds
    (adapters.promql.exact_range)."""
    w = span or f"{int(window)}s"
    return (_per_gpu(node_labels, vocabulary, lambda m: _checked_peak(m, w), Unit.PERCENT),
            _per_gpu(node_labels, vocabulary, lambda m: f"count_over_time({m}[{w}])", None))


def _per_gpu(node_labels: Sequence[str], vocabulary: Vocabulary, body: Callable[[str], str],
             unit: Unit | None) -> str:
    """``body`` over each GPU's utilization and the per-pod series, one series per GPU
    and name. Marked only while a concept is read under several names (an exporter upgrade in
    the window): each name aggregated, then marked, which relabels the fewest series; with one
    name each the query is as it was before names were joined (marking cost 1.13x)."""
    by = _by_gpu(node_labels)
    if vocabulary.several(Concept.UTILIZATION, Concept.ENGINE_ACTIVITY):
        per_pod = f"{by}({per_pod_util(body)})"
        return f"({utilization(vocabulary, unit, body, aggregate=by)} or {per_pod})"
    return by + f"({utilization(vocabulary, unit, body, mark=False)} or {per_pod_util(body)})"


def _timestamp(selector: str) -> str:
    return f"timestamp({selector})"


def _checked_peak(metric: str, w: str) -> str:
    """max_over_time skips NaN samples, so a GPU reading NaN half the time showed its other
    samples' peak and read idle. The added terms are 0 while every sample is a number >= 0, and
    NaN once any is NaN or infinite (the sum) or negative (the square root of the minimum): the
    peak is then NaN, which judge() calls unknown."""
    samples = f"{metric}[{w}]"
    return (f"(max_over_time({samples}) + 0 * sum_over_time({samples}) "
            f"+ 0 * sqrt(min_over_time({samples})))")


GpuKey = tuple[tuple[str, str], ...]  # every label of an aggregated evidence series


def per_pod(window: float, peaks: list[dict[str, Any]], counts: list[dict[str, Any]],
            expected: float, who: Attribution, newest: Mapping[GpuKey, float] | None = None,
            now: float = 0.0, doubts: Collection[tuple[str, str]] = ()
            ) -> dict[str, Evidence]:
    """Fold per-GPU series into per-pod evidence: max of peaks, min of coverage, and (given
    each series' ``newest`` sample time) the age of the stalest GPU at ``now``. A series in
    ``doubts`` ((node, GPU): one of its percent series reads as a ratio) give no reading,
    under any name: the series come unmarked while a fleet runs one generation.

    A GPU read under two metric names (an exporter upgraded within the window: core.vocabulary)
    is judged on both: its peak is the higher, its coverage the sum of each name's, its age
    that of its newest series. Within one name a GPU's several series (e.g. two label sets)
    cover it only as far as the least of them, and one with no newest sample is infinitely old.

    Only series whose pod the API server shows holding GPUs on that node count. On a shared GPU
    a pod's own per-pod series stand for it, whatever else names it there (order-independent).
    """
    gpu_count = {_gpu_key(s["metric"]): float(s["value"][1]) for s in counts}
    # pod -> GPU -> per-pod series? -> series -> peak
    found: dict[str, dict[tuple[str, ...], dict[bool, dict[GpuKey, float]]]] = {}
    for s in peaks:
        labels = s["metric"]
        node = who.node(labels)
        pod = who.pod(labels, node)
        if pod is not None:
            gpu = (node or "", gpu_id(labels))
            kinds = found.setdefault(pod, {}).setdefault(gpu, {})
            doubted = gpu in doubts
            kinds.setdefault(is_per_pod(labels), {})[_gpu_key(labels)] = (
                math.nan if doubted else float(s["value"][1]))
    out = {}
    for pod, gpus in found.items():
        chosen = [kinds.get(True) or kinds[False] for kinds in gpus.values()]
        out[pod] = Evidence(window=window,
                            peak_percent=peak_of(v for c in chosen for v in c.values()),
                            coverage=min(_coverage(c, gpu_count, expected) for c in chosen),
                            gpus_seen=len(gpus),
                            age=0.0 if newest is None else max(now - _newest(c, newest)
                                                               for c in chosen))
    return out


def _by_name(series: Iterable[GpuKey]) -> dict[str, list[GpuKey]]:
    """One GPU's series by the metric name each came under."""
    out: dict[str, list[GpuKey]] = {}
    for key in series:
        out.setdefault(dict(key).get(SOURCE_LABEL, ""), []).append(key)
    return out


def _coverage(series: Iterable[GpuKey], counts: Mapping[GpuKey, float], expected: float) -> float:
    """One GPU's coverage: each name's samples (the fewest of its series), summed over names."""
    samples = sum(min(counts.get(k, 0.0) for k in keys) for keys in _by_name(series).values())
    return min(1.0, samples / max(expected, 1.0))


def _newest(series: Iterable[GpuKey], newest: Mapping[GpuKey, float]) -> float:
    """One GPU's newest sample: under the name whose stalest series is newest."""
    return max(min(newest.get(k, -math.inf) for k in keys)
               for keys in _by_name(series).values())


def _gpu_key(labels: Mapping[str, str]) -> GpuKey:
    return tuple(sorted(labels.items()))


def _pod(w: WirePod, resources: Sequence[str]) -> Pod | None:
    try:
        pod = to_pod(w, resources)
    except QuantityError:
        return None
    # A pod with DRA claims may hold GPUs through them: the DRA join decides.
    held = pod.gpus > 0 or pod.claims
    return pod if held and pod.phase not in ("Succeeded", "Failed") else None
