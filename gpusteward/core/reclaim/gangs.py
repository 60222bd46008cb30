"""Gangs: pods that only make progress together (a distributed training job's ranks, a Ray
cluster, a leader and its workers). Evicting one pod of eight frees one GPU and stalls seven,
so a gang pod is never evicted on its own (issue 29).

A gang stopped through its owner's switch (a JobSet or RayCluster suspended, a
LeaderWorkerSet scaled to zero, a Kueue Workload deactivated) is already acted on whole, and
only once every GPU pod of the owner is idle (decide.GROUP_ACTIONS). What this module stops is
the other path: a gang whose reclaim would be an eviction (bare pods of a PodGroup, or a kind
the policy set to ``evict``). Its pods are marked and warned like any other; once every running
pod of the gang is due, the gang is evicted whole, in one decision (one reclaim for the limits,
all its pods re-checked and fenced, every PodDisruptionBudget over them asked first: the
actor). While only some are due (a stuck rank, a protected one), the due ones are blocked with
the reason on the pod and in an Event, naming which ranks are idle.

A pod is one of a gang when it names one: the Workload API's PodGroup (Kubernetes 1.36
``spec.schedulingGroup.podGroupName``, k8s.io/api core/v1 PodSchedulingGroup), or on 1.35 its
Workload's pod group (``spec.workloadRef``: name, podGroup, podGroupReplicaKey, the field 1.36
replaced), else the label its controller puts on every pod of the group (GANG_LABELS,
LWS_NAME).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpusteward.core.model import Pod
from gpusteward.core.reclaim.model import Owner

# (label, what it names): each from its controller's own constants.
GANG_LABELS = (
    # Kueue's plain pod groups (pkg/controller/jobs/pod/constants: GroupNameLabel).
    ("kueue.x-k8s.io/pod-group-name", "Kueue pod group"),
    # JobSet (api/jobset/v1alpha2: JobSetNameKey): every replicated job's pods.
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    # KubeRay (ray-operator/controllers/ray/utils/constant.go: RayClusterLabelKey).
    ("ray.io/cluster", "RayCluster"),
)
# LeaderWorkerSet (api/leaderworkerset/v1: SetNameLabelKey, GroupIndexLabelKey): one group is
# a leader and its workers, the set's other groups are gangs of their own.
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"


def gang_of(pod: Pod) -> str | None:
    """The gang the pod is one of, as people name it (``PodGroup ml/train``); None when it is
    not in one."""
    ref = _ref(pod)
    return None if ref is None else f"{ref[0]} {pod.namespace}/{ref[1]}"


def _ref(pod: Pod) -> tuple[str, str] | None:
    """(what, name) of the pod's gang."""
    if pod.pod_group:
        return "PodGroup", pod.pod_group
    if pod.workload_group:
        return "Workload group", pod.workload_group
    labels = pod.labels
    if LWS_NAME in labels:
        group = labels.get(LWS_GROUP)
        return "LeaderWorkerSet", labels[LWS_NAME] + (f" group {group}" if group is not None
                                                       else "")
    for label, what in GANG_LABELS:
        if label in labels:
            return what, labels[label]
    return None


def running(pods: Iterable[Pod]) -> dict[str, list[Pod]]:
    """Each gang's pods that hold their GPUs now (bound, not terminating), by name."""
    out: dict[str, list[Pod]] = {}
    for p in pods:
        if p.node is not None and not p.deleting and (g := gang_of(p)) is not None:
            out.setdefault(g, []).append(p)
    for members in out.values():
        members.sort(key=lambda p: p.name)
    return out


def owner(members: Sequence[Pod]) -> Owner:
    """The gang as the one workload its eviction stops: the limits count it once, the ledger
    remembers it by this key."""
    first = members[0]
    ref = _ref(first)
    assert ref is not None
    return Owner(ref[0], first.namespace, ref[1], tuple(p.uid for p in members))


def partly_due(gang: str, members: Sequence[Pod], due: Iterable[str]) -> str:
    """Why the due pods of a gang are not evicted: the ranks due, of how many."""
    ready = set(due)
    names = [p.name for p in members if p.uid in ready]
    return (f"{len(names)} of the {len(members)} running pods of {gang} are due "
            f"({', '.join(names)}); the others are busy or protected. gpusteward stops a gang "
            "only whole: once all of it is due, or through its owner's switch in "
            "reclaim.ownerActions")


def not_all_evictable(gang: str, which: Sequence[Pod]) -> str:
    """Why a wholly due gang is not evicted: some of its pods' owners are stopped otherwise."""
    return (f"{gang} is idle, but {', '.join(p.name for p in which)} would not be stopped by "
            "eviction (another owner action, or none allowed): gpusteward stops a gang only "
            "whole, in one way")


def short_of(gang: str, placeable: int, members: int, gpus: int) -> str:
    """Why no idle GPUs are freed for a waiting gang: freeing some would place only part of
    the ``members`` waiting pods it needs placed at once (all, or a PodGroup's minCount less
    its bound pods)."""
    return (f"{placeable} of the {members} waiting pods of {gang} could be placed (freeing "
            f"{gpus} idle GPU(s)); the scheduler starts a gang only once the pods it needs "
            "fit (all of them, or its PodGroup's minCount), so gpusteward frees GPUs for it "
            "only then: none freed")
