"""`make demo WITH=kueue`: two workloads reclaimed the native way, beside the placement demo.

- Kueue (the real one, ``--with kueue``): an idle low-priority Job admitted by a one-GPU
  ClusterQueue, and a busy higher-priority Job that waits for that quota with no pending pod.
  The reclaimer deactivates the idle Job's Workload for it; Kueue evicts the idle Job and admits
  the waiting one (docs/operations.md, "Queue demand from Kueue").
- A Kubeflow Notebook (our CRD of its upstream shape, gpusteward/sandbox/owner_crds.py) whose
  StatefulSet runs an idle GPU pod: the reclaimer stops the Notebook with its
  ``kubeflow-resource-stopped`` annotation, not the StatefulSet under it. The notebook
  controller is not built here; the demo stands in for it, scaling the StatefulSet to zero while
  the annotation is set, as the upstream controller does (kubeflow/kubeflow
  components/notebook-controller, notebook_controller.go: replicas 0 when stopped).
"""

from __future__ import annotations

import time
from typing import Any

from gpusteward.core.owners import KUEUE_JOB_UID, KUEUE_QUEUE, NOTEBOOK_STOPPED
from gpusteward.core.reclaim.model import RECLAIM_REASON
from gpusteward.sandbox import owner_crds
from gpusteward.sandbox.kubehttp import KubeHTTP, wait_for
from gpusteward.sandbox.simulator import UTIL_ANNOTATION

NS = "demo-native"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE = "demo-gpus"
PRIORITIES = {"demo-low": 100, "demo-high": 10000}
NOTEBOOK = "notebook-carol"


def gpu_template(labels: dict[str, str], util: str, priority_class: str | None = None,
                 restart: str = "Always") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "registry.invalid/cuda-job:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"labels": {"gpusteward.io/team": "demo", **labels},
                         "annotations": {UTIL_ANNOTATION: util}}, "spec": spec}


def queued_job(name: str, priority_class: str, util: str) -> dict[str, Any]:
    """Created suspended, as Kueue's docs ask where its admission webhook is not registered."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {KUEUE_QUEUE: QUEUE}},
            "spec": {"suspend": True, "template": gpu_template(
                {"gpusteward.io/class": "batch"}, util, priority_class, "Never")}}


def notebook_statefulset(notebook: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": NOTEBOOK, "ownerReferences": owner_crds.owned_by(notebook)},
            "spec": {"replicas": 1, "serviceName": NOTEBOOK,
                     "selector": {"matchLabels": {"notebook-name": NOTEBOOK}},
                     "template": gpu_template({"notebook-name": NOTEBOOK,
                                               "gpusteward.io/class": "interactive"}, "0")}}


def setup(api: KubeHTTP) -> None:
    """The queue, the idle Kueue Job (running), the idle notebook (running), then the waiting
    Job."""
    owner_crds.install(api, [owner_crds.NOTEBOOK])
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": NS}})
    for name, value in PRIORITIES.items():
        api.apply(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value})
    api.apply(f"{KUEUE}/resourceflavors/default", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "default"}, "spec": {}})
    api.apply(f"{KUEUE}/clusterqueues/{QUEUE}", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": QUEUE},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "default", "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": 1}]}]}]}})
    api.apply(f"{KUEUE}/namespaces/{NS}/localqueues/{QUEUE}", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": QUEUE, "namespace": NS}, "spec": {"clusterQueue": QUEUE}})
    api.create(f"/apis/batch/v1/namespaces/{NS}/jobs", queued_job("kueue-idle", "demo-low", "0"))
    notebook = api.create(f"/apis/kubeflow.org/v1/namespaces/{NS}/notebooks", {
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": NOTEBOOK},
        "spec": {}})
    api.create(f"/apis/apps/v1/namespaces/{NS}/statefulsets", notebook_statefulset(notebook))
    wait_for("the idle Kueue Job and the notebook to run",
             lambda: {"kueue-idle", NOTEBOOK} <= set(_running(api)), timeout=120)
    api.create(f"/apis/batch/v1/namespaces/{NS}/jobs",
               queued_job("kueue-urgent", "demo-high", "80"))


def _running(api: KubeHTTP) -> dict[str, str]:
    """Running pods: their Job or notebook name -> pod name."""
    out = {}
    for p in api.get(f"/api/v1/namespaces/{NS}/pods")["items"]:
        labels = p["metadata"].get("labels") or {}
        owner = labels.get("job-name") or labels.get("notebook-name")
        if owner and p["status"].get("phase") == "Running" and \
                "deletionTimestamp" not in p["metadata"]:
            out[owner] = p["metadata"]["name"]
    return out


def _workload(api: KubeHTTP, job: str) -> dict[str, Any] | None:
    uid = api.get(f"/apis/batch/v1/namespaces/{NS}/jobs/{job}")["metadata"]["uid"]
    items = api.get(f"{KUEUE}/namespaces/{NS}/workloads?labelSelector={KUEUE_JOB_UID}%3D{uid}")
    return items["items"][0] if items["items"] else None


def notebook_stopped(api: KubeHTTP) -> bool:
    notebook = api.get(f"/apis/kubeflow.org/v1/namespaces/{NS}/notebooks/{NOTEBOOK}")
    return NOTEBOOK_STOPPED in (notebook["metadata"].get("annotations") or {})


def notebook_controller(api: KubeHTTP) -> None:
    """The stand-in for Kubeflow's notebook controller: no replicas while the Notebook is
    stopped."""
    if notebook_stopped(api):
        api.apply(f"/apis/apps/v1/namespaces/{NS}/statefulsets/{NOTEBOOK}", {
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": NOTEBOOK},
            "spec": {"replicas": 0}}, manager="demo-notebook-controller")


def states(api: KubeHTTP) -> dict[str, str]:
    """What the demo shows of each native workload, in words."""
    running = _running(api)
    idle_wl = _workload(api, "kueue-idle") or {}
    reason = (idle_wl.get("metadata", {}).get("annotations") or {}).get(RECLAIM_REASON, "")
    stopped = notebook_stopped(api)
    suspended = api.get(f"/apis/batch/v1/namespaces/{NS}/jobs/kueue-idle")["spec"]["suspend"]
    return {
        "kueue-idle": (f"Workload deactivated by gpusteward (reason {reason}), "
                       + ("Job suspended by Kueue, pod gone" if suspended and
                          "kueue-idle" not in running else "pod still running"))
        if idle_wl.get("spec", {}).get("active") is False else "admitted, running, idle",
        "kueue-urgent": "admitted by Kueue, running" if "kueue-urgent" in running else
        "waiting for quota (no pod)",
        NOTEBOOK: ("stopped by gpusteward (" + NOTEBOOK_STOPPED + "), " +
                   ("pod still running" if NOTEBOOK in running else "pod gone"))
        if stopped else "running, idle",
    }


DONE = {"kueue-idle": "Job suspended by Kueue, pod gone", "kueue-urgent": "running",
        NOTEBOOK: "pod gone"}


def watch(api: KubeHTTP, timeout: float = 180) -> bool:
    """Print each workload's state as it changes; True once every one has reached its end."""
    started, last = time.monotonic(), dict[str, str]()
    while time.monotonic() - started < timeout:
        notebook_controller(api)
        now = states(api)
        for name, state in now.items():
            if last.get(name) != state:
                print(f"  +{time.monotonic() - started:5.1f}s  {name:<16}{state}", flush=True)
        last = now
        if all(now[n].endswith(end) for n, end in DONE.items()):
            return True
        time.sleep(1)
    return False
