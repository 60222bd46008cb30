"""Gangs: pods that only make progress together (a distributed training job's ranks, a Ray
cluster, a leader and its workers). Evicting one pod of eight frees one GPU and stalls seven,
so a gang pod is never evicted on its own (issue 29).

A gang stopped through its owner's switch (a JobSet or RayCluster suspended, a
LeaderWorkerSet scaled to zero, a Kueue Workload deactivated) is already acted on whole, and
only once every GPU pod of the owner is idle (decide.GROUP_ACTIONS). What this module stops is
the other path: a gang pod whose reclaim would be an eviction (a bare pod of a PodGroup, or a
kind the policy set to ``evict``). Such a pod is marked and warned like any other; at its
deadline the reclaim is blocked with the reason on the pod and in an Event, until stopping a
whole gang by eviction is supported.

A pod is one of a gang when it names one: the Workload API's PodGroup (Kubernetes 1.36
``spec.schedulingGroup.podGroupName``, k8s.io/api core/v1 PodSchedulingGroup), or on 1.35 its
Workload's pod group (``spec.workloadRef``: name, podGroup, podGroupReplicaKey, the field 1.36
replaced), else the label its controller puts on every pod of the group (GANG_LABELS,
LWS_NAME).
"""

from __future__ import annotations

from gpusteward.core.model import Pod

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
    if pod.pod_group:
        return f"PodGroup {pod.namespace}/{pod.pod_group}"
    if pod.workload_group:
        return f"Workload group {pod.namespace}/{pod.workload_group}"
    labels = pod.labels
    if LWS_NAME in labels:
        group = labels.get(LWS_GROUP)
        return (f"LeaderWorkerSet {pod.namespace}/{labels[LWS_NAME]}"
                + (f" group {group}" if group is not None else ""))
    for label, what in GANG_LABELS:
        if label in labels:
            return f"{what} {pod.namespace}/{labels[label]}"
    return None


def eviction_refused(pod: Pod) -> str | None:
    """Why the pod may not be evicted on its own; None when it may."""
    gang = gang_of(pod)
    if gang is None:
        return None
    return (f"the pod is one of {gang}, whose pods only work together: gpusteward never "
            "evicts a gang pod by pod; give its owner a switch in reclaim.ownerActions "
            "(suspend, scale) to stop it whole")
