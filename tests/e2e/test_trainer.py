"""gpusteward beside the real JobSet and Kubeflow Trainer v2 controllers (sigs.k8s.io/jobset
v0.8.2 and github.com/kubeflow/trainer v2.0.0, built from their Go modules by ``gpusteward
sandbox up --with trainer``, their CRDs and JobSet's admission webhooks from the same module
versions).

- JobSet: an idle JobSet is suspended through spec.suspend; the JobSet controller suspends its
  Jobs and the Job controller deletes their pods (pod -> Job -> JobSet).
- Trainer runs a TrainJob as a JobSet it controls (pod -> Job -> JobSet -> TrainJob). An idle
  TrainJob is suspended at the top of that chain; Trainer suspends its JobSet (kubeflow/trainer
  pkg/runtime/framework/plugins/jobset/jobset.go, Build: the JobSet's suspend follows the
  TrainJob's), which stops as above. A busy TrainJob is left running.

Either way a pending GPU pod is then placed by the real kube-scheduler on the freed GPUs, and
restore brings the owner back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpusteward.core.reclaim.model import RECLAIM_REASON
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import (
    BUSY_OR_PARTLY,
    Namespace,
    cycle_until,
    gpu_pod,
    kept_unless_wholly_idle,
    managers,
    placed_then_restored,
    spec_suspend,
)
from tests.support.sandbox import fresh_namespace, started

NODE = "h100-1"  # 8 GPUs: two 4-GPU pods fill it
TRAINER = "/apis/trainer.kubeflow.org/v1alpha1"
JOBSET = "/apis/jobset.x-k8s.io/v1alpha2"


@pytest.fixture(scope="module")
def trainer_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "trainer", with_controllers=("trainer",))


@pytest.fixture
def train_ns(trainer_box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(trainer_box.api(), "train", owners=(
        f"{TRAINER}/namespaces/{{ns}}/trainjobs", f"{JOBSET}/namespaces/{{ns}}/jobsets"))


def node_job(util: str) -> dict[str, Any]:
    """A JobSet replicated job "node" of 4-GPU pods on NODE, shaped like the one of upstream's
    torch-distributed runtime (kubeflow/trainer manifests/base/runtimes); JobSet's defaulting
    webhook fills in the rest (restartPolicy, completionMode, network)."""
    pod = gpu_pod("x", 4, util=util, node=NODE)
    return {"name": "node", "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": {"template": {
            "metadata": {"annotations": pod["metadata"]["annotations"]},
            "spec": {"nodeSelector": pod["spec"]["nodeSelector"],
                     "containers": [{**pod["spec"]["containers"][0], "name": "node"}]}}}}}


def runtime(ns: Namespace, util: str) -> str:
    """A TrainingRuntime of two such nodes (mlPolicy.numNodes)."""
    name = f"torch-{util}"
    ns.api.create(f"{TRAINER}/namespaces/{ns.name}/trainingruntimes", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
        "metadata": {"name": name},
        "spec": {"mlPolicy": {"numNodes": 2, "torch": {"numProcPerNode": "auto"}},
                 "template": {"spec": {"replicatedJobs": [node_job(util)]}}}})
    return name


def train_job(ns: Namespace, name: str, util: str) -> str:
    ns.api.create(f"{TRAINER}/namespaces/{ns.name}/trainjobs", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime(ns, util), "kind": "TrainingRuntime"}}})
    return f"{TRAINER}/namespaces/{ns.name}/trainjobs/{name}"


def nodes(ns: Namespace) -> list[dict[str, Any]]:
    """The TrainJob's running trainer pods (JobSet labels each with its JobSet's name)."""
    return [p for p in ns.pods() if "jobset.sigs.k8s.io/jobset-name" in (
        p["metadata"].get("labels") or {}) and p["status"].get("phase") == "Running"
        and "deletionTimestamp" not in p["metadata"]]


async def test_an_idle_train_job_is_suspended_and_its_gpus_placed_again(
        trainer_box, train_ns, reclaimer):
    ns = train_ns
    path = train_job(ns, "tune", util="0")
    wait_for("Trainer's two 4-GPU nodes running", lambda: len(nodes(ns)) == 2, timeout=120)
    jobset = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns.name}/jobsets/tune"
    assert ns.api.get(jobset)["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    ns.create_pod(gpu_pod("waiting", 4, util="80", node=NODE))  # the node is full: it waits
    rec = await reclaimer("enforce", box=trainer_box)
    await cycle_until(rec, "TrainJob suspended",
                      lambda: ns.api.get(path)["spec"].get("suspend") is True, timeout=150)
    assert ns.api.get(path)["metadata"]["annotations"][RECLAIM_REASON] == "idle"
    # Trainer suspends the JobSet it runs: the write is Trainer's, not gpusteward's
    wait_for("Trainer to suspend its JobSet",
             lambda: ns.api.get(jobset)["spec"].get("suspend") is True, timeout=60)
    ours = managers(ns.api.get(path), "f:suspend")  # who suspended the TrainJob
    theirs = managers(ns.api.get(jobset), "f:suspend")
    assert ours and not ours & theirs, (ours, theirs)
    wait_for("the nodes' pods deleted", lambda: not nodes(ns), timeout=120)
    placed_then_restored(ns, trainer_box.kubeconfig, "TrainJob", "tune",
                         lambda: len(nodes(ns)), 2)


async def test_an_idle_jobset_is_suspended_and_its_gpus_placed_again(
        trainer_box, train_ns, reclaimer):
    ns = train_ns
    job = node_job("0")
    job["replicas"] = 2  # two Jobs of one pod each
    ns.api.create(f"{JOBSET}/namespaces/{ns.name}/jobsets", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
        "spec": {"replicatedJobs": [job]}})
    path = f"{JOBSET}/namespaces/{ns.name}/jobsets/js"
    wait_for("JobSet's two 4-GPU pods running", lambda: len(nodes(ns)) == 2, timeout=120)
    ns.create_pod(gpu_pod("waiting", 4, util="80", node=NODE))
    rec = await reclaimer("enforce", box=trainer_box)
    await cycle_until(rec, "JobSet suspended",
                      lambda: ns.api.get(path)["spec"].get("suspend") is True, timeout=150)
    # the JobSet controller suspends its Jobs; gpusteward wrote only the JobSet
    wait_for("JobSet to suspend its Jobs", lambda: all(
        j["spec"].get("suspend") is True for j in ns.api.get(
            f"/apis/batch/v1/namespaces/{ns.name}/jobs")["items"]), timeout=60)
    wait_for("the Jobs' pods deleted", lambda: not nodes(ns), timeout=120)
    placed_then_restored(ns, trainer_box.kubeconfig, "JobSet", "js", lambda: len(nodes(ns)), 2)


@BUSY_OR_PARTLY
async def test_a_train_job_not_wholly_idle_is_never_suspended(trainer_box, train_ns, reclaimer,
                                                                busy):
    ns = train_ns
    path = train_job(ns, "t", util="80" if busy else "0")
    wait_for("its GPU pods running", lambda: len(nodes(ns)) == 2, timeout=120)
    await kept_unless_wholly_idle(await reclaimer("enforce", box=trainer_box), ns, busy,
                                  lambda: spec_suspend(ns, path), lambda: nodes(ns))


def suspend_set(ns: Namespace, path: str) -> bool:
    return bool(ns.api.get(path)["spec"].get("suspend"))
