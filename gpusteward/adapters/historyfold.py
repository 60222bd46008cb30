"""Folding a what-if history's range-query answers, chunk by chunk, into core/whatif's
History: pod spans and facts from kube-state-metrics, GPU figures attributed to pods by
core/attribution, and the plain statements of what the record lacked."""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import ne, sub
from typing import Any

from gpusteward.adapters.errors import AdapterError
from gpusteward.adapters.promclient import Series
from gpusteward.core.attribution import Attribution, is_per_pod, node_of
from gpusteward.core.cards import TierTable
from gpusteward.core.dcgm import gpu_id
from gpusteward.core.model import CLASS_KEY, TEAM_LABEL, Node, OwnerRef, Pod
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import Owner
from gpusteward.core.reclaim.recheck import DEFAULT_POD_GRACE
from gpusteward.core.times import HOUR, stamp
from gpusteward.core.whatif.history import (
    BROKEN,
    Figures,
    Grid,
    History,
    PodRecord,
    Span,
)

# Built-in PriorityClasses (their values are fixed by Kubernetes); kube-state-metrics' pod
# series name a pod's class, never its numeric priority.
SYSTEM_PRIORITIES = {"system-node-critical": 2_000_001_000,
                     "system-cluster-critical": 2_000_000_000}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


class NoHistory(AdapterError):
    """The window holds no pod history or no GPU telemetry to replay."""


def label_name(key: str) -> str:
    """kube-state-metrics' label for a pod label key (``label_`` + the key sanitized)."""
    return "label_" + _INVALID.sub("_", key)


def ksm_resource(name: str) -> str:
    return _INVALID.sub("_", name)


class Facts:
    """What the queries returned, folded as it arrives (each chunk's JSON is dropped after)."""

    def __init__(self, grid: Grid, node_labels: Sequence[str], xid_from: int = 0):
        self.grid = grid
        self.node_labels = node_labels
        self.xid_from = xid_from  # the step the XID counts are read from (<= 0)
        self.info: dict[str, dict[str, str]] = {}  # uid -> namespace, pod, priority_class
        self.node: dict[str, str] = {}  # uid -> the node it was bound to
        self.seen: dict[str, list[int]] = {}  # uid -> [first, last] step recorded
        self.phase: dict[tuple[str, str], list[int]] = {}  # (uid, phase) -> [first, last]
        self.gpus: dict[str, dict[str, int]] = {}  # uid -> resource -> count
        self.owner: dict[str, tuple[str, str]] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.created: dict[str, float] = {}
        self.started: dict[str, float] = {}  # status.startTime (minRuntime)
        self.models: dict[str, tuple[str, str]] = {}  # GPU (UUID) -> (node label, modelName)
        self.gpu_series: dict[tuple[tuple[str, str], ...], Figures] = {}
        # (node, GPU, XID code) -> (step, cumulative count) as recorded
        self.xids: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
        self.telemetry = array("b", bytes(grid.steps))

    def index(self, t: float) -> int:
        return round((t - self.grid.start) / self.grid.step)

    def add(self, name: str, rows: list[Series]) -> None:
        """Fold the rows of query ``name`` (adapters.history ``queries``)."""
        fold = {"info": self._info, "phase": self._phase, "peak": self._peak,
                "count": self._count, "gpus": self._gpus, "owner": self._owner,
                "labels": self._labels, "created": self._created, "started": self._started,
                "model": self._model, "xid": self._xid}
        fold[name](rows)

    def _span(self, spans: dict[Any, list[int]], key: Any, values: Sequence[Any]) -> None:
        first, last = self.index(values[0][0]), self.index(values[-1][0])
        span = spans.setdefault(key, [first, last])
        span[0], span[1] = min(span[0], first), max(span[1], last)

    def _info(self, rows: list[Series]) -> None:
        for s in rows:
            uid = s.metric.get("uid", "")
            if not uid or not s.values:
                continue
            self.info[uid] = {k: s.metric.get(k, "") for k in ("namespace", "pod",
                                                               "priority_class")}
            if s.metric.get("node"):
                self.node[uid] = s.metric["node"]
            self._span(self.seen, uid, s.values)

    def _phase(self, rows: list[Series]) -> None:
        for s in rows:
            if s.values:
                self._span(self.phase, (s.metric.get("uid", ""), s.metric.get("phase", "")),
                           s.values)

    def _per_step(self, rows: list[Series], slot: int) -> None:
        n = self.grid.steps
        for s in rows:
            if not s.values:
                continue
            key = tuple(sorted(s.metric.items()))
            times, texts = zip(*s.values, strict=True)
            values = array("d", map(float, texts))
            if slot == 0 and (max(values) > 100.0 or min(values) < 0.0
                              or any(map(math.isnan, values))):
                # NaN, infinite or out of range: no reading (rules.is_reading)
                values = array("d", (v if 0.0 <= v <= 100.0 else BROKEN for v in values))
            first, last = self.index(times[0]), self.index(times[-1])
            piece = self.gpu_series.get(key)
            if piece is None:
                piece = self.gpu_series[key] = Figures(max(0, first))
            if last - first + 1 == len(values) and first >= 0 and last < n:
                runs = [(first, 0, len(values))]  # one point per step: the usual case
            else:
                runs = self._runs(times)
            for at, a, b in runs:
                piece.put(slot, at, values[a:b])
                if slot == 1:
                    self._sampled(at, values[a:b])

    def _runs(self, times: Sequence[float]) -> list[tuple[int, int, int]]:
        """(step, a, b): the points ``a..b-1`` on consecutive steps from ``step`` on, within
        the grid (a series with gaps, e.g. an exporter outage, is put run by run)."""
        step = self.grid.step
        # a run can only break where two points are not one step apart
        maybe = compress(range(1, len(times)), map(ne, map(sub, times[1:], times[:-1]),
                                                    repeat(step)))
        ends = [j for j in maybe if self.index(times[j]) != self.index(times[j - 1]) + 1]
        out = []
        for a, b in zip([0, *ends], [*ends, len(times)], strict=True):
            first = self.index(times[a])
            lo, hi = max(0, first), min(self.grid.steps - 1, first + b - a - 1)
            if lo <= hi:
                out.append((lo, a + lo - first, a + hi - first + 1))
        return out

    def _sampled(self, first: int, counts: array) -> None:
        if min(counts) > 0:
            self.telemetry[first:first + len(counts)] = array("b", b"\x01" * len(counts))
        else:
            for i, c in enumerate(counts, first):
                if c > 0:
                    self.telemetry[i] = 1

    def _peak(self, rows: list[Series]) -> None:
        self._per_step(rows, 0)

    def _count(self, rows: list[Series]) -> None:
        self._per_step(rows, 1)

    def _gpus(self, rows: list[Series]) -> None:
        for s in rows:
            if s.values:
                self.gpus.setdefault(s.metric.get("uid", ""), {})[
                    s.metric.get("resource", "")] = int(float(s.values[-1][1]))

    def _owner(self, rows: list[Series]) -> None:
        for s in rows:
            self.owner[s.metric.get("uid", "")] = (s.metric.get("owner_kind", ""),
                                                  s.metric.get("owner_name", ""))

    def _labels(self, rows: list[Series]) -> None:
        for s in rows:
            self.labels[s.metric.get("uid", "")] = s.metric

    def _created(self, rows: list[Series]) -> None:
        _last_values(rows, self.created)

    def _started(self, rows: list[Series]) -> None:
        _last_values(rows, self.started)

    def _xid(self, rows: list[Series]) -> None:
        for s in rows:
            key = (node_of(s.metric, self.node_labels) or "", gpu_id(s.metric),
                   s.metric.get("xid", ""))
            points = self.xids.setdefault(key, [])
            points += ((self.index(t), v) for t, text in s.values
                       if not math.isnan(v := float(text)))

    def _model(self, rows: list[Series]) -> None:
        for s in rows:
            self.models[gpu_id(s.metric)] = (
                node_of(s.metric, self.node_labels) or "", s.metric.get("modelName", ""))

    def history(self, policy: Policy) -> History:
        if not self.seen:
            raise NoHistory(
                f"no kube-state-metrics pod history (kube_pod_info) between "
                f"{stamp(self.grid.start)} and {stamp(self.grid.end)}: is kube-state-metrics "
                "scraped by this Prometheus, and does its retention reach back that far?")
        if not any(self.telemetry):
            raise NoHistory(
                f"no GPU telemetry (utilization or engine activity, under any name) between "
                f"{stamp(self.grid.start)} and {stamp(self.grid.end)}: nothing to judge "
                "idleness by")
        wanted = {ksm_resource(r): r for r in policy.resources}
        pods = {uid: p for uid in self.seen if (p := self._pod(uid, wanted, policy)) is not None}
        nodes = self._nodes()
        who = Attribution.of(policy.telemetry.node_labels, policy.telemetry.honor_labels,
                             nodes, pods.values())
        uses, models, held = self._uses(who)
        xids = _rises(self.xids, self.xid_from)
        records = tuple(self._record(p, uses.get(p.key, []), models.get(p.key, ""),
                                     _faults_on(held.get(p.key, ()), xids))
                        for p in pods.values())
        stale = max(1, math.ceil(float(policy.telemetry.stale_after) / self.grid.step))
        tiers = TierTable([(t.name, t.products) for t in policy.card_tiers])
        return History(
            grid=self.grid, pods=records, nodes=nodes, owners=_owners(pods.values(), self.owner),
            scrape_interval=float(policy.telemetry.scrape_interval),
            telemetry=_fresh(self.telemetry, stale),
            tiers={n.name: tiers.tier_of(n.product) for n in nodes.values()},
            eviction_grace=max(float(policy.reclaim.eviction_grace), float(DEFAULT_POD_GRACE)),
            gaps=tuple(self._gaps(records, policy)))

    def _pod(self, uid: str, wanted: Mapping[str, str], policy: Policy) -> Pod | None:
        requests = {wanted[r]: n for r, n in self.gpus.get(uid, {}).items() if r in wanted and n}
        if not requests:
            return None
        info = self.info[uid]
        kind, name = self.owner.get(uid, ("", ""))
        first = self.seen[uid][0]
        return Pod(
            namespace=info["namespace"], name=info["pod"], uid=uid,
            gpus=sum(requests.values()), resources=requests, node=self.node.get(uid),
            priority_class=info["priority_class"],
            priority=SYSTEM_PRIORITIES.get(info["priority_class"], 0),
            labels=_pod_labels(self.labels.get(uid, {}), policy),
            owners=(OwnerRef(kind, name, controller=True),) if kind and kind != "<none>" else (),
            created_at=self.created.get(uid, self.grid.time(first)),
            started_at=self.started.get(uid))

    def _nodes(self) -> dict[str, Node]:
        gpus: dict[str, set[str]] = {}
        model: dict[str, str] = {}
        for gpu, (node, name) in self.models.items():
            if node:
                gpus.setdefault(node, set()).add(gpu)
                model[node] = name
        nodes = {n: Node(n, model[n].replace(" ", "-") or None, len(g))
                 for n, g in gpus.items()}
        for n in self.node.values():
            nodes.setdefault(n, Node(n, None, 0))
        return nodes

    def _uses(self, who: Attribution) -> tuple[dict[str, list[Figures]], dict[str, str],
                                               dict[str, list[tuple[str, str]]]]:
        """pod key -> its GPUs' figures; a pod's own per-pod series stand for a shared GPU
        (as in adapters.snapshot.per_pod); series of one GPU over time are merged. Also the
        pod's card, and its GPUs as (node, GPU)."""
        found: dict[str, dict[tuple[str, str], dict[bool, list[Figures]]]] = {}
        models: dict[str, str] = {}
        for key, piece in self.gpu_series.items():
            labels = dict(key)
            node = who.node(labels)
            pod = who.pod(labels, node)
            if pod is None:
                continue
            gpu = (node or "", gpu_id(labels))
            found.setdefault(pod, {}).setdefault(gpu, {}).setdefault(
                is_per_pod(labels), []).append(piece)
            models[pod] = self.models.get(gpu_id(labels), ("", ""))[1] or models.get(pod, "")
        self.gpu_series = {}  # merged below; the per-series figures are no longer needed
        out = {pod: [Figures.merged(kinds.get(True) or kinds[False]) for kinds in gpus.values()]
               for pod, gpus in found.items()}
        return out, models, {pod: list(gpus) for pod, gpus in found.items()}

    def _record(self, pod: Pod, pieces: Sequence[Figures], card: str,
                xids: Sequence[tuple[int, str]]) -> PodRecord:
        running = self.phase.get((pod.uid, "Running"))
        pending = self.phase.get((pod.uid, "Pending"))
        span = Span(*running) if running and pod.node else None
        ends = [p.first for p in pieces] + [p.end for p in pieces]
        if span is not None:
            ends += [max(0, span.first), min(self.grid.steps - 1, span.last) + 1]
        first, end = (min(ends), max(ends)) if ends else (0, 0)
        # An XID before the window is this pod's if it was running when the window began.
        faults = tuple(x for x in xids if span is not None and (
            span.holds(x[0]) or (x[0] < 0 and span.first <= 0)))
        return PodRecord(pod, card, running=span, pending=Span(*pending) if pending else None,
                         gpus=tuple(p.framed(first, end) for p in pieces), offset=first,
                         faults=faults)

    def _gaps(self, records: Sequence[PodRecord], policy: Policy) -> Iterable[str]:
        first = min(s[0] for s in self.seen.values())
        if first > 0:
            yield (f"pod history starts at {stamp(self.grid.time(first))}, "
                   f"{first * self.grid.step / HOUR:.2f} h into the window: nothing before it is "
                   "replayed")
        blind = [r.pod.key for r in records if r.running and not r.gpus]
        if blind:
            yield (f"{len(blind)} GPU pod(s) have no GPU telemetry attributed to them "
                   f"(e.g. {blind[0]}): judged unknown, never reclaimed, as live")
        if self.xids:
            yield ("XIDs are replayed from DCGM_EXP_XID_ERRORS_TOTAL (not the XID gauge or the "
                   "windowed count), read from health.xidWindow before the window: a count "
                   "recorded again after a gap in its series is taken as an XID then, so its "
                   "pods count as on a faulty GPU (never reclaimed), and an XID just before "
                   "the window is held against the pods running on its GPU when it began")
        dark = self.grid.steps - sum(self.telemetry)
        if dark:
            yield (f"{dark} of {self.grid.steps} cycles have no GPU sample at all: the replay "
                   "halts them, as the live reclaimer would")
        yield ("pod annotations are not in kube-state-metrics' default series: opt-outs "
               "(gpusteward.io/reclaim: never) and classes set by annotation are not seen, so "
               "those pods may be counted as reclaimed")
        yield ("numeric priorities are not in kube-state-metrics' pod series: pods of classes "
               "other than system-*-critical are taken as priority 0 (queue claims by priority "
               "and protectedPriority apply only by class name)")
        yield ("teams come from the pod label (kube_pod_labels, if allow-listed) or the "
               "namespace: namespace labels are not read")
        yield ("pending pods that could have started earlier assume any freed GPUs on one node "
               "fit them (selectors and affinity are not in the record): an upper bound")


def _pod_labels(metric: Mapping[str, str], policy: Policy) -> dict[str, str]:
    """The pod labels the replay needs, back from kube-state-metrics' sanitized names."""
    keys = {TEAM_LABEL, CLASS_KEY, *policy.reclaim.exclude_pod_labels}
    return {k: metric[label_name(k)] for k in keys if metric.get(label_name(k))}


def _owners(pods: Iterable[Pod], owner: Mapping[str, tuple[str, str]]) -> dict[str, Owner]:
    """pod uid -> the workload the reclaimer would act on. A ReplicaSet's Deployment is its name
    less the pod-template-hash suffix (kube_replicaset_owner is not read)."""
    top: dict[str, tuple[str, str, str]] = {}
    for p in pods:
        kind, name = owner.get(p.uid, ("", ""))
        if not kind or kind == "<none>":
            continue
        if kind == "ReplicaSet" and "-" in name:
            kind, name = "Deployment", name.rsplit("-", 1)[0]
        top[p.uid] = (kind, p.namespace, name)
    members: dict[tuple[str, str, str], list[str]] = {}
    for uid, key in top.items():
        members.setdefault(key, []).append(uid)
    return {uid: Owner(kind, ns, name, tuple(members[(kind, ns, name)]))
            for uid, (kind, ns, name) in top.items()}


def _fresh(sampled: array, stale: int) -> list[bool]:
    """Per step: any GPU sample within the last ``stale`` steps (the live freshness check)."""
    out, last = [], -stale - 1
    for i, any_sample in enumerate(sampled):
        if any_sample:
            last = i
        out.append(i - last < stale)
    return out


def _rises(xids: Mapping[tuple[str, str, str], list[tuple[int, float]]],
           first: int) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """(node, GPU) -> (step, reason) for each step its XID count rose. A series of the count
    appears with a GPU's first XID of a code after the exporter starts: one that appears after
    ``first`` (where the read began), or again after a gap, is taken as a rise then (whether an
    exporter restart or a scrape gap came between the record cannot tell, and taking it as one
    never reclaims a broken GPU's pod); one there from ``first`` on is older history."""
    out: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for (node, gpu, code), points in xids.items():
        last_step, last = first - 1, math.inf
        for step, count in sorted(points):
            if (step > last_step + 1 and step > first) or count > last:
                out.setdefault((node, gpu), []).append(
                    (step, f"XID {code} on GPU {gpu} (DCGM_EXP_XID_ERRORS_TOTAL rose)"))
            last_step, last = step, count
    return out


def _faults_on(gpus: Iterable[tuple[str, str]],
               rises: Mapping[tuple[str, str], list[tuple[int, str]]]) -> list[tuple[int, str]]:
    return sorted(x for g in gpus for x in rises.get(g, ()))


def _last_values(rows: list[Series], into: dict[str, float]) -> None:
    """Each pod's newest value of a per-pod time series (creation, start)."""
    for s in rows:
        if s.values:
            into[s.metric.get("uid", "")] = float(s.values[-1][1])
