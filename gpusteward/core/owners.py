"""The owner kinds gpusteward knows, and the mechanism that stops each: data and names only.

Acting below the top-level owner fights its controller (an evicted RayCluster pod is recreated at
once; a StatefulSet scaled down under a Notebook is scaled back; a Kueue-managed Job's `suspend`
is Kueue's to write), so the reclaimer acts on the top-most owner it knows, through the owner's
own switch. Every field and annotation below was checked against the upstream API named beside
it. Below the policy (which refuses a switch for a kind listed here) and the reclaim decisions
(core.reclaim.kinds builds the patches from it); imports nothing of gpusteward.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class How(StrEnum):
    """How a reclaim acts on the owner (policy reclaim.ownerActions; KINDS below for the owners
    stopped through a switch of their own)."""

    EVICT = "evict"
    SUSPEND = "suspend"  # a boolean spec field set to true (Job, JobSet, RayCluster, ...)
    SCALE = "scale"  # to zero replicas, the count kept in REPLICAS_BEFORE
    ANNOTATE = "annotate"  # marks and warnings only, never a reclaim
    DEACTIVATE = "deactivate"  # Kueue Workload spec.active=false
    # Kueue Workload's priority-boost lowered: it runs on until Kueue needs its quota
    DEMOTE = "demote"
    STOP = "stop"  # the owner's stop annotation (Notebook, KServe)
    PAUSE = "pause"  # the autoscaler paused at zero replicas (KEDA)
    BLOCK = "block"  # no safe mechanism: an Event says why, nothing is stopped


# The mechanisms (Action.how) beyond the built-in Pod/Job/Deployment/StatefulSet ones.
SUSPEND, SCALE, DEACTIVATE, DEMOTE = How.SUSPEND, How.SCALE, How.DEACTIVATE, How.DEMOTE
STOP, PAUSE, BLOCK = How.STOP, How.PAUSE, How.BLOCK
# Act on a whole workload: only when all its pods are idle.
WHOLE_OWNER = frozenset({SUSPEND, SCALE, DEACTIVATE, DEMOTE, STOP, PAUSE})

KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"  # kueue apis/kueue/v1beta2/constants.go
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"  # kueue pkg/controller/constants: on the Workload
# kueue v0.17.0 pkg/controller/constants PriorityBoostAnnotationKey: a signed int32 added to the
# Workload's priority wherever Kueue orders or preempts (pkg/util/priority EffectivePriority),
# behind Kueue's PriorityBoost feature gate (alpha, off by default in v0.17).
KUEUE_PRIORITY_BOOST = "kueue.x-k8s.io/priority-boost"
KEDA_PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"  # keda.sh docs: "Pause autoscaling"
NOTEBOOK_STOPPED = "kubeflow-resource-stopped"  # kubeflow notebook-controller culling_controller
NOTEBOOK_LAST_ACTIVITY = "notebooks.kubeflow.org/last-activity"  # same file
KSERVE_STOP = "serving.kserve.io/stop"  # kserve pkg/constants StopAnnotationKey, "true"/"false"


class Kind(msgspec.Struct, frozen=True):
    """One owner kind gpusteward knows: its resource, and the switch that stops it.

    ``field``: the spec path set to true to stop it (false to restore); ``annotation``: the
    annotation set to stop it; ``scale``: stopped through the scale subresource. ``stopped``: the
    status that says the owner has let its pods go (None: the switch itself says so)."""

    group: str
    kind: str
    plural: str
    how: How
    field: tuple[str, ...] = ()
    annotation: str = ""
    stopped: tuple[str, str] | None = None  # (status path "a.b" or condition type, value)
    source: str = ""


KINDS: tuple[Kind, ...] = (
    Kind("jobset.x-k8s.io", "JobSet", "jobsets", SUSPEND, ("spec", "suspend"),
         source="kubernetes-sigs/jobset api/jobset/v1alpha2 JobSetSpec.Suspend"),
    Kind("trainer.kubeflow.org", "TrainJob", "trainjobs", SUSPEND, ("spec", "suspend"),
         source="kubeflow/trainer pkg/apis/trainer/v1alpha1 TrainJobSpec.Suspend"),
    Kind("kubeflow.org", "PyTorchJob", "pytorchjobs", SUSPEND, ("spec", "runPolicy", "suspend"),
         source="kubeflow/training-operator pkg/apis/kubeflow.org/v1 RunPolicy.Suspend"),
    Kind("ray.io", "RayCluster", "rayclusters", SUSPEND, ("spec", "suspend"),
         stopped=("condition", "RayClusterSuspended"),
         source="kuberay ray-operator v1.5.0 apis/ray/v1/raycluster_types.go"),
    Kind("ray.io", "RayJob", "rayjobs", SUSPEND, ("spec", "suspend"),
         stopped=("status.jobDeploymentStatus", "Suspended"),
         source="kuberay ray-operator v1.5.0 apis/ray/v1/rayjob_types.go"),
    Kind("kubeflow.org", "Notebook", "notebooks", STOP, annotation=NOTEBOOK_STOPPED,
         source="kubeflow/kubeflow components/notebook-controller culling_controller.go"),
    Kind("serving.kserve.io", "InferenceService", "inferenceservices", STOP,
         annotation=KSERVE_STOP, source="kserve pkg/constants StopAnnotationKey"),
    Kind("serving.kserve.io", "LLMInferenceService", "llminferenceservices", STOP,
         annotation=KSERVE_STOP, source="kserve pkg/constants StopAnnotationKey"),
    Kind("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "leaderworkersets", SCALE,
         source="kubernetes-sigs/lws: the CRD serves the scale subresource (HPA docs)"),
    Kind("kueue.x-k8s.io", "Workload", "workloads", DEACTIVATE, ("spec", "active"),
         source="kueue v0.17.0 apis/kueue/v1beta2/workload_types.go WorkloadSpec.Active"),
)
# The kinds the reclaimer acts on through typed clients (core group, apps, batch), each served
# at v1 everywhere: kind -> (apiVersion, plural), for the paths it writes and the Events it names.
BUILT_IN_RESOURCES = {"Pod": ("v1", "pods"), "ReplicaSet": ("apps/v1", "replicasets"),
                      "Deployment": ("apps/v1", "deployments"),
                      "StatefulSet": ("apps/v1", "statefulsets"),
                      "DaemonSet": ("apps/v1", "daemonsets"), "Job": ("batch/v1", "jobs")}
# Kinds with a reason instead of a mechanism.
NO_SWITCH = {("ray.io", "RayService"): "RayService has no spec.suspend (kuberay v1.5.0)"}


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


BUILT_IN = {kind: group_of(v) for kind, (v, _) in BUILT_IN_RESOURCES.items()}  # kind -> group
V1_GROUPS = set(BUILT_IN.values()) - {""}  # apps, batch: served at v1 everywhere


def has_switch(group: str, kind: str) -> bool:
    """Whether gpusteward decides this kind its own way (built in, in KINDS, or NO_SWITCH)."""
    return (BUILT_IN.get(kind) == group or (group, kind) in NO_SWITCH
            or any(k.group == group and k.kind == kind for k in KINDS))
