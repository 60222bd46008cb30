"""Every rendering (kustomize base, both overlays, monitoring, Helm defaults and a variant) is
valid for the pinned Kubernetes: server-side apply with dryRun=All on the sandbox's real
kube-apiserver accepts every object. Kinds the sandbox does not serve (the Prometheus
Operator's ServiceMonitor and PrometheusRule) are checked by shape here and by promtool in
test_monitoring.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import KubeHTTPError
from tests.deploy.conftest import HELM_SECOND_RELEASE, RENDERS, REPO
from tests.deploy.manifests import Discovery, name_of

NOT_SERVED_BY_SANDBOX = {"ServiceMonitor", "PrometheusRule"}
WORKLOADS = {"Deployment", "DaemonSet"}


@pytest.fixture(scope="module")
def namespace(sandbox: Sandbox) -> str:
    """Namespaced dry-run requests need the namespace to exist for real."""
    api = sandbox.api()
    for name in ("gpusteward", HELM_SECOND_RELEASE[1]):
        api.apply(f"/api/v1/namespaces/{name}", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return "gpusteward"


@pytest.mark.parametrize("render", RENDERS)
def test_every_rendered_object_passes_a_server_side_dry_run_apply(
        render: str, rendered: dict[str, list[dict[str, Any]]], sandbox: Sandbox,
        namespace: str) -> None:
    api = sandbox.api()
    discovery = Discovery(api)
    refused, unserved = [], []
    for obj in rendered[render]:
        path = discovery.path(obj)
        if path is None:
            unserved.append(obj["kind"])
            continue
        try:
            api.apply(path, obj, manager="gpusteward-deploy-test", dry_run=True)
        except KubeHTTPError as e:
            refused.append(f"{name_of(obj)}: {e}")
    assert refused == []
    assert set(unserved) <= NOT_SERVED_BY_SANDBOX


def _shape_ok(obj: dict[str, Any]) -> bool:
    spec = obj.get("spec", {})
    if obj["kind"] == "ServiceMonitor":
        return bool(spec["selector"]["matchLabels"]) and all(
            e["port"] and e["path"] == "/metrics" for e in spec["endpoints"])
    return all(group["name"] and group["rules"] for group in spec["groups"])


@pytest.mark.parametrize("render", ["kustomize-monitoring", "helm-variant"])
def test_prometheus_operator_objects_have_the_fields_the_operator_requires(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    crd_objects = [o for o in rendered[render] if o["kind"] in NOT_SERVED_BY_SANDBOX]
    assert {o["kind"] for o in crd_objects} == NOT_SERVED_BY_SANDBOX
    for obj in crd_objects:
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert obj["metadata"]["namespace"] == "gpusteward"
        assert _shape_ok(obj), name_of(obj)
    assert {o["metadata"]["name"] for o in crd_objects if o["kind"] == "PrometheusRule"} == {
        "gpusteward", "gpusteward-recording-rules"}


def _pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(name_of(o), o["spec"]["template"]["spec"]) for o in objects
            if o["kind"] in WORKLOADS]


@pytest.mark.parametrize("render", RENDERS)
def test_every_container_runs_locked_down_with_resources(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, pod in _pod_specs(rendered[render]):
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        agent = name.startswith("DaemonSet/")  # root without capabilities: see agent.yaml
        assert pod["securityContext"]["runAsNonRoot"] is not agent, name
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert {"requests", "limits"} <= container["resources"].keys(), name


@pytest.mark.parametrize("render", ["kustomize-base", "helm-defaults"])
def test_extender_and_reclaimer_run_two_replicas_with_probes_and_the_lease(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployments = {o["metadata"]["name"]: o for o in rendered[render]
                   if o["kind"] == "Deployment"}
    extender = deployments["gpusteward-extender"]["spec"]
    reclaimer = deployments["gpusteward-reclaimer"]["spec"]
    assert extender["replicas"] == reclaimer["replicas"] == 2
    container = extender["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    args = reclaimer["template"]["spec"]["containers"][0]["args"]
    assert "--lease-namespace=$(POD_NAMESPACE)" in args
    # its metrics port is not Prometheus's own 9090 (a port-forward to both would clash)
    assert "--metrics-listen=0.0.0.0:8080" in args
    assert reclaimer["template"]["spec"]["containers"][0]["ports"] == [
        {"name": "metrics", "containerPort": 8080}]
    env = reclaimer["template"]["spec"]["containers"][0]["env"]
    assert {"name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in env
    assert {"PodDisruptionBudget", "Service"} <= {o["kind"] for o in rendered[render]}


@pytest.mark.parametrize(("render", "timeout"), [
    ("kustomize-base", 10800), ("helm-defaults", 10800), ("helm-variant", 600)])
def test_the_scheduler_reaches_one_extender_replica_at_a_time(
        render: str, timeout: int, rendered: dict[str, list[dict[str, Any]]]) -> None:
    # Each replica counts only the pods it ranked itself (docs/operations.md): the Service keeps
    # the scheduler (one client) on one replica; Service spec.sessionAffinity(Config), core/v1.
    (service,) = [o for o in rendered[render] if o["kind"] == "Service"
                  and o["metadata"]["name"].endswith("-extender")]
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    assert service["spec"]["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": timeout}}


def _extenders(text: str) -> list[dict[str, Any]]:
    return yaml.safe_load(text)["extenders"]


def _without_url(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "urlPrefix"} for e in entries]


def test_every_scheduler_setup_registers_the_extender_as_the_tested_config_does() -> None:
    tested = _extenders((REPO / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    overlays = REPO / "deploy/kustomize/overlays"
    second = _extenders((overlays / "second-scheduler/kube-scheduler-config.yaml").read_text())
    default = _extenders((overlays / "default-scheduler/kube-scheduler-extender.yaml")
                         .read_text())
    assert second == tested
    assert _without_url(default) == _without_url(tested)


def test_beside_hami_gpustewards_extender_comes_first_as_tested_and_hami_binds() -> None:
    """deploy/scheduler/hami-scheduler-config.yaml: HAMi's own kube-scheduler config (its chart's
    templates/scheduler/configmap.yaml, v2.10.0) with gpusteward's extender first, so HAMi only
    ever picks among the nodes gpusteward kept (tests/e2e/test_hami_mps.py runs it)."""
    config = yaml.safe_load((REPO / "deploy/scheduler/hami-scheduler-config.yaml").read_text())
    tested = _extenders((REPO / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    ours, theirs = config["extenders"]
    assert config["profiles"] == [{"schedulerName": "hami-scheduler"}]
    # no managedResources of its own: kube-scheduler refuses a name two extenders manage; not
    # ignorable: kube-scheduler would move it behind HAMi's
    assert ours.pop("ignorable") is False
    assert _without_url([ours]) == [{k: v for k, v in tested[0].items()
                                     if k not in ("urlPrefix", "managedResources", "ignorable")}]
    assert (theirs["filterVerb"], theirs["bindVerb"], theirs["nodeCacheCapable"]) == (
        "filter", "bind", True)
    assert "prioritizeVerb" not in theirs and "ignorable" not in theirs
    ignored = {r["name"]: r["ignoredByScheduler"] for r in theirs["managedResources"]}
    assert ignored == dict.fromkeys(["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
                                     "nvidia.com/gpumem-percentage", "nvidia.com/priority"], True)


def test_helm_renders_the_same_scheduler_config_as_the_overlay(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    [config_map] = [o for o in rendered["helm-defaults"]
                    if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config")]
    overlay = Path(REPO / "deploy/kustomize/overlays/second-scheduler/kube-scheduler-config.yaml")
    assert yaml.safe_load(config_map["data"]["config.yaml"]) == yaml.safe_load(
        overlay.read_text())


def test_second_scheduler_runs_the_stock_image_with_leader_election(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    for render in ("kustomize-second-scheduler", "helm-defaults"):
        [scheduler] = [o for o in rendered[render] if o["kind"] == "Deployment"
                       and o["metadata"]["name"] == "gpusteward-scheduler"]
        container = scheduler["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    assert not [o for o in rendered["helm-variant"]
                if o["metadata"]["name"] == "gpusteward-scheduler"]


def _hook(obj: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})


def _comparable(obj: dict[str, Any]) -> tuple[str, Any]:
    return obj["kind"] + "/" + obj["metadata"]["name"], obj.get("rules") or obj.get("spec")


def test_helm_and_kustomize_grant_the_same_rights_and_alerts(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {"ClusterRole", "Role", "PrometheusRule"}
    kustomize = dict(_comparable(o) for r in ("kustomize-with-agent", "kustomize-monitoring")
                     for o in rendered[r] if o["kind"] in kinds)
    helm = dict(_comparable(o) for r in ("helm-defaults", "helm-variant")
                for o in rendered[r] if o["kind"] in kinds and not _hook(o))
    # the scheduled report is the chart's alone (values report.*; docs/report.md)
    assert helm.pop("ClusterRole/gpusteward-report")
    assert helm == kustomize


def test_shipped_copies_equal_their_sources() -> None:
    """deploy/tools/generate.py --check: every copy and generated schema is up to date."""
    result = subprocess.run([sys.executable, "deploy/tools/generate.py", "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    example = (REPO / "deploy/policy.example.yaml").read_text()
    assert (REPO / "deploy/kustomize/base/policy.yaml").read_text() == example
    assert (REPO / "deploy/helm/gpusteward/files/policy.yaml").read_text() == example


@pytest.mark.parametrize("level", ["restricted", "privileged"])
def test_pod_security_admits_every_pod_but_the_agent_at_restricted(
        level: str, rendered: dict[str, list[dict[str, Any]]], sandbox: Sandbox) -> None:
    """The real PodSecurity admission plugin, enforcing on pods made from each workload's
    template: every pod meets "restricted" except the agent, which the namespace labels of
    components/agent ("privileged") admit."""
    api = sandbox.api()
    # the RuntimeClass the GPU Operator (NVIDIA Container Toolkit) creates, as the agent needs
    api.apply("/apis/node.k8s.io/v1/runtimeclasses/nvidia", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
        "handler": "nvidia"})
    ns = f"psa-{level}"
    api.apply(f"/api/v1/namespaces/{ns}", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": ns, "labels": {
                                              "pod-security.kubernetes.io/enforce": level}}})
    refused = []
    for obj in rendered["kustomize-with-agent"] + rendered["helm-variant"]:
        if obj["kind"] not in WORKLOADS:
            continue
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": obj["metadata"]["name"], "namespace": ns},
               "spec": obj["spec"]["template"]["spec"]}
        try:
            api.apply(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}", pod,
                      manager="gpusteward-deploy-test", dry_run=True)
        except KubeHTTPError as e:
            assert "violates PodSecurity" in str(e), e
            refused.append(name_of(obj))
    expected = [] if level == "privileged" else [
        "DaemonSet/gpusteward/gpusteward-agent", "DaemonSet/gpusteward/gpusteward-agent"]
    assert refused == expected
