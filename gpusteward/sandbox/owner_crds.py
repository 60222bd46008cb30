"""CRDs of our own for owner kinds whose controllers are not built here (for the e2e tests and
the demo's notebook): the upstream group,
version, kind and plural, and only the fields gpusteward touches, typed as upstream types them
(checked against, not copied from, upstream):

- PyTorchJob kubeflow.org/v1 pytorchjobs: spec.runPolicy.suspend bool (kubeflow/training-operator
  pkg/apis/kubeflow.org/v1 RunPolicy.Suspend *bool; the operator creates the pods itself).
- Notebook kubeflow.org/v1 notebooks: annotations only (kubeflow/kubeflow notebook-controller:
  the culler's kubeflow-resource-stopped and notebooks.kubeflow.org/last-activity).
- InferenceService serving.kserve.io/v1beta1 inferenceservices: the serving.kserve.io/stop
  annotation (kserve pkg/constants StopAnnotationKey).
- LeaderWorkerSet leaderworkerset.x-k8s.io/v1 leaderworkersets: spec.replicas int32 behind the
  scale subresource (kubernetes-sigs/lws config/crd: specReplicasPath .spec.replicas,
  statusReplicasPath .status.replicas).
- Workload kueue.x-k8s.io/v1beta2 workloads: spec.active bool, default true (kueue v0.17.0
  apis/kueue/v1beta2/workload_types.go).
- Trainer example.com/v1: a kind gpusteward does not know.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from gpusteward.sandbox.kubehttp import KubeHTTP, KubeHTTPError, wait_for

OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _crd(group: str, version: str, kind: str, plural: str, spec: dict[str, Any],
         scale: bool = False) -> dict[str, Any]:
    served: dict[str, Any] = {
        "name": version, "served": True, "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "properties": spec},
            "status": OPEN}}}}
    if scale:
        served["subresources"] = {"status": {}, "scale": {
            "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced", "versions": [served],
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                               "listKind": f"{kind}List"}}}


BOOL, INT = {"type": "boolean"}, {"type": "integer", "format": "int32"}
CRDS = [
    _crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", {"runPolicy": {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True,
        "properties": {"suspend": BOOL}}}),
    _crd("kubeflow.org", "v1", "Notebook", "notebooks", {}),
    _crd("serving.kserve.io", "v1beta1", "InferenceService", "inferenceservices", {}),
    _crd("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets",
         {"replicas": INT}, scale=True),
    _crd("kueue.x-k8s.io", "v1beta2", "Workload", "workloads",
         {"active": {**BOOL, "default": True}}),
    _crd("example.com", "v1", "Trainer", "trainers", {}),
    _crd("example.com", "v1", "Predictor", "predictors", {"replicas": INT}, scale=True),
]
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


NOTEBOOK = next(c for c in CRDS if c["spec"]["names"]["kind"] == "Notebook")


def install(api: KubeHTTP, crds: list[dict[str, Any]] = CRDS) -> None:
    """Beside the real Kueue, leave its Workload out: Kueue installs its own."""
    for crd in crds:
        api.apply(f"{CRD_PATH}/{crd['metadata']['name']}", crd, manager="gpusteward-sandbox")
    for crd in crds:
        s = crd["spec"]
        path = f"/apis/{s['group']}/{s['versions'][0]['name']}/{s['names']['plural']}"
        wait_for(f"{path} to be served", partial(_served, api, path), timeout=60)


def remove(api: KubeHTTP) -> None:
    for crd in CRDS:
        api.delete(f"{CRD_PATH}/{crd['metadata']['name']}")


def _served(api: KubeHTTP, path: str) -> bool:
    try:
        api.get(path)
    except KubeHTTPError:
        return False
    return True


def owned_by(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The ownerReferences of a pod (or other object) controlled by obj."""
    return [{"apiVersion": obj["apiVersion"], "kind": obj["kind"],
             "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
             "controller": True}]
