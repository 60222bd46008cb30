"""Owners stopped through their own switch, against the sandbox's real API server, for kinds
whose controllers are not built here: our own CRDs for the upstream group/version/kind
(gpusteward/sandbox/owner_crds.py). What is proven: the chain walk (pod -> StatefulSet ->
Notebook), the API calls and the resulting object state, restore, and that gpusteward never
writes a Kueue-managed Job's suspend. Not proven here: what each upstream controller then does
(no Notebook, training-operator, LWS or KServe controller runs) — docs/operations.md says
which kinds are proven with their real controllers (tests/e2e/test_kueue.py, test_kuberay.py,
test_trainer.py, test_keda.py) and which only here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusteward.core.owners import (
    KSERVE_STOP,
    KUEUE_JOB_UID,
    KUEUE_QUEUE,
    NOTEBOOK_LAST_ACTIVITY,
    NOTEBOOK_STOPPED,
)
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.model import (
    RECLAIM_BLOCKED,
    RECLAIM_REASON,
    RECLAIMED_AT,
    REPLICAS_BEFORE,
)
from gpusteward.sandbox import owner_crds
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.owner_crds import owned_by
from tests.e2e.kube import annotations, cycle_for, cycle_until, gone, gpu_pod, reasons, restore

TIMEOUT = 150.0  # mark, warn (4 s grace) and act over a 15 s window, on a loaded machine


@pytest.fixture(scope="module", autouse=True)
def crds(sandbox):
    api = sandbox.api()
    owner_crds.install(api)
    yield
    owner_crds.remove(api)


def create(ns, group_version: str, plural: str, kind: str, name: str,
           spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None
           ) -> dict[str, Any]:
    return ns.api.create(f"/apis/{group_version}/namespaces/{ns.name}/{plural}", {
        "apiVersion": group_version, "kind": kind,
        "metadata": {"name": name, "labels": labels or {}}, "spec": spec or {}})


def owned_pod(ns, name: str, owner: dict[str, Any], node: str, **kw) -> None:
    pod = gpu_pod(name, 1, util="0", node=node, **kw)
    pod["metadata"]["ownerReferences"] = owned_by(owner)
    ns.create_pod(pod)
    ns.running(name)


def gpu_job(ns, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A batch/v1 Job of one idle 1-GPU pod."""
    template = gpu_pod("x", 1, util="0", node="h100-1")
    template["spec"]["restartPolicy"] = "Never"
    return ns.api.create(f"/apis/batch/v1/namespaces/{ns.name}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
        "spec": {"template": {"metadata": {"annotations": template["metadata"]["annotations"]},
                              "spec": template["spec"]}}})


def job_pod_running(ns, job: str) -> None:
    wait_for(f"Job {job}'s pod to run", lambda: [
        p for p in ns.pods() if (p["metadata"].get("labels") or {}).get("job-name") == job
        and p["status"].get("phase") == "Running"], timeout=60)


def idle_notebook(ns, node: str) -> str:
    """Notebook nb and the StatefulSet of one idle GPU pod it owns, as the notebook controller
    makes it; the Notebook's path."""
    notebook = create(ns, "kubeflow.org/v1", "notebooks", "Notebook", "nb")
    pod = gpu_pod("x", 1, util="0", node=node, labels={"nb": "x"})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/statefulsets", {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "nb", "ownerReferences": owned_by(notebook)},
        "spec": {"replicas": 1, "serviceName": "nb", "selector": {"matchLabels": {"nb": "x"}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}})
    return f"/apis/kubeflow.org/v1/namespaces/{ns.name}/notebooks/nb"


async def test_an_idle_notebook_is_stopped_by_its_annotation_and_restored(sandbox, ns,
                                                                          reclaimer):
    path = idle_notebook(ns, "h100-1")
    ns.running("nb-0")  # the real StatefulSet controller's pod: pod -> StatefulSet -> Notebook
    rec = await reclaimer("enforce")
    await cycle_until(rec, "Notebook stopped", lambda: NOTEBOOK_STOPPED in (
        ns.api.get(path)["metadata"].get("annotations") or {}), timeout=TIMEOUT)
    ann = ns.api.get(path)["metadata"]["annotations"]
    assert ann[RECLAIM_REASON] == "idle" and RECLAIMED_AT in ann
    # acted at the top: the StatefulSet the notebook controller owns is left to it
    assert ns.api.get(f"/apis/apps/v1/namespaces/{ns.name}/statefulsets/nb")["spec"][
        "replicas"] == 1 and "GPUReclaimed" in reasons(ns, "nb-0")
    listed = restore(sandbox.kubeconfig, "--list")
    assert listed.returncode == 0, listed.stderr
    assert f"gpusteward reclaimer restore {ns.name}/Notebook/nb" in listed.stdout
    out = restore(sandbox.kubeconfig, f"{ns.name}/Notebook/nb")
    assert out.returncode == 0, out.stderr
    ann = ns.api.get(path)["metadata"]["annotations"]
    assert NOTEBOOK_STOPPED not in ann and RECLAIM_REASON not in ann
    assert NOTEBOOK_LAST_ACTIVITY in ann
    again = restore(sandbox.kubeconfig, f"{ns.name}/Notebook/nb")
    assert again.returncode == 1 and "not stopped by gpusteward" in again.stderr


async def test_an_idle_pytorchjob_is_suspended_through_its_run_policy(sandbox, ns, reclaimer):
    # training-operator v1 creates a PyTorchJob's pods itself, each controlled by the job
    # (kubeflow/training-operator pkg/controller.v1/common/pod.go: CreatePodsWithControllerRef)
    job = create(ns, "kubeflow.org/v1", "pytorchjobs", "PyTorchJob", "ddp",
                 {"runPolicy": {"cleanPodPolicy": "None", "suspend": False},
                  "pytorchReplicaSpecs": {}})
    owned_pod(ns, "ddp-master-0", job, "a100-0")
    owned_pod(ns, "ddp-worker-0", job, "a100-0")
    path = f"/apis/kubeflow.org/v1/namespaces/{ns.name}/pytorchjobs/ddp"
    rec = await reclaimer("enforce")
    await cycle_until(rec, "PyTorchJob suspended", lambda: ns.api.get(path)["spec"][
        "runPolicy"]["suspend"] is True, timeout=TIMEOUT)
    # a merge patch of the one field: the rest of runPolicy is kept; the pods are the
    # operator's to delete, never evicted by us
    assert ns.api.get(path)["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    assert not gone(ns, "ddp-master-0") and not gone(ns, "ddp-worker-0")
    listed = restore(sandbox.kubeconfig, "--list")
    assert listed.returncode == 0, listed.stderr
    assert f"gpusteward reclaimer restore {ns.name}/PyTorchJob/ddp" in listed.stdout
    out = restore(sandbox.kubeconfig, f"{ns.name}/PyTorchJob/ddp")
    assert out.returncode == 0, out.stderr
    assert ns.api.get(path)["spec"]["runPolicy"] == {"cleanPodPolicy": "None", "suspend": False}


async def test_an_idle_leaderworkerset_scales_to_zero_through_its_scale_subresource(
        sandbox, ns, reclaimer):
    lws = create(ns, "leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet",
                 "serve", {"replicas": 2})
    owned_pod(ns, "serve-0", lws, "a100-0")
    owned_pod(ns, "serve-1", lws, "a100-0")
    path = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns.name}/leaderworkersets/serve"
    rec = await reclaimer("enforce")
    await cycle_until(rec, "LeaderWorkerSet at zero",
                      lambda: ns.api.get(path)["spec"]["replicas"] == 0, timeout=TIMEOUT)
    assert ns.api.get(path)["metadata"]["annotations"][REPLICAS_BEFORE] == "2"
    out = restore(sandbox.kubeconfig, f"{ns.name}/LeaderWorkerSet/serve")
    assert out.returncode == 0, out.stderr
    assert "scaled back to 2" in out.stdout
    assert ns.api.get(f"{path}/scale")["spec"]["replicas"] == 2


async def test_a_kueue_managed_job_is_deactivated_through_its_workload_never_suspended(
        sandbox, ns, reclaimer):
    job = gpu_job(ns, "queued", {KUEUE_QUEUE: "team-a"})
    # Kueue names a Job's Workload job-<name>-<hash> and labels it with the Job's uid
    create(ns, "kueue.x-k8s.io/v1beta2", "workloads", "Workload", "job-queued-1a2b3",
           labels={KUEUE_JOB_UID: job["metadata"]["uid"]})
    wl = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns.name}/workloads/job-queued-1a2b3"
    assert ns.api.get(wl)["spec"]["active"] is True  # the CRD's default, as upstream's
    job_pod_running(ns, "queued")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "Workload deactivated",
                      lambda: ns.api.get(wl)["spec"]["active"] is False, timeout=TIMEOUT)
    assert not ns.api.get(f"/apis/batch/v1/namespaces/{ns.name}/jobs/queued")["spec"].get(
        "suspend")  # Kueue's field: gpusteward never writes it
    out = restore(sandbox.kubeconfig, f"{ns.name}/Workload/job-queued-1a2b3")
    assert out.returncode == 0, out.stderr
    assert ns.api.get(wl)["spec"]["active"] is True


async def test_an_unsupported_owner_is_blocked_with_an_event_and_its_pod_keeps_running(
        ns, reclaimer):
    trainer = create(ns, "example.com/v1", "trainers", "Trainer", "t")
    owned_pod(ns, "t-0", trainer, "h100-1")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "blocked", lambda: RECLAIM_BLOCKED in annotations(ns, "t-0"),
                      timeout=TIMEOUT)
    assert annotations(ns, "t-0")[RECLAIM_BLOCKED] == "unsupported owner Trainer.example.com"
    await cycle_for(rec, 5)
    assert not gone(ns, "t-0")
    assert reasons(ns, "t-0").count("GPUReclaimBlocked") == 1


async def test_an_inference_service_gets_the_kserve_stop_annotation(sandbox, ns, reclaimer):
    isvc = create(ns, "serving.kserve.io/v1beta1", "inferenceservices", "InferenceService",
                  "llm")
    owned_pod(ns, "llm-predictor-0", isvc, "a100-0")
    path = f"/apis/serving.kserve.io/v1beta1/namespaces/{ns.name}/inferenceservices/llm"
    rec = await reclaimer("enforce")
    await cycle_until(rec, "stop annotation", lambda: (ns.api.get(path)["metadata"].get(
        "annotations") or {}).get(KSERVE_STOP) == "true", timeout=TIMEOUT)
    out = restore(sandbox.kubeconfig, f"{ns.name}/InferenceService/llm")
    assert out.returncode == 0, out.stderr
    assert ns.api.get(path)["metadata"]["annotations"][KSERVE_STOP] == "false"


def autoscaled_deployment(ns, name: str) -> str:
    pod = gpu_pod("x", 1, util="0", node="h100-1", labels={"app": name})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name},
                                           "annotations": pod["metadata"]["annotations"]},
                              "spec": pod["spec"]}}})
    hpa: dict[str, Any] = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "minReplicas": 1, "maxReplicas": 2, "metrics": [{"type": "Resource", "resource": {
                     "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}}
    ns.api.create(f"/apis/autoscaling/v2/namespaces/{ns.name}/horizontalpodautoscalers", hpa)
    wait_for("its pod to run", lambda: [p for p in ns.pods() if p["metadata"]["labels"].get(
        "app") == name and p["status"].get("phase") == "Running"], timeout=60)
    return f"/apis/apps/v1/namespaces/{ns.name}/deployments/{name}"


async def test_a_deployment_under_a_plain_hpa_is_blocked_not_scaled(ns, reclaimer):
    path = autoscaled_deployment(ns, "web")
    pod = next(p["metadata"]["name"] for p in ns.pods()
               if p["metadata"]["labels"].get("app") == "web")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "blocked", lambda: RECLAIM_BLOCKED in annotations(ns, pod),
                      timeout=TIMEOUT)
    assert annotations(ns, pod)[RECLAIM_BLOCKED] == (
        "driven by HorizontalPodAutoscaler web, which would undo a scale-down")
    assert ns.api.get(path)["spec"]["replicas"] == 1


# Switches the policy defines for kinds gpusteward does not know (docs/policy.md,
# reclaim.ownerActions.kinds): Trainer.example.com by a spec field, Predictor.example.com by its
# scale subresource. No controller runs for either: the calls and the object state are proven.
SWITCHES = {"Trainer.example.com": {"resource": "trainers", "field": "spec.run.paused"},
            "Predictor.example.com": {"resource": "predictors", "scale": True}}


def with_switches(sandbox, tmp_path: Path) -> tuple[Any, Path]:
    raw = yaml.safe_load(Path(sandbox.cfg.policy).read_text())
    raw.setdefault("reclaim", {}).setdefault("ownerActions", {})["kinds"] = SWITCHES
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return parse_policy(raw), path


async def test_the_policy_stops_an_unknown_kind_by_the_field_it_names(sandbox, ns, reclaimer,
                                                                       tmp_path):
    policy, policy_file = with_switches(sandbox, tmp_path)
    trainer = create(ns, "example.com/v1", "trainers", "Trainer", "t",
                     {"run": {"paused": False, "steps": 10}})
    owned_pod(ns, "t-0", trainer, "h100-1")
    owned_pod(ns, "t-1", trainer, "h100-1")
    path = f"/apis/example.com/v1/namespaces/{ns.name}/trainers/t"
    rec = await reclaimer("enforce", policy=policy)
    await cycle_until(rec, "Trainer paused", lambda: ns.api.get(path)["spec"]["run"][
        "paused"] is True, timeout=TIMEOUT)
    after = ns.api.get(path)
    assert after["spec"]["run"]["steps"] == 10  # a merge patch: the rest of spec is kept
    assert after["metadata"]["annotations"][RECLAIM_REASON] == "idle"
    assert not gone(ns, "t-0") and not gone(ns, "t-1")  # acted on the owner, never evicted
    assert RECLAIM_BLOCKED not in annotations(ns, "t-0")
    await cycle_for(rec, 3)
    assert [r for r in reasons(ns, "t-0") + reasons(ns, "t-1")
            if r == "GPUReclaimed"] == ["GPUReclaimed"]  # one action for the whole owner
    listed = restore(sandbox.kubeconfig, "--list", policy=policy_file)
    assert listed.returncode == 0, listed.stderr
    assert f"gpusteward reclaimer restore {ns.name}/Trainer/t" in listed.stdout
    # without the policy: not a kind gpusteward knows
    without = restore(sandbox.kubeconfig, f"{ns.name}/Trainer/t")
    assert without.returncode == 1 and "not a kind gpusteward stops" in without.stderr
    out = restore(sandbox.kubeconfig, f"{ns.name}/Trainer/t", policy=policy_file)
    assert out.returncode == 0, out.stderr
    back = ns.api.get(path)
    assert back["spec"]["run"] == {"paused": False, "steps": 10}
    assert RECLAIM_REASON not in (back["metadata"].get("annotations") or {})


async def test_the_policy_scales_an_unknown_kind_through_its_scale_subresource(
        sandbox, ns, reclaimer, tmp_path):
    policy, policy_file = with_switches(sandbox, tmp_path)
    predictor = create(ns, "example.com/v1", "predictors", "Predictor", "p", {"replicas": 3})
    owned_pod(ns, "p-0", predictor, "a100-0")
    path = f"/apis/example.com/v1/namespaces/{ns.name}/predictors/p"
    rec = await reclaimer("enforce", policy=policy)
    await cycle_until(rec, "Predictor at zero",
                      lambda: ns.api.get(path)["spec"]["replicas"] == 0, timeout=TIMEOUT)
    assert ns.api.get(path)["metadata"]["annotations"][REPLICAS_BEFORE] == "3"
    out = restore(sandbox.kubeconfig, f"{ns.name}/Predictor/p", policy=policy_file)
    assert out.returncode == 0, out.stderr
    assert "scaled back to 3" in out.stdout
    assert ns.api.get(f"{path}/scale")["spec"]["replicas"] == 3
