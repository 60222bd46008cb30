"""Real nodes in the sandbox (issue 27, item 2): a kubelet from the pinned Kubernetes release,
Debian's containerd, runc and CNI plugins, beside the kwok GPU nodes, running pods from the
image `make image` builds, imported locally (gpusteward/sandbox/realnode.py).

* the node registers and turns Ready with the control plane's version and its own InternalIP;
* a pod from the image runs under the chart's security contexts (templates/_helpers.tpl:
  podSecurity, containerSecurity: non-root 65532, RuntimeDefault seccomp, read-only root, no
  capabilities) and its log comes back through the API server (`kubectl logs`);
* an extender pod passes the chart's readiness and liveness probes, counted by the kubelet's
  own prober metrics, and answers on its pod IP;
* `gpusteward report` runs as a Job with its own read-only ServiceAccount and in-cluster
  config, through the node's kube-proxy to the API server, and counts the fleet's GPUs;
* teardown leaves the machine as it found it: no process, cgroup, link, route, mount, host
  sysctl or iptables rule of the node stays, also when its sandbox was killed (the orphan is
  reaped when the next node is claimed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpusteward.adapters.version import version
from gpusteward.sandbox import realnode
from gpusteward.sandbox.cluster import SANDBOX_POLICY, Sandbox, SandboxConfig
from gpusteward.sandbox.fleet import DEFAULT_FLEET, KWOK_ANNOTATION, Fleet
from gpusteward.sandbox.image import IMAGE, git_revision
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.procs import pid_alive
from tests.e2e.kube import Namespace, stdout_document
from tests.support.sandbox import fresh_namespace, started

pytestmark = pytest.mark.e2e

FLEET = Fleet(pools=[p for p in DEFAULT_FLEET.pools if p.name == "l4"])
NODE = "real-0"
#: The chart's pod and container security contexts (deploy/helm/gpusteward/templates/_helpers.tpl).
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}
_INSECURE = ssl._create_unverified_context()


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "real-node-sandbox", fleet=FLEET, real_nodes=1)


@pytest.fixture
def ns(box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(box.api(), "real")


def _pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "nodeSelector": {realnode.LABEL: "real"}, "automountServiceAccountToken": False,
        "securityContext": POD_SECURITY, **spec,
        "containers": [{"name": name, "image": IMAGE, "imagePullPolicy": "Never",
                        "securityContext": CONTAINER_SECURITY, **container}]}}


def _phase(ns: Namespace, name: str) -> str:
    return str(ns.api.get(ns.path("pods", name)).get("status", {}).get("phase", ""))


def _ready(ns: Namespace, name: str) -> bool:
    status = ns.api.get(ns.path("pods", name)).get("status", {})
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in status.get("conditions", []))


def test_the_real_node_joins_ready_beside_the_simulated_ones(box: Sandbox) -> None:
    node = box.api().get(f"/api/v1/nodes/{NODE}")
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == box.api().get("/version")["gitVersion"]
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == box.real_nodes[NODE].slot.node_ip
    assert node["metadata"]["labels"][realnode.LABEL] == "real"
    nodes = box.api().get("/api/v1/nodes")["items"]
    simulated = [n for n in nodes if n["metadata"].get("annotations", {}).get(KWOK_ANNOTATION)]
    assert len(simulated) == len(nodes) - 1, "the kwok GPU nodes are there too"


def test_a_pod_from_the_image_runs_under_the_charts_security_and_logs(
        box: Sandbox, ns: Namespace) -> None:
    ns.create_pod(_pod("version", {"args": ["--version"]}, restartPolicy="Never"))
    phase = wait_for("the --version pod to finish",
                     lambda: _phase(ns, "version") in ("Succeeded", "Failed") and
                     _phase(ns, "version"), timeout=60)
    log = ns.api.get_text(ns.path("pods", "version") + "/log")
    assert phase == "Succeeded", log
    assert log.strip() == f"gpusteward {version()} (revision {git_revision()})"
    status = ns.api.get(ns.path("pods", "version"))["status"]
    assert status["hostIP"] == box.real_nodes[NODE].slot.node_ip
    assert status["podIP"].startswith("10.252.")


def test_an_extender_pod_passes_the_charts_probes(box: Sandbox, ns: Namespace) -> None:
    slot = box.real_nodes[NODE].slot
    kubeconfig = yaml.safe_load(box.kubeconfig.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = (
        f"https://{slot.host_ip}:{box.ports['apiserver']}")
    ns.api.create(ns.path("secrets"), {"apiVersion": "v1", "kind": "Secret",
                                       "metadata": {"name": "kubeconfig"},
                                       "stringData": {"kubeconfig": yaml.safe_dump(kubeconfig)}})
    ns.api.create(ns.path("configmaps"), {"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "policy"},
                                          "data": {"policy.yaml": SANDBOX_POLICY.read_text()}})
    ns.create_pod(_pod("extender", {
        "args": ["extender", "--policy=/etc/gpusteward/policy.yaml",
                 "--kubeconfig=/etc/kube/kubeconfig",
                 f"--prometheus-url=http://{slot.host_ip}:{box.ports['prometheus']}"],
        "ports": [{"name": "http", "containerPort": 8888}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "kube", "mountPath": "/etc/kube", "readOnly": True},
                         {"name": "policy", "mountPath": "/etc/gpusteward", "readOnly": True}]},
        volumes=[{"name": "kube", "secret": {"secretName": "kubeconfig"}},
                 {"name": "policy", "configMap": {"name": "policy"}}]))
    wait_for("the extender pod to be Ready", lambda: _ready(ns, "extender"), timeout=90)
    pod_ip = ns.api.get(ns.path("pods", "extender"))["status"]["podIP"]
    with urllib.request.urlopen(f"http://{pod_ip}:8888/readyz", timeout=5) as resp:
        assert resp.status == 200
    probes = wait_for("the kubelet to count both probes", lambda: (
        (counts := _successful_probes(slot.node_ip, ns.name, "extender"))["Liveness"] >= 1
        and counts), timeout=30)
    assert probes["Readiness"] >= 1, probes


def _successful_probes(node_ip: str, namespace: str, pod: str) -> dict[str, float]:
    """The kubelet's prober_probe_total for one pod, by probe type (its /metrics/probes)."""
    url = f"https://{node_ip}:10250/metrics/probes"
    with urllib.request.urlopen(url, timeout=5, context=_INSECURE) as resp:
        text = resp.read().decode()
    counts = {"Readiness": 0.0, "Liveness": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if (s.name == "prober_probe_total" and s.labels.get("pod") == pod
                    and s.labels.get("namespace") == namespace
                    and s.labels.get("result") == "successful"):
                counts[s.labels["probe_type"]] = counts.get(s.labels["probe_type"], 0) + s.value
    return counts


def test_a_report_job_runs_in_cluster_with_its_own_serviceaccount(
        box: Sandbox, ns: Namespace) -> None:
    # In-cluster config, as the chart's pods use it: the ServiceAccount's projected token and
    # the kubernetes Service (10.96.0.1:443), which the node's kube-proxy sends to the API
    # server. The account may only read; nothing here has admin's token.
    slot = box.real_nodes[NODE].slot
    ns.api.create(ns.path("serviceaccounts"), {"apiVersion": "v1", "kind": "ServiceAccount",
                                               "metadata": {"name": "reporter"}})
    role = f"{ns.name}-read"
    ns.api.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": role},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]})
    ns.api.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "reporter", "namespace": ns.name}]})
    try:
        pod = _pod("report", {"args": [
            "report", "--format=json", "--window=5m",
            f"--prometheus-url=http://{slot.host_ip}:{box.ports['prometheus']}"]},
            restartPolicy="Never", serviceAccountName="reporter")
        del pod["spec"]["automountServiceAccountToken"]
        ns.api.create(f"/apis/batch/v1/namespaces/{ns.name}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "report"},
            "spec": {"backoffLimit": 0, "template": {"spec": pod["spec"]}}})
        wait_for("the report Job to finish", lambda: _job_done(ns, "report"), timeout=90)
        (job_pod,) = ns.api.get(ns.path() + "?labelSelector=job-name%3Dreport")["items"]
        log = ns.api.get_text(ns.path("pods", job_pod["metadata"]["name"]) + "/log")
        assert _job_done(ns, "report") == "Complete", log
        mounts = job_pod["spec"]["containers"][0]["volumeMounts"]
        assert any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
                   for m in mounts), "the token the admission plugin mounts"
        expected = sum(p.count * p.gpus for p in FLEET.pools)
        document = stdout_document(log)
        assert document["totals"]["allocatable"] == expected
    finally:
        ns.api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{role}")
        ns.api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")


def _job_done(ns: Namespace, name: str) -> str:
    job = ns.api.get(f"/apis/batch/v1/namespaces/{ns.name}/jobs/{name}")
    for condition in job.get("status", {}).get("conditions", []):
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return str(condition["type"])
    return ""


# --- teardown -----------------------------------------------------------------------------
def _machine() -> dict[str, Any]:
    """What a real node may touch on the host, as the host sees it."""
    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    return {
        "links": sorted(os.listdir("/sys/class/net")),
        "routes": run("ip", "route", "show"),
        "services_route": run("ip", "route", "show", realnode.SERVICE_CIDR),
        "iptables": [line for line in run("iptables-save").splitlines()
                     if not line.startswith("#")],
        "mounts": sorted(line.split()[1] for line in Path("/proc/self/mounts").read_text()
                         .splitlines()),
        "sysctls": {key: Path("/proc/sys", key).read_text() for key in (
            "vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops",
            "net/ipv4/ip_forward")},
        "run": sorted(os.listdir("/run")), "var_lib": sorted(os.listdir("/var/lib")),
        "var_log": sorted(os.listdir("/var/log")),
        "cgroups": sorted(p.name for p in realnode.CGROUP_FS.glob("*/gpusteward-node*")),
    }


def _processes_under(directory: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(directory) in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def _sleeper(box: Sandbox, ns: Namespace) -> None:
    ns.create_pod(_pod("sleeper", {"command": ["python", "-c", "import time; time.sleep(600)"]}))
    wait_for("the sleeper to run", lambda: _phase(ns, "sleeper") == "Running", timeout=60)


def test_teardown_and_the_orphan_reaper_leave_the_machine_as_found(
        tmp_path: Path) -> None:
    before = _machine()
    for killed in (False, True):
        state = tmp_path / f"killed-{killed}"
        box = Sandbox(SandboxConfig(state_dir=state, fleet=Fleet(pools=[]), real_nodes=1,
                                    with_extender=False)).start()
        try:
            ns = Namespace(box.api(), "sleepers")
            ns.create()
            _sleeper(box, ns)
            slot = box.real_nodes[NODE].slot
            assert _machine() != before  # the node's link, route and cgroups are there
            if killed:
                # A killed sandbox: its holder dies with it; containerd, the kubelet and the
                # pod's processes live on until the reaper finds the holder gone.
                holder = box.real_nodes[NODE].holder_pid
                os.kill(holder, signal.SIGKILL)
                wait_for("the holder to die", lambda pid=holder: not pid_alive(pid), timeout=10)
                box.real_nodes.clear()
                box.procs = {n: p for n, p in box.procs.items() if not n.startswith("node/")}
                assert realnode.pids_in(slot), "the node's processes outlive the holder"
                assert slot.index in realnode.reap_orphans(grace_s=0)
        finally:
            box.stop()
        with contextlib.suppress(TimeoutError):  # links go a moment after their namespace
            wait_for("the machine to be as found", lambda: _machine() == before, timeout=15)
        assert _machine() == before
        assert not _processes_under(state), _processes_under(state)


def test_node_metadata_is_recorded_for_sandbox_down(box: Sandbox) -> None:
    # `sandbox down` runs in another process: the slot must be on record to be torn down.
    state = json.loads((box.dir / "state.json").read_text())
    assert state["real_nodes"] == {NODE: box.real_nodes[NODE].slot.index}
    parts = ("holder", "relay", "containerd", "kubelet", "kube-proxy")
    assert {f"node/{NODE}/{part}" for part in parts} <= \
        set(state["pids"])
