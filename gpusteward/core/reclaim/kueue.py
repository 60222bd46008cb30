"""Queue demand from Kueue: Workloads waiting for admission, and the quota idle ones hold.

Kueue keeps a queued job suspended until its Workload is admitted, so a job waiting for quota has
no pending pod for queue enforcement (queue.py) to see. Here a Workload that waits for quota in
its ClusterQueue is pending demand, and the idle admitted Workloads of the same ClusterQueue are
what can free that quota (by deactivation, core/reclaim/kinds.py). The rules are queue.py's: the
demand has waited at least ``queue.minWait``, may preempt, and takes only strictly lower
priorities (or equal ones under the team rule of queue.may_displace), as few as possible.

Quota is counted per ClusterQueue from its nominal quota and its reservations; quota held by
Workloads already being evicted counts as free (they are on their way out), so a Workload is
not reclaimed twice for one demand. Cohort borrowing is left to Kueue: demand the ClusterQueue's
own nominal quota could hold after reclaiming is the only demand acted on.

Fields, from kueue v0.17.0 apis/kueue/v1beta2: Workload spec.podSets[].{count,template},
spec.queueName, spec.priority, spec.active, status.admission.{clusterQueue,podSetAssignments
[].{resourceUsage,count}}, status.conditions (QuotaReserved, Admitted, Finished, Evicted);
LocalQueue spec.clusterQueue; ClusterQueue spec.resourceGroups[].flavors[].resources[]
.nominalQuota, status.flavorsReservation[].resources[].total.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from gpusteward.core.kubewire import (
    Condition,
    Meta,
    PodSpec,
    QuantityError,
    parse_count,
    pod_request,
)
from gpusteward.core.model import Pod
from gpusteward.core.reclaim.model import Holding, KueueDemand, Waiting
from gpusteward.core.reclaim.queue import Candidate, may_displace
from gpusteward.core.reclaim.quota import TeamUsage
from gpusteward.core.times import parse_time

Quantity = str | int | float


class Template(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


class PodSet(msgspec.Struct):
    count: int = 1
    template: Template = msgspec.field(default_factory=Template)


class WorkloadSpec(msgspec.Struct, rename="camel"):
    pod_sets: list[PodSet] = msgspec.field(default_factory=list)
    queue_name: str = ""
    priority: int | None = None
    active: bool | None = None


class Assignment(msgspec.Struct, rename="camel"):
    resource_usage: dict[str, Quantity] | None = None


class Admission(msgspec.Struct, rename="camel"):
    cluster_queue: str = ""
    pod_set_assignments: list[Assignment] | None = None


class WorkloadStatus(msgspec.Struct):
    conditions: list[Condition] | None = None
    admission: Admission | None = None


class WireWorkload(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: WorkloadSpec = msgspec.field(default_factory=WorkloadSpec)
    status: WorkloadStatus = msgspec.field(default_factory=WorkloadStatus)


class LocalQueueSpec(msgspec.Struct, rename="camel"):
    cluster_queue: str = ""


class WireLocalQueue(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: LocalQueueSpec = msgspec.field(default_factory=LocalQueueSpec)


class ResourceAmount(msgspec.Struct, rename="camel"):
    name: str = ""
    nominal_quota: Quantity = 0
    total: Quantity = 0


class FlavorAmounts(msgspec.Struct):
    name: str = ""
    resources: list[ResourceAmount] = msgspec.field(default_factory=list)


class ResourceGroup(msgspec.Struct):
    flavors: list[FlavorAmounts] = msgspec.field(default_factory=list)


class ClusterQueueSpec(msgspec.Struct, rename="camel"):
    resource_groups: list[ResourceGroup] = msgspec.field(default_factory=list)


class ClusterQueueStatus(msgspec.Struct, rename="camel"):
    flavors_reservation: list[FlavorAmounts] = msgspec.field(default_factory=list)


class WireClusterQueue(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: ClusterQueueSpec = msgspec.field(default_factory=ClusterQueueSpec)
    status: ClusterQueueStatus = msgspec.field(default_factory=ClusterQueueStatus)


class Claim(msgspec.Struct, frozen=True):
    pending: Pod
    cluster_queue: str
    victims: tuple[Candidate, ...]


def demand(workloads: Iterable[WireWorkload], local_queues: Iterable[WireLocalQueue],
           cluster_queues: Iterable[WireClusterQueue], names: Sequence[str]) -> KueueDemand:
    """What waits, what holds quota, and the free quota of each ClusterQueue (nominal minus
    reserved, plus what Workloads being evicted still reserve)."""
    queue_of = {(q.metadata.namespace, q.metadata.name): q.spec.cluster_queue
                for q in local_queues}
    waiting: list[Waiting] = []
    holding: dict[str, Holding] = {}
    for wl in workloads:
        m, conditions = wl.metadata, wl.status.conditions or ()
        if _true(conditions, "Finished"):
            continue
        admission = wl.status.admission
        if admission is not None:
            if _true(conditions, "QuotaReserved"):
                leaving = wl.spec.active is False or _true(conditions, "Evicted")
                holding[f"{m.namespace}/{m.name}"] = Holding(
                    admission.cluster_queue, _admitted_gpus(admission, names), leaving)
            continue
        cq = queue_of.get((m.namespace, wl.spec.queue_name))
        pod = _as_pod(wl, conditions, names)
        if cq and wl.spec.active is not False and pod is not None and pod.gpus > 0:
            waiting.append(Waiting(pod, cq))
    free = {q.metadata.name: n for q in cluster_queues if (n := _free(q, names)) is not None}
    for h in holding.values():
        if h.leaving and h.cluster_queue in free:
            free[h.cluster_queue] += h.gpus
    return KueueDemand(tuple(waiting), holding, free)


def claims(d: KueueDemand, now: float, min_wait: float, candidates: Iterable[Candidate],
           workload_of: Callable[[Candidate], str | None],
           teams: Mapping[str, TeamUsage], team_of: Callable[[Pod], str]) -> list[Claim]:
    """For each Workload waiting for quota (highest priority, then oldest, first), the fewest
    idle admitted Workloads of its ClusterQueue whose quota lets it in, if any.

    candidates: idle pods whose whole owner may be reclaimed; workload_of names the admitted
    Workload (namespace/name) an owner is stopped through, None for any other owner."""
    pool: dict[str, list[tuple[Candidate, int]]] = {}
    seen: set[str] = set()
    for c in candidates:
        key = workload_of(c)
        held = d.holding.get(key) if key is not None else None
        if key is None or held is None or held.leaving or held.gpus <= 0 or key in seen:
            continue
        seen.add(key)
        pool.setdefault(held.cluster_queue, []).append((c, held.gpus))
    for members in pool.values():  # largest first (fewest victims), then lowest priority
        members.sort(key=lambda m: (-m[1], m[0].pod.priority, m[0].pod.uid))
    free = dict(d.free)
    out: list[Claim] = []
    for w in sorted(d.waiting, key=lambda w: (-w.pod.priority, w.pod.unschedulable_since or 0,
                                              w.pod.uid)):
        p = w.pod
        if p.preemption_policy == "Never" or p.unschedulable_since is None or (
                now - p.unschedulable_since < min_wait) or w.cluster_queue not in free:
            continue
        need = p.gpus - free[w.cluster_queue]
        if need <= 0:
            continue  # the quota is there: it waits for something else (flavors, checks)
        own = teams.get(team_of(p)) or TeamUsage(team_of(p))
        members = pool.get(w.cluster_queue, [])
        chosen, freed = [], 0
        for c, gpus in members:
            if freed >= need:
                break
            if may_displace(p, own, c, teams.get(c.team) or TeamUsage(c.team)):
                chosen.append((c, gpus))
                freed += gpus
        if freed < need:
            continue
        pool[w.cluster_queue] = [m for m in members if m not in chosen]
        free[w.cluster_queue] += freed - p.gpus
        out.append(Claim(p, w.cluster_queue, tuple(c for c, _ in chosen)))
    return out


def _as_pod(wl: WireWorkload, conditions: Sequence[Condition],
            names: Sequence[str]) -> Pod | None:
    """None when a quantity or a time is unreadable: no reclaim for demand on a guess."""
    m, sets = wl.metadata, wl.spec.pod_sets
    reserved = next((c for c in conditions if c.type == "QuotaReserved"), None)
    try:
        gpus = sum(s.count * sum(pod_request(s.template.spec, names).values()) for s in sets)
        since = parse_time(reserved.last_transition_time if reserved is not None else None) \
            or parse_time(m.creation_timestamp)
    except ValueError:  # QuantityError too
        return None
    first = sets[0].template if sets else Template()
    return Pod(m.namespace, f"Workload/{m.name}", m.uid, gpus, priority=wl.spec.priority or 0,
               preemption_policy=first.spec.preemption_policy or "PreemptLowerPriority",
               labels=first.metadata.labels or {}, unschedulable_since=since,
               created_at=since or 0.0)


def _admitted_gpus(admission: Admission, names: Sequence[str]) -> int:
    try:
        return sum(parse_count(a.resource_usage[n]) for a in admission.pod_set_assignments or ()
                   for n in names if a.resource_usage and n in a.resource_usage)
    except QuantityError:
        return 0


def _free(q: WireClusterQueue, names: Sequence[str]) -> int | None:
    """Nominal quota less what is reserved, for the GPU resources, over all flavors; None when
    a quantity is no whole count (the queue is left alone: no reclaim on a guess)."""
    try:
        nominal = sum(parse_count(r.nominal_quota) for g in q.spec.resource_groups
                      for f in g.flavors for r in f.resources if r.name in names)
        reserved = sum(parse_count(r.total) for f in q.status.flavors_reservation
                       for r in f.resources if r.name in names)
    except QuantityError:
        return None
    return max(0, nominal - reserved)


def _true(conditions: Iterable[Condition], kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in conditions)
