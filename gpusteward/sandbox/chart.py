"""The Helm chart installed into a sandbox with real nodes, as an operator installs it.

``helm`` (built from deploy/tools/go, gpusteward.sandbox.renderers) installs
deploy/helm/gpusteward with the values of :func:`sandbox_values`: the image ``make image``
built, imported on every real node (``pullPolicy: Never``, nothing is pulled), the sandbox's
policy, Prometheus through the node's relay, and the components on the real nodes (the GPU
nodes are kwok's: a pod placed there would never run).

Pods resolve Service names through the sandbox's CoreDNS (gpusteward.sandbox.clusterdns). Two
pieces of a cluster the sandbox runs its own way:

* **The scheduler.** :func:`second_scheduler` runs the chart's own (``secondScheduler``:
  kube-scheduler pods from an image of the sandbox's kube-scheduler, calling the extender by its
  Service name). With ``defaultScheduler`` the sandbox's own kube-scheduler, a host process
  without cluster DNS, gets the extender entry the chart's NOTES print, with the Service's
  ClusterIP in ``urlPrefix`` (:func:`use_chart_extender`). The host reaches ClusterIPs through
  the first real node's kube-proxy, so the call goes Service -> kube-proxy -> an extender pod,
  as in a cluster, only not by name.
* **The Prometheus Operator.** The chart's ServiceMonitors (rendered with
  ``serviceMonitor.enabled=true``) become the scrape jobs the Operator generates for them
  (gpusteward.sandbox.scrape.service_monitor_jobs): Prometheus finds the pods through the API
  server's EndpointSlices, under an identity with kube-prometheus's read rights.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusteward.sandbox.cluster import PROMETHEUS_USER, REPO, SANDBOX_POLICY, Sandbox
from gpusteward.sandbox.fakenvml import CONFIG_ENV, FakeGpu, build_fakenvml, write_config
from gpusteward.sandbox.image import IMAGE, archive, ensure_scheduler_image
from gpusteward.sandbox.realnode import LABEL, import_archive
from gpusteward.sandbox.scrape import KubernetesSD, service_monitor_jobs

CHART = REPO / "deploy" / "helm" / "gpusteward"
RELEASE = NAMESPACE = "gpusteward"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
#: What kube-prometheus's prometheus-k8s ClusterRole lets Prometheus read for discovery.
PROMETHEUS_RULES = [
    {"apiGroups": [""], "resources": ["services", "endpoints", "pods"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["get", "list", "watch"]},
]


class HelmError(RuntimeError):
    """A helm command failed; the message holds its output."""


@dataclass(frozen=True)
class Helm:
    """The helm CLI against one sandbox, as its admin (the operator who installs)."""

    binary: Path
    kubeconfig: Path
    namespace: str = NAMESPACE

    def run(self, *args: str, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), *args, f"--kubeconfig={self.kubeconfig}",
                f"--namespace={self.namespace}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise HelmError(f"helm {' '.join(args)} exited {done.returncode}:\n"
                            f"{done.stdout}{done.stderr}")
        return done

    def install(self, values: Path, *args: str, check: bool = True,
                ) -> subprocess.CompletedProcess[str]:
        return self.run("install", RELEASE, str(CHART), f"--values={values}",
                        "--create-namespace", "--wait", "--timeout=4m", *args, check=check)

    def upgrade(self, values: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("upgrade", RELEASE, str(CHART), f"--values={values}", "--wait",
                        "--timeout=4m", *args)

    def template(self, values: Path, *args: str) -> list[dict[str, Any]]:
        out = self.run("template", RELEASE, str(CHART), f"--values={values}", *args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


def sandbox_values(box: Sandbox) -> dict[str, Any]:
    """Values for the chart in ``box``: the local image, the sandbox's policy, Prometheus
    through the first real node's relay, every component on the real nodes."""
    first = box.real_nodes[box.real_node_names()[0]].slot
    repository, tag = IMAGE.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "schedulerSetup": "defaultScheduler",
        "prometheusUrl": f"http://{first.host_ip}:{box.ports['prometheus']}",
        "policy": SANDBOX_POLICY.read_text(),
        "extender": {"nodeSelector": {LABEL: "real"}},
        "reclaimer": {"nodeSelector": {LABEL: "real"}},
    }


def second_scheduler(box: Sandbox, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the chart's second scheduler: kube-scheduler pods on the real nodes,
    from an image of the sandbox's own kube-scheduler (built and imported into every real
    node here), calling the extender by the Service name the chart renders."""
    tag = ensure_scheduler_image(box.bin / "k8s", log=box.cfg.log)
    path = archive(tag)
    for node in box.real_nodes.values():
        import_archive(node, path)
    return {**values, "schedulerSetup": "secondScheduler",
            "scheduler": {"image": tag, "nodeSelector": {LABEL: "real"}}}


#: Where the agent's container finds the NVML test library and its GPUs.
TEST_NVML_DIR = "/opt/gpusteward-test-nvml"


def with_test_nvml(box: Sandbox, values: dict[str, Any], gpus: list[FakeGpu],
                   ) -> tuple[dict[str, Any], Path]:
    """``values`` with the agent DaemonSet on the real nodes, reading GPUs through the NVML test
    library (gpusteward.sandbox.fakenvml) where a node without the NVIDIA runtime class gets
    the driver's: a host directory mounted by ``agent.extraHostVolumes`` and found through
    ``LD_LIBRARY_PATH``. Return the values and the GPUs' file, which a test may rewrite."""
    lib = build_fakenvml(box.dir / "test-nvml").parent
    config = lib / "gpus.json"
    write_config(config, gpus)
    # null drops the chart's default selector (nvidia.com/gpu.present): the real nodes
    # carry no GPU labels, which would make them GPU nodes to the extender
    agent = {"enabled": True, "runtimeClassName": "",
             "nodeSelector": {LABEL: "real", "nvidia.com/gpu.present": None},
             "extraArgs": ["--interval=1"],
             "extraHostVolumes": [{"name": "test-nvml", "hostPath": str(lib)}],
             "extraVolumeMounts": [{"name": "test-nvml", "mountPath": TEST_NVML_DIR,
                                    "readOnly": True}],
             "extraEnv": [{"name": "LD_LIBRARY_PATH", "value": TEST_NVML_DIR},
                          {"name": CONFIG_ENV, "value": f"{TEST_NVML_DIR}/{config.name}"}]}
    return {**values, "agent": agent}, config


def write_values(box: Sandbox, values: dict[str, Any], name: str = "values.yaml") -> Path:
    path = box.dir / name
    path.write_text(yaml.safe_dump(values))
    return path


def extender_service_url(box: Sandbox) -> str:
    """The extender Service by ClusterIP (the host does not use the cluster's DNS)."""
    service = box.api().get(f"/api/v1/namespaces/{NAMESPACE}/services/{RELEASE}-extender")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    return f"http://{service['spec']['clusterIP']}:{port}"


def use_chart_extender(box: Sandbox) -> str:
    """Restart the sandbox's kube-scheduler with the installed extender Service as its
    extender (schedulerSetup=defaultScheduler); return the URL it calls."""
    url = extender_service_url(box)
    box.cfg.with_extender = True
    box.cfg.scheduler_extender_url = url
    box.restart_scheduler()
    return url


def scrape_service_monitors(box: Sandbox, helm: Helm, values: Path) -> list[str]:
    """Prometheus scrapes what the chart's ServiceMonitors select; return the job names."""
    api = box.api()
    name = "gpusteward-sandbox-prometheus"
    api.apply(f"{RBAC}/clusterroles/{name}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": PROMETHEUS_RULES})
    api.apply(f"{RBAC}/clusterrolebindings/{name}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": PROMETHEUS_USER}]})
    token = box.dir / "prometheus-sd.token"
    token.write_text(box.prometheus_sd_token())
    token.chmod(0o600)
    sd = KubernetesSD(api_server=box.api_url, ca_file=str(box.dir / "pki" / "apiserver.crt"),
                      token_file=str(token))
    monitors = [doc for doc in helm.template(values, "--set=serviceMonitor.enabled=true")
                if doc["kind"] == "ServiceMonitor"]
    jobs = [job for monitor in monitors for job in service_monitor_jobs(monitor, sd)]
    box.add_scrapes(jobs)
    return [job["job_name"] for job in jobs]


def release_status(helm: Helm) -> dict[str, Any]:
    return dict(json.loads(helm.run("status", RELEASE, "--output=json").stdout))
