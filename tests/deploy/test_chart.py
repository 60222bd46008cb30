"""Helm chart conventions (issue 17): checksums over what is rendered, values.schema.json,
PodDisruptionBudgets and alerts only where they make sense, the usual values, release-scoped
names, managedResources from the policy, NOTES. Renders with the helm built from Go modules;
`test_render.py` dry-runs every render, the second release included, on the real API server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusteward.core.policyschema import policy_schema
from tests.deploy.conftest import ALL_COMPONENTS, HELM_SECOND_RELEASE, REPO
from tests.deploy.manifests import name_of, render_helm

CHART = REPO / "deploy/helm/gpusteward"
Objects = list[dict[str, Any]]


def _helm(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "helm"), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def _one(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _annotations(objects: Objects, name: str) -> dict[str, str]:
    return _one(objects, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]


def test_any_change_to_the_rendered_scheduler_config_rolls_the_scheduler(bin_dir: Path) -> None:
    def checksum(*args: str) -> str:
        objects = render_helm(bin_dir, CHART, *args)
        return _annotations(objects, "gpusteward-scheduler")["checksum/config"]

    default = checksum()
    assert checksum("--set", "scheduler.extenderWeight=10") != default
    assert checksum("--set-json", 'policy={"resources":["nvidia.com/mig-1g.10gb"]}') != default
    assert checksum("--set", "extender.resources.limits.cpu=2") == default


def test_the_policy_checksum_follows_the_rendered_policy(bin_dir: Path) -> None:
    default = render_helm(bin_dir, CHART, "--set", "reclaimer.enabled=true")
    changed = render_helm(bin_dir, CHART, "--set", "policy.reclaim.mode=warn")
    for name in ("gpusteward-extender", "gpusteward-reclaimer"):
        assert _annotations(default, name)["checksum/policy"] != \
            _annotations(changed, name)["checksum/policy"]


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "extender.replicas=two"], "at '/extender/replicas': got string, want integer"),
    (["--set", "extender.replica=3"], "at '/extender': additional properties 'replica' not "
                                      "allowed"),
    (["--set", "agent.enabeld=true"], "additional properties 'enabeld' not allowed"),
    (["--set", "mode=enforcing"], "at '/mode': value must be one of"),
    (["--set", "policy.reclaim.modee=warn"], "at '/policy/reclaim': additional properties "
                                             "'modee' not allowed"),
    (["--set", "policy.reclaim.limits.maxPerCycle=-1"],
     "at '/policy/reclaim/limits/maxPerCycle': minimum: got -1, want 0"),
    (["--set", "policy.telemetry.refresh=15q"], "at '/policy/telemetry/refresh'"),
    # shorter than the extender's in-flight window, the scheduler could switch replicas mid-burst
    (["--set", "extender.sessionAffinityTimeoutSeconds=10"],
     "at '/extender/sessionAffinityTimeoutSeconds': minimum: got 10, want 30"),
    (["--set", "logFormat=yaml"], "at '/logFormat': value must be one of '', 'text', 'json'"),
    (["--set", "rbac.enabled=false"], "at '/rbac': additional properties 'enabled' not allowed"),
    (["--set", "agent.serviceAccount.annotation.x=y"],
     "at '/agent/serviceAccount': additional properties 'annotation' not allowed"),
    # an existing ServiceAccount must be named: the chart cannot guess it
    (["--set", "reclaimer.serviceAccount.create=false"],
     "at '/reclaimer/serviceAccount/name': minLength: got 0, want 1"),
])
def test_the_values_schema_rejects_typos_and_wrong_types(
        bin_dir: Path, args: list[str], message: str) -> None:
    for command in (["template", "gpusteward", str(CHART)], ["lint", str(CHART)]):
        result = _helm(bin_dir, *command, *args)
        assert result.returncode != 0, command
        assert message in result.stderr + result.stdout, command


def test_policy_text_that_is_not_yaml_fails_the_install(bin_dir: Path) -> None:
    # (helm lint reports a template's `fail` as information only: `template` is what installs)
    result = _helm(bin_dir, "template", "gpusteward", str(CHART),
                   "--set-string", "policy=reclaim: [warn")
    assert result.returncode != 0
    assert "policy is not valid YAML: error converting YAML to JSON" in result.stderr


def test_the_shipped_policy_passes_the_chart_schema_as_a_mapping(bin_dir: Path,
                                                                  tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    example = yaml.safe_load((REPO / "deploy/policy.example.yaml").read_text())
    values.write_text(yaml.safe_dump({"policy": example}))
    objects = render_helm(bin_dir, CHART, "-f", str(values))
    data = _one(objects, "ConfigMap", "gpusteward-policy")["data"]["policy.yaml"]
    assert yaml.safe_load(data) == example
    assert _helm(bin_dir, "lint", "--strict", str(CHART)).returncode == 0


def test_the_published_schema_is_the_one_the_cli_prints() -> None:
    printed = subprocess.run([sys.executable, "-m", "gpusteward", "policy", "schema"], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(printed) == policy_schema() == json.loads(
        (REPO / "deploy/policy.schema.json").read_text())
    chart = json.loads((CHART / "values.schema.json").read_text())
    assert chart["properties"]["policy"]["anyOf"][1]["properties"] == policy_schema()["properties"]


def test_disruption_budgets_only_with_more_than_one_replica(
        rendered: dict[str, Objects]) -> None:
    def budgets(render: str) -> set[str]:
        return {o["metadata"]["name"] for o in rendered[render]
                if o["kind"] == "PodDisruptionBudget"}

    assert budgets("helm-defaults") == {"gpusteward-extender", "gpusteward-reclaimer"}
    assert budgets("helm-variant") == {"gpusteward-extender"}  # reclaimer.replicas=1


def _alert_groups(objects: Objects) -> set[str]:
    return {g["name"] for g in _one(objects, "PrometheusRule", "gpusteward")["spec"]["groups"]}


def test_alerts_only_for_the_components_deployed(bin_dir: Path,
                                                 rendered: dict[str, Objects]) -> None:
    assert _alert_groups(rendered["helm-variant"]) == {
        "gpusteward-extender", "gpusteward-reclaimer", "gpusteward-agent"}
    without = render_helm(bin_dir, CHART, "--set", "prometheusRule.enabled=true",
                          "--set", "reclaimer.enabled=false")
    assert _alert_groups(without) == {"gpusteward-extender"}
    rules = [r["expr"] for g in _one(without, "PrometheusRule", "gpusteward")["spec"]["groups"]
             for r in g["rules"]]
    assert not [e for e in rules if "reclaimer" in e]


def test_the_agent_is_off_by_default(rendered: dict[str, Objects]) -> None:
    assert not [o for o in rendered["helm-defaults"] if o["kind"] == "DaemonSet"]
    assert not [o for o in rendered["kustomize-second-scheduler"] if o["kind"] == "DaemonSet"]
    [namespace] = [o for o in rendered["kustomize-with-agent"] if o["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    [namespace] = [o for o in rendered["kustomize-base"] if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_usual_pod_values_reach_every_component(rendered: dict[str, Objects]) -> None:
    objects = rendered["helm-variant"]
    extender = _one(objects, "Deployment", "gpusteward-extender")["spec"]["template"]
    reclaimer = _one(objects, "Deployment", "gpusteward-reclaimer")["spec"]["template"]
    agent = _one(objects, "DaemonSet", "gpusteward-agent")["spec"]["template"]
    assert extender["spec"]["priorityClassName"] == "system-cluster-critical"
    assert reclaimer["spec"]["priorityClassName"] == "system-cluster-critical"
    assert agent["spec"]["priorityClassName"] == "system-node-critical"
    assert extender["spec"]["nodeSelector"] == {"node-role.kubernetes.io/infra": "true"}
    assert extender["spec"]["tolerations"] == [{"key": "infra", "operator": "Exists"}]
    assert "nodeAffinity" in reclaimer["spec"]["affinity"]
    assert extender["metadata"]["labels"]["team"] == "platform"
    assert agent["metadata"]["annotations"] == {"note": "x"}
    args = reclaimer["spec"]["containers"][0]["args"]
    assert args[-3:] == ["--log-level=debug", "--log-format=json", "--lease-duration=20"]
    assert extender["metadata"]["labels"]["app.kubernetes.io/name"] == "steward"


def test_every_object_carries_the_version_and_selects_its_own_instance(
        rendered: dict[str, Objects]) -> None:
    for obj in rendered["helm-second-release"]:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/version"] == "0.1.0", name_of(obj)
        assert labels["app.kubernetes.io/instance"] == "second", name_of(obj)
        selector = obj.get("spec", {}).get("selector")
        if obj["kind"] in {"Deployment", "DaemonSet", "PodDisruptionBudget"}:
            assert selector["matchLabels"]["app.kubernetes.io/instance"] == "second"
        elif obj["kind"] == "Service":
            assert selector["app.kubernetes.io/instance"] == "second"


def test_two_releases_share_no_object(rendered: dict[str, Objects]) -> None:
    first = {name_of(o) for o in rendered["helm-defaults"]}
    second = {name_of(o) for o in rendered["helm-second-release"]}
    assert first & second == set()
    cluster_scoped = {n for n in second if n.split("/")[1] == "-"}
    assert cluster_scoped and all("/second-gpusteward" in n for n in cluster_scoped)
    config = yaml.safe_load(_one(rendered["helm-second-release"], "ConfigMap",
                                 "second-gpusteward-scheduler-config")["data"]["config.yaml"])
    assert config["profiles"] == [{"schedulerName": "second-gpusteward-scheduler"}]
    assert config["extenders"][0]["urlPrefix"] == \
        f"http://second-gpusteward-extender.{HELM_SECOND_RELEASE[1]}.svc:8888"


def _managed(objects: Objects, name: str = "gpusteward-scheduler-config") -> list[str]:
    config = yaml.safe_load(_one(objects, "ConfigMap", name)["data"]["config.yaml"])
    return [r["name"] for r in config["extenders"][0]["managedResources"]]


def test_managed_resources_are_the_policy_resources(bin_dir: Path,
                                                    rendered: dict[str, Objects]) -> None:
    example = yaml.safe_load((REPO / "deploy/policy.example.yaml").read_text())
    assert _managed(rendered["helm-defaults"]) == example["resources"]
    mixed = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"]
    policy = json.dumps({"resources": mixed})
    objects = render_helm(bin_dir, CHART, "--set-json", f"policy={policy}")
    assert _managed(objects) == mixed
    for path in ("deploy/scheduler/kube-scheduler-config.yaml",
                 "deploy/kustomize/overlays/second-scheduler/kube-scheduler-config.yaml",
                 "deploy/kustomize/overlays/default-scheduler/kube-scheduler-extender.yaml"):
        config = yaml.safe_load((REPO / path).read_text())
        assert [r["name"] for r in config["extenders"][0]["managedResources"]] == \
            example["resources"], path


def _notes(bin_dir: Path, *args: str) -> str:
    result = _helm(bin_dir, "install", "gpusteward", str(CHART), "--dry-run=client",
                   "--namespace", "gpusteward", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:\n", 1)[1]


def test_notes_print_the_real_mode_and_how_to_verify(bin_dir: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("reclaim:\n  mode: warn\n")
    assert "Reclaimer: mode warn (the policy's reclaim.mode)." in _notes(
        bin_dir, "--set-file", f"policy={policy}")
    assert "Reclaimer: mode enforce." in _notes(bin_dir, "--set", "mode=enforce")
    notes = _notes(bin_dir)
    assert "Reclaimer: mode observe (the policy's reclaim.mode)." in notes
    assert "kubectl -n gpusteward get lease gpusteward-reclaimer" in notes
    assert "helm test gpusteward -n gpusteward" in notes


def test_notes_warn_when_the_scheduler_image_skews_from_the_cluster(bin_dir: Path) -> None:
    notes = _notes(bin_dir, "--set", "scheduler.image=registry.k8s.io/kube-scheduler:v1.20.0")
    found = re.search(r"kube-scheduler 1\.20 but the cluster runs Kubernetes (\d+\.\d+)", notes)
    assert found, notes
    same = f"registry.k8s.io/kube-scheduler:v{found.group(1)}.1"
    assert "WARNING" not in _notes(bin_dir, "--set", f"scheduler.image={same}")


def test_helm_test_pod_calls_the_extender_and_may_pass_its_network_policy(
        rendered: dict[str, Objects]) -> None:
    objects = rendered["helm-defaults"]
    pod = _one(objects, "Pod", "gpusteward-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["EXTENDER_URL"] == "http://gpusteward-extender.gpusteward.svc:8888"
    assert env["LEASE"] == "gpusteward-reclaimer"
    policy = _one(objects, "NetworkPolicy", "gpusteward-extender")
    admitted = [s["podSelector"]["matchLabels"] for s in policy["spec"]["ingress"][0]["from"]]
    assert {k: v for k, v in pod["metadata"]["labels"].items()
            if k in admitted[-1]} == admitted[-1]
    role = _one(objects, "Role", "gpusteward-test")
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "resourceNames": ["gpusteward-reclaimer"], "verbs": ["get"]}]


RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def _pods(objects: Objects) -> dict[str, dict[str, Any]]:
    """Each workload's pod spec, the CronJobs' and the `helm test` Pod's, by object name."""
    def spec(o: dict[str, Any]) -> dict[str, Any]:
        if o["kind"] == "CronJob":
            return dict(o["spec"]["jobTemplate"]["spec"]["template"]["spec"])
        return dict(o["spec"]["template"]["spec"] if "template" in o["spec"] else o["spec"])
    return {o["metadata"]["name"]: spec(o) for o in objects
            if o["kind"] in {"Deployment", "DaemonSet", "Pod", "CronJob"}}


def _argv(pod: dict[str, Any]) -> list[str]:
    container = pod["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]


def test_log_format_reaches_every_gpusteward_component(rendered: dict[str, Objects]) -> None:
    for render in ("helm-variant", "helm-existing-accounts"):
        pods = _pods(rendered[render])
        for name, pod in pods.items():
            gpusteward = name.split("-")[-1] in {"extender", "reclaimer", "agent", "report",
                                                 "whatif"}
            assert ("--log-format=json" in _argv(pod)) is gpusteward, (render, name)
        assert "gpusteward-agent" in pods
    assert "gpusteward-scheduler" in _pods(rendered["helm-existing-accounts"])
    for pod in _pods(rendered["helm-defaults"]).values():
        assert not [a for a in _argv(pod) if "--log-format" in a]


def test_existing_service_accounts_and_no_rbac(bin_dir: Path,
                                               rendered: dict[str, Objects]) -> None:
    # The convention of descheduler's and kube-state-metrics' charts (rbac.create,
    # serviceAccount.create/name/annotations), one serviceAccount block per component as
    # cert-manager's chart has (webhook.serviceAccount, cainjector.serviceAccount).
    objects = rendered["helm-existing-accounts"]
    assert [name_of(o) for o in objects if o["kind"] in RBAC_KINDS] == []
    pods = _pods(objects)
    assert {name: pod["serviceAccountName"] for name, pod in pods.items()} == {
        "gpusteward-scheduler": "ops-scheduler", "gpusteward-extender": "ops-extender",
        "gpusteward-reclaimer": "ops-reclaimer", "gpusteward-agent": "ops-agent",
        "gpusteward-report": "ops-report", "gpusteward-whatif": "ops-whatif",
        # without its Role, `helm test` reads the Lease with the reclaimer's rights
        "gpusteward-test": "ops-reclaimer"}
    # nothing else is left out: the same release with the chart's own accounts and RBAC
    created = render_helm(bin_dir, CHART, *ALL_COMPONENTS)
    assert {name_of(o) for o in objects} == \
        {name_of(o) for o in created if o["kind"] not in RBAC_KINDS}


def test_named_service_accounts_are_created_bound_and_annotated(
        rendered: dict[str, Objects]) -> None:
    objects = rendered["helm-variant"]
    accounts = {o["metadata"]["name"]: o["metadata"].get("annotations")
                for o in objects if o["kind"] == "ServiceAccount"}
    assert accounts == {  # IRSA: the annotation EKS's pod identity webhook reads
        "steward-extender": None, "gpusteward-agent": None, "gpusteward-report": None,
        "gpusteward-whatif": None,
        "gpusteward-reclaimer": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/gpusteward-reclaimer"}}
    assert _pods(objects)["gpusteward-extender"]["serviceAccountName"] == "steward-extender"
    binding = _one(objects, "ClusterRoleBinding", "gpusteward-extender")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "steward-extender",
                                    "namespace": "gpusteward"}]


def test_the_policys_own_owner_switches_get_exactly_their_rbac(bin_dir: Path) -> None:
    """reclaim.ownerActions.kinds may name a switch for a kind gpusteward does not know
    (docs/policy.md): the reclaimer's ClusterRole grows by get and patch on that resource (its
    scale subresource for a scale switch), and by nothing for block/evict/annotate."""
    policy = json.dumps({"reclaim": {"ownerActions": {"kinds": {
        "Lab.example.com": {"resource": "labs", "annotation": "example.com/stopped"},
        "Model.serving.example.com": {"resource": "models", "scale": True},
        "Trainer.example.com": "evict"}}}})
    objects = render_helm(bin_dir, CHART, "--set-json", f"policy={policy}")
    rules = _one(objects, "ClusterRole", "gpusteward-reclaimer")["rules"]
    ours = [r for r in rules if r["apiGroups"][0].endswith("example.com")]
    assert ours == [
        {"apiGroups": ["example.com"], "resources": ["labs"], "verbs": ["get", "patch"]},
        {"apiGroups": ["serving.example.com"], "resources": ["models", "models/scale"],
         "verbs": ["get", "patch"]}]
    defaults = _one(render_helm(bin_dir, CHART), "ClusterRole", "gpusteward-reclaimer")["rules"]
    assert rules[:len(defaults)] == defaults


def test_report_and_whatif_run_on_a_schedule_on_the_installed_policy(
        rendered: dict[str, Objects]) -> None:
    objects = rendered["helm-variant"]
    pods = _pods(objects)
    report, whatif = pods["gpusteward-report"], pods["gpusteward-whatif"]
    assert _argv(report)[:4] == ["report", "--policy=/etc/gpusteward/policy.yaml",
                                 "--window=7d", "--by=team"]
    assert "--prometheus-url=http://prometheus.monitoring.svc:9090" in _argv(report)
    # the installed policy beside each candidate, whose file the candidates ConfigMap holds
    assert _argv(whatif)[:4] == ["whatif", "--policy=/etc/gpusteward/policy.yaml",
                                 "--policy=/etc/gpusteward-whatif/longer-window.yaml",
                                 "--window=7d"]
    candidates = _one(objects, "ConfigMap", "gpusteward-whatif")["data"]
    assert yaml.safe_load(candidates["longer-window.yaml"]) == {
        "reclaim": {"idle": {"window": "2h"}}}
    # the report reads the API server as its own account; whatif reads only Prometheus
    assert report["serviceAccountName"] == "gpusteward-report"
    assert report["automountServiceAccountToken"] is True
    assert whatif["automountServiceAccountToken"] is False
    for pod in (report, whatif):
        assert pod["restartPolicy"] == "Never"
        assert pod["securityContext"]["runAsUser"] == 65532
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GPUSTEWARD_PROMETHEUS_BEARER_TOKEN_FILE"] == \
            "/var/run/secrets/gpusteward/prometheus/token"
    for name in ("gpusteward-report", "gpusteward-whatif"):
        cron = _one(objects, "CronJob", name)["spec"]
        assert cron["concurrencyPolicy"] == "Forbid"
    binding = _one(objects, "ClusterRoleBinding", "gpusteward-report")
    assert binding["subjects"][0]["name"] == "gpusteward-report"
    verbs = {v for rule in _one(objects, "ClusterRole", "gpusteward-report")["rules"]
             for v in rule["verbs"]}
    assert verbs == {"get", "list"}, "the report writes nothing"
    assert not [o for o in rendered["helm-defaults"] if o["kind"] == "CronJob"]


def test_the_agent_mounts_a_driver_from_the_host_as_dcgm_exporters_chart_does(
        rendered: dict[str, Objects]) -> None:
    # NVIDIA/dcgm-exporter deployment/values.yaml: extraHostVolumes, extraVolumeMounts, extraEnv
    agent = _pods(rendered["helm-variant"])["gpusteward-agent"]
    (container,) = agent["containers"]
    assert {"name": "LD_LIBRARY_PATH", "value": "/driver"} in container["env"]
    assert {"name": "driver", "mountPath": "/driver"} in container["volumeMounts"]
    assert {"name": "driver", "hostPath": {"path": "/run/nvidia/driver"}} in agent["volumes"]
