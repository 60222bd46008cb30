"""Least privilege, proven two ways: the rendered Roles grant exactly an explicit allow-list
(widening one is a deliberate change here), and real API calls made *as* each ServiceAccount,
with the rendered RBAC applied to the sandbox's kube-apiserver, are allowed for every verb the
component uses and refused beyond that."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import KubeHTTP
from tests.deploy.manifests import Discovery, ServiceAccountClient

RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding"}

#: The DRA objects behind GPUs (adapters/dra.py).
DRA = [("resource.k8s.io", r) for r in ("resourceslices", "deviceclasses", "resourceclaims")]
#: Owners stopped through their own switch (core.reclaim.kinds): read and patched only.
OWN_SWITCHES = [("jobset.x-k8s.io", "jobsets"), ("trainer.kubeflow.org", "trainjobs"),
                ("kubeflow.org", "pytorchjobs"), ("kubeflow.org", "notebooks"),
                ("ray.io", "rayclusters"), ("ray.io", "rayjobs"),
                ("serving.kserve.io", "inferenceservices"),
                ("serving.kserve.io", "llminferenceservices"),
                ("leaderworkerset.x-k8s.io", "leaderworkersets"),
                ("leaderworkerset.x-k8s.io", "leaderworkersets/scale"),
                ("kueue.x-k8s.io", "workloads"), ("keda.sh", "scaledobjects")]
#: role name -> {(apiGroup, resource, verb, resourceName or "*")}; what each component uses.
ALLOWED: dict[str, set[tuple[str, str, str, str]]] = {
    "gpusteward-extender": {(g, r, v, "*") for g, r in (("", "nodes"), ("", "pods"), *DRA)
                            for v in ("get", "list", "watch")},
    "gpusteward-reclaimer": {
        ("", "nodes", "list", "*"), ("", "namespaces", "list", "*"),
        *{(g, r, "list", "*") for g, r in DRA},
        *{("", "pods", v, "*") for v in ("get", "list", "patch")},
        ("", "pods/eviction", "create", "*"), ("", "events", "create", "*"),
        ("", "pods/status", "patch", "*"),
        # a gang's budgets, asked before its pods are evicted together (reclaimer/actor.py)
        ("policy", "poddisruptionbudgets", "list", "*"),
        # a waiting gang's PodGroup minCount (adapters/snapshot.py)
        ("scheduling.k8s.io", "podgroups", "list", "*"),
        ("apps", "replicasets", "list", "*"),
        *{("apps", r, v, "*") for r in ("deployments", "statefulsets")
          for v in ("get", "list", "patch")},
        *{("batch", "jobs", v, "*") for v in ("get", "list", "patch")},
        *{(group, r, v, "*") for group, r in OWN_SWITCHES for v in ("get", "patch")},
        ("kueue.x-k8s.io", "workloads", "list", "*"),
        # Workloads waiting for quota: the queues they wait in (core/reclaim/kueue.py)
        ("kueue.x-k8s.io", "localqueues", "list", "*"),
        ("kueue.x-k8s.io", "clusterqueues", "list", "*"),
        ("autoscaling", "horizontalpodautoscalers", "list", "*"),
        # the ScaledObject gpusteward paused, found once KEDA has deleted its HPA (owners.py)
        ("keda.sh", "scaledobjects", "list", "*")},
    "gpusteward-reclaimer-lease": {
        ("coordination.k8s.io", "leases", "create", "*"),
        ("coordination.k8s.io", "leases", "get", "gpusteward-reclaimer"),
        ("coordination.k8s.io", "leases", "update", "gpusteward-reclaimer"),
        ("", "configmaps", "create", "*"),
        *{("", "configmaps", verb, f"gpusteward-reclaimer-{records}")
          for verb in ("get", "patch")
          for records in ("reclaims", "snoozes", "notifications", "stops")}},
    "gpusteward-agent": {("", "pods", "list", "*"),
                         ("resource.k8s.io", "resourceslices", "list", "*")},
    "gpusteward-scheduler-lease": {
        ("coordination.k8s.io", "leases", "create", "*"),
        ("coordination.k8s.io", "leases", "get", "gpusteward-scheduler"),
        ("coordination.k8s.io", "leases", "update", "gpusteward-scheduler")},
}
#: The report's (a chart option): exactly the reclaimer's reads, without the per-pod get (it
#: acts on no pod), the scale subresource's (it scales nothing) and the budgets' (it evicts
#: nothing); no write.
REPORT = {"gpusteward-report": {
    g for g in ALLOWED["gpusteward-reclaimer"] if g[2] in ("get", "list")
    and g[:3] != ("", "pods", "get") and not g[1].endswith("/scale")
    and g[1] != "poddisruptionbudgets"}}
#: The only roles bound that we do not ship: Kubernetes' own, for the second scheduler.
BOUND_BUILTINS = {"system:kube-scheduler", "system:volume-scheduler",
                  "extension-apiserver-authentication-reader"}


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    return {(group, resource, verb, name)
            for rule in role.get("rules", [])
            for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", [])
            for verb in rule["verbs"]
            for name in rule.get("resourceNames", ["*"])}


def _shipped(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the `helm test` hook's objects (test_chart.py checks those)."""
    return [o for o in objects
            if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]


@pytest.mark.parametrize("renders", [("kustomize-with-agent",), ("helm-defaults", "helm-variant")])
def test_roles_grant_exactly_the_allow_list(
        renders: tuple[str, ...], rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = [o for render in renders for o in _shipped(rendered[render])]
    roles = {o["metadata"]["name"]: _grants(o) for o in objects
             if o["kind"] in {"ClusterRole", "Role"}}
    allowed = ALLOWED | (REPORT if renders[0].startswith("helm") else {})
    assert roles == allowed
    bound = {o["roleRef"]["name"] for o in objects
             if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}}
    assert bound <= allowed.keys() | BOUND_BUILTINS


@pytest.fixture(scope="module")
def admin(sandbox: Sandbox, rendered: dict[str, list[dict[str, Any]]]) -> KubeHTTP:
    """The second-scheduler overlay's ServiceAccounts and RBAC, with the agent, applied for
    real."""
    api = sandbox.api()
    discovery = Discovery(api)
    objects = [o for o in rendered["kustomize-with-agent"] if o["kind"] in RBAC_KINDS]
    for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
        path = discovery.path(obj)
        assert path is not None
        api.apply(path, obj, manager="gpusteward-deploy-test")
    return api


@pytest.fixture(scope="module")
def workloads(admin: KubeHTTP) -> str:
    """A namespace with one bare pod (never scheduled), a suspended Job and workloads at 0."""
    ns = f"rbac-{secrets.token_hex(3)}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    pod_spec = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}
    template = {"metadata": {"labels": {"app": "w"}}, "spec": pod_spec}
    admin.create(f"/api/v1/namespaces/{ns}/pods",
                 {"metadata": {"name": "p"}, "spec": pod_spec})
    admin.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {"metadata": {"name": "j"}, "spec": {
        "suspend": True, "template": {"spec": {**pod_spec, "restartPolicy": "Never"}}}})
    for plural in ("deployments", "statefulsets"):
        admin.create(f"/apis/apps/v1/namespaces/{ns}/{plural}", {
            "metadata": {"name": "w"}, "spec": {
                "replicas": 0, "selector": {"matchLabels": {"app": "w"}},
                "template": template}})
    return ns


MERGE = "application/merge-patch+json"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpusteward/leases"
CONFIGMAPS = "/api/v1/namespaces/gpusteward/configmaps"


def _check(client: ServiceAccountClient,
           calls: list[tuple[str, str, Any, int]]) -> list[str]:
    wrong = []
    for method, path, body, expected in calls:
        content_type = MERGE if method == "PATCH" else "application/json"
        status, reply = client.call(method, path, body, content_type)
        if status != expected:
            message = reply.get("message") if isinstance(reply, dict) else reply
            wrong.append(f"{method} {path}: {status} (want {expected}) {message}")
    return wrong


def _crd_path(group: str, plural: str, ns: str) -> str:
    resource, _, sub = plural.partition("/")
    return f"/apis/{group}/v1/namespaces/{ns}/{resource}/x" + (f"/{sub}" if sub else "")


def test_the_extender_service_account_can_list_and_watch_and_nothing_more(
        admin: KubeHTTP, workloads: str) -> None:
    client = ServiceAccountClient(admin, "gpusteward-extender")
    ns = workloads
    assert _check(client, [
        ("GET", "/api/v1/nodes?limit=1", None, 200),
        ("GET", "/api/v1/pods?limit=1", None, 200),
        ("GET", "/api/v1/nodes?watch=1&timeoutSeconds=1", None, 200),
        ("GET", "/api/v1/pods?watch=1&timeoutSeconds=1", None, 200),
        *[("GET", f"/apis/resource.k8s.io/v1/{r}?{q}", None, 200) for _, r in DRA
          for q in ("limit=1", "watch=1&timeoutSeconds=1")],
        ("POST", "/apis/resource.k8s.io/v1/deviceclasses", {"metadata": {"name": "x"}}, 403),
        ("GET", f"/api/v1/namespaces/{ns}/pods/p", None, 200),
        ("PATCH", f"/api/v1/namespaces/{ns}/pods/p", {"metadata": {"labels": {"x": "y"}}}, 403),
        ("GET", "/api/v1/secrets", None, 403),
        ("GET", "/api/v1/namespaces?limit=1", None, 403),
        ("GET", "/apis/apps/v1/deployments", None, 403),
    ]) == []


def test_the_reclaimer_service_account_can_do_every_call_it_makes_and_nothing_more(
        admin: KubeHTTP, workloads: str) -> None:
    client = ServiceAccountClient(admin, "gpusteward-reclaimer")
    ns = workloads
    annotate = {"metadata": {"annotations": {"gpusteward.io/idle-since": "now"}}}
    event = {"metadata": {"generateName": "p.", "namespace": ns},
             "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns, "apiVersion": "v1"},
             "reason": "GPUIdle", "message": "rbac test", "type": "Normal",
             "source": {"component": "gpusteward-reclaimer"}}
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "p", "namespace": ns},
                "deleteOptions": {"gracePeriodSeconds": 1}}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "gpusteward-reclaimer"},
             "spec": {"holderIdentity": "test", "leaseDurationSeconds": 15}}
    ledger = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "gpusteward-reclaimer-reclaims"}, "data": {"reclaims": "[]"}}
    snapshot_lists = ["/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces",
                      "/apis/apps/v1/replicasets", "/apis/apps/v1/deployments",
                      "/apis/apps/v1/statefulsets", "/apis/batch/v1/jobs",
                      *(f"/apis/resource.k8s.io/v1/{r}" for _, r in DRA)]
    assert _check(client, [
        *[("GET", f"{path}?limit=500", None, 200) for path in snapshot_lists],
        ("GET", f"/api/v1/namespaces/{ns}/pods/p", None, 200),
        ("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", None, 200),
        # allowed, so past authorization; not served by this sandbox (no GenericWorkload)
        ("GET", "/apis/scheduling.k8s.io/v1alpha2/podgroups?limit=500", None, 404),
        ("GET", f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/g", None, 403),
        ("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/b", None, 403),
        ("PATCH", f"/api/v1/namespaces/{ns}/pods/p", annotate, 200),
        ("POST", f"/api/v1/namespaces/{ns}/events", event, 201),
        ("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/j", None, 200),
        ("PATCH", f"/apis/batch/v1/namespaces/{ns}/jobs/j", {"spec": {"suspend": True}}, 200),
        ("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/w", None, 200),
        ("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/w", annotate, 200),
        ("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/w", None, 200),
        ("PATCH", f"/apis/apps/v1/namespaces/{ns}/statefulsets/w", annotate, 200),
        ("POST", LEASES, lease, 201),
        ("GET", f"{LEASES}/gpusteward-reclaimer", None, 200),
        ("POST", CONFIGMAPS, ledger, 201),
        ("GET", f"{CONFIGMAPS}/gpusteward-reclaimer-reclaims", None, 200),
        ("PATCH", f"{CONFIGMAPS}/gpusteward-reclaimer-reclaims", {"data": {"reclaims": "[]"}},
         200),
        # the stop record restore trusts: allowed (past authorization to a 404, not created)
        ("GET", f"{CONFIGMAPS}/gpusteward-reclaimer-stops", None, 404),
        ("PATCH", f"{CONFIGMAPS}/gpusteward-reclaimer-stops", {"data": {"stops": "[]"}}, 404),
        # refused: other ConfigMaps, secrets, deleting pods, other Leases, writing nodes,
        # creating pods
        ("GET", "/api/v1/secrets", None, 403),
        ("GET", f"/api/v1/namespaces/{ns}/secrets", None, 403),
        ("DELETE", f"/api/v1/namespaces/{ns}/pods/p", None, 403),
        ("GET", f"{LEASES}/gpusteward-scheduler", None, 403),
        ("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x", None, 403),
        ("GET", f"{CONFIGMAPS}/gpusteward-policy", None, 403),
        ("GET", "/api/v1/namespaces/kube-system/configmaps/x", None, 403),
        ("GET", "/api/v1/pods?watch=1&timeoutSeconds=1", None, 403),
        ("PATCH", "/api/v1/nodes/any", {"metadata": {"labels": {"x": "y"}}}, 403),
        ("POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "q"}}, 403),
        ("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/w/scale", annotate, 403),
        # Owners' own switches, on groups this API server does not serve: allowed calls get
        # past authorization to a 404, refused ones stop at 403.
        *[(method, _crd_path(group, plural, ns), body, 404) for group, plural in OWN_SWITCHES
          for method, body in (("GET", None), ("PATCH", annotate))],
        *[("GET", f"/apis/kueue.x-k8s.io/v1beta2/{r}?limit=500", None, 404)
          for r in ("workloads", "localqueues", "clusterqueues")],
        ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/q", annotate, 403),
        ("GET", "/apis/autoscaling/v2/horizontalpodautoscalers?limit=500", None, 200),
        ("GET", "/apis/keda.sh/v1alpha1/scaledobjects?limit=500", None, 404),
        *[("DELETE", _crd_path(group, plural, ns), None, 403) for group, plural in OWN_SWITCHES],
        ("GET", "/apis/ray.io/v1/rayservices?limit=500", None, 403),
        ("PATCH", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/h", annotate,
         403),
        # last: the eviction deletes the pod
        ("POST", f"/api/v1/namespaces/{ns}/pods/p/eviction", eviction, 201),
    ]) == []
    status, current = client.call("GET", f"{LEASES}/gpusteward-reclaimer")
    current["spec"]["holderIdentity"] = "renewed"
    assert client.call("PUT", f"{LEASES}/gpusteward-reclaimer", current)[0] == 200


def test_the_agent_service_account_can_list_pods_and_slices_and_nothing_more(
        admin: KubeHTTP, workloads: str) -> None:
    client = ServiceAccountClient(admin, "gpusteward-agent")
    assert _check(client, [
        ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1&limit=500", None, 200),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dgpu-1"
                "&limit=500", None, 200),
        ("GET", "/apis/resource.k8s.io/v1/resourceclaims?limit=1", None, 403),
        ("GET", f"/api/v1/namespaces/{workloads}/pods/p", None, 403),
        ("GET", "/api/v1/pods?watch=1&timeoutSeconds=1", None, 403),
        ("GET", "/api/v1/nodes?limit=1", None, 403),
        ("GET", "/api/v1/secrets", None, 403),
    ]) == []


def test_the_second_scheduler_service_account_has_the_scheduler_roles_and_its_lease(
        admin: KubeHTTP) -> None:
    client = ServiceAccountClient(admin, "gpusteward-scheduler")
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "gpusteward-scheduler"}, "spec": {"holderIdentity": "t"}}
    assert _check(client, [
        ("GET", "/api/v1/nodes?limit=1", None, 200),
        ("GET", "/api/v1/pods?limit=1", None, 200),
        ("GET", "/apis/storage.k8s.io/v1/csinodes?limit=1", None, 200),
        ("GET", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
         None, 404),  # allowed; the token-only sandbox never writes it
        ("POST", LEASES, lease, 201),
        ("GET", f"{LEASES}/gpusteward-scheduler", None, 200),
        ("GET", f"{LEASES}/gpusteward-reclaimer", None, 403),
        ("GET", "/api/v1/secrets", None, 403),
    ]) == []
