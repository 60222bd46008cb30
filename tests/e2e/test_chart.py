"""The Helm chart installed for real (issue 27, items 3 to 6): `helm install` of
deploy/helm/gpusteward into a sandbox with a real node, the image `make image` built, every
component a pod with its own ServiceAccount and in-cluster config (gpusteward.sandbox.chart).

* the extender Deployment (2 replicas) and the reclaimer (2 replicas behind its Lease) run on
  the real node, Ready, each as its own ServiceAccount, and one reclaimer pod leads;
* the scheduler reaches the extender through its Service: the sandbox's kube-scheduler (a host
  process, outside cluster DNS) with the defaultScheduler recipe and the Service's ClusterIP,
  kube-proxy on the node sending the calls to an extender pod, which places a GPU pod on a card
  it accepts;
* the chart's second scheduler runs as kube-scheduler pods (the sandbox's own binary in an
  image from scratch) and reaches the extender by the Service name the chart renders, through
  the sandbox's CoreDNS and kube-proxy;
* Prometheus scrapes both components' /metrics through the scrape jobs the Prometheus Operator
  makes of the chart's ServiceMonitors;
* the reclaimer pod warns then evicts an idle GPU pod and leaves a busy one; a leader killed
  mid-cycle hands its Lease over within the documented time;
* `helm upgrade` with a policy change rolls both Deployments (the pod template's policy
  checksum), and `helm rollback` returns the policy and the checksum;
* `helm test` passes (its Pod calls the extender by the Service name the chart renders,
  resolved by the sandbox's CoreDNS), and `helm uninstall` leaves none of the chart's objects
  behind: only the Lease, the ConfigMaps of its records and Events, as docs/install.md says;
* bad input at install: a values file the schema refuses (the field named, nothing created), a
  policy that fails validation (exit 2, every problem in the pod's status, no traceback), and
  an unreachable Prometheus (the extender Ready and neutral, the reclaimer marking nothing).

The GPU nodes carry GKE's GPU taint (nvidia.com/gpu=present:NoSchedule, which GKE puts on every
GPU node pool: cloud.google.com/kubernetes-engine/docs/how-to/gpus), so only pods that tolerate
it land there; the chart's pods, which do not, land on the real node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT
from gpusteward.sandbox import chart, realnode
from gpusteward.sandbox.cluster import SANDBOX_POLICY, Sandbox, SandboxConfig
from gpusteward.sandbox.fakenvml import GIB, FakeGpu, write_config
from gpusteward.sandbox.fleet import DEFAULT_FLEET, Fleet, TaintSpec
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.renderers import ensure_renderers
from tests.e2e.kube import Namespace, annotations, gone, gpu_pod, reasons, stdout_document
from tests.support.sandbox import fresh_namespace

pytestmark = pytest.mark.e2e

GPU_TAINT = TaintSpec(key="nvidia.com/gpu", value="present", effect="NoSchedule")
FLEET = Fleet(pools=[msgspec.structs.replace(p, taints=[GPU_TAINT])
                     for p in DEFAULT_FLEET.pools if p.name == "l4"])
NODE = "real-0"
APPS = "/apis/apps/v1/namespaces/gpusteward"
EXTENDER_METRICS, RECLAIMER_METRICS = 9090, 8080  # the chart's metricsPort defaults
AGENT_METRICS = 9400  # agent.port (dcgm-exporter's)
LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpusteward/leases"
#: What uninstall leaves (docs/install.md, "Uninstall"): the reclaimer's Lease and the records
#: it keeps in ConfigMaps (made at run time, not by the chart).
LEFT_BEHIND = {f"gpusteward-reclaimer-{record}" for record in
               ("reclaims", "stops", "snoozes", "notifications")}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    state = Path(tmp_path_factory.mktemp("chart-sandbox"))
    sandbox = Sandbox(SandboxConfig(state_dir=state, fleet=FLEET, real_nodes=1,
                                    with_extender=False)).start()
    try:
        yield sandbox
    finally:
        sandbox.stop()


@pytest.fixture(scope="module")
def helm(box: Sandbox) -> chart.Helm:
    return chart.Helm(ensure_renderers() / "helm", box.kubeconfig)


#: The GPU the agent's NVML test library reports on the real node (gpusteward.sandbox.fakenvml).
AGENT_GPU = FakeGpu(uuid="GPU-9b0e7c1a-real-0000-0000-000000000000", util_gpu=37,
                    memory_used=4 * GIB)
#: The scheduled report and what-if, suspended: each run here is made by hand, as
#: `kubectl create job --from=cronjob/...` makes it.
LONGER_WINDOW = yaml.safe_load(SANDBOX_POLICY.read_text())
LONGER_WINDOW["reclaim"]["idle"]["window"] = "1h"
REPORTS = {
    "report": {"enabled": True, "suspend": True, "nodeSelector": {realnode.LABEL: "real"},
               "args": ["--window=10m", "--by=card", "--format=json"]},
    "whatif": {"enabled": True, "suspend": True, "nodeSelector": {realnode.LABEL: "real"},
               "args": ["--window=15m", "--format=json"],
               "candidates": {"longer-window": LONGER_WINDOW}},
}


#: The sandbox policy with one reclaim an hour: the reclaim test below takes it, and the
#: leader that takes over after a kill must know it (the ledger beside the Lease).
ONE_PER_HOUR = yaml.safe_load(SANDBOX_POLICY.read_text())
ONE_PER_HOUR["reclaim"]["limits"]["maxPerHour"] = 1


@pytest.fixture(scope="module")
def agent_gpus(box: Sandbox) -> tuple[dict[str, Any], Path]:
    """The chart's values (the second scheduler, one reclaim an hour, the report and what-if
    CronJobs, the agent on the NVML test library) and the agent's GPUs' file."""
    values = {**chart.second_scheduler(box, chart.sandbox_values(box)), **REPORTS,
              "policy": yaml.safe_dump(ONE_PER_HOUR), "serviceMonitor": {"interval": "2s"}}
    return chart.with_test_nvml(box, values, [AGENT_GPU])


@pytest.fixture(scope="module")
def values(box: Sandbox, agent_gpus: tuple[dict[str, Any], Path]) -> Path:
    return chart.write_values(box, agent_gpus[0])


@pytest.fixture(scope="module")
def installed(box: Sandbox, helm: chart.Helm, values: Path) -> chart.Helm:
    helm.install(values)
    return helm


@pytest.fixture
def ns(box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(box.api(), "chart")


def _pods(box: Sandbox, component: str) -> list[dict[str, Any]]:
    selector = urllib.parse.quote(f"app.kubernetes.io/component={component}")
    return list(box.api().get(
        f"/api/v1/namespaces/gpusteward/pods?labelSelector={selector}")["items"])


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def test_every_component_runs_as_a_pod_with_its_own_serviceaccount(
        box: Sandbox, installed: chart.Helm) -> None:
    assert chart.release_status(installed)["info"]["status"] == "deployed"
    for component, account in (("extender", "gpusteward-extender"),
                                ("reclaimer", "gpusteward-reclaimer")):
        deployment = box.api().get(f"{APPS}/deployments/gpusteward-{component}")
        assert deployment["status"].get("readyReplicas") == 2, deployment["status"]
        pods = _pods(box, component)
        assert len(pods) == 2 and all(_ready(p) for p in pods)
        for pod in pods:
            assert pod["spec"]["serviceAccountName"] == account
            assert pod["spec"]["nodeName"] == NODE
            (container,) = pod["spec"]["containers"]
            assert container["image"] == "localhost/gpusteward:dev"
            assert not any("kubeconfig" in arg for arg in container["args"]), \
                "in-cluster config, not a kubeconfig"
    holders = {p["metadata"]["name"] for p in _pods(box, "reclaimer")}
    holder = wait_for("a reclaimer pod to lead", lambda: _lease_holder(box), timeout=60)
    assert any(holder.startswith(f"{name}-") for name in holders), (holder, holders)


def _lease_holder(box: Sandbox) -> str | None:
    path = f"{LEASES}/gpusteward-reclaimer"
    if not box.api().exists(path):
        return None
    return box.api().get(path)["spec"].get("holderIdentity")


def _metric(box: Sandbox, component: str, port: int, name: str,
            labels: dict[str, str] | None = None) -> list[float]:
    """One sample's value from each of ``component``'s pods, read from its metrics port."""
    values = []
    for pod in _pods(box, component):
        url = f"http://{pod['status']['podIP']}:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        values += [s.value for family in text_string_to_metric_families(text)
                   for s in family.samples
                   if s.name == name and (labels is None or s.labels == labels)]
    return values


def _filter_calls(box: Sandbox) -> float:
    """Filter calls answered, summed over the extender pods."""
    return sum(_metric(box, "extender", EXTENDER_METRICS, "gpusteward_extender_requests_total",
                       {"verb": "filter", "code": "200"}))


def test_the_scheduler_places_gpu_pods_through_the_extender_service(
        box: Sandbox, installed: chart.Helm, ns: Namespace) -> None:
    url = chart.use_chart_extender(box)
    assert url.startswith("http://10.96."), url
    before = _filter_calls(box)
    ns.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
                   "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                             "effect": "NoSchedule"}],
                            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                            "containers": [{"name": "main", "image": "trainer",
                                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    node = wait_for("the GPU pod to be placed", lambda: ns.api.get(
        ns.path("pods", "trainer"))["spec"].get("nodeName"), timeout=60)
    assert node.startswith("l4-"), node
    assert _filter_calls(box) > before, "the extender pods answered the scheduler's filter call"


def test_the_charts_second_scheduler_places_gpu_pods_through_the_extender_by_name(
        box: Sandbox, installed: chart.Helm, ns: Namespace) -> None:
    # schedulerSetup=secondScheduler: kube-scheduler pods (the sandbox's own binary in an image)
    # with the chart's config, whose extender urlPrefix is the Service's DNS name, resolved by
    # the sandbox's CoreDNS; GPU pods opt in with spec.schedulerName.
    config = yaml.safe_load(box.api().get(
        "/api/v1/namespaces/gpusteward/configmaps/gpusteward-scheduler-config")["data"][
        "config.yaml"])
    assert config["extenders"][0]["urlPrefix"] == "http://gpusteward-extender.gpusteward.svc:8888"
    pods = _pods(box, "scheduler")
    assert len(pods) == 2 and all(_ready(p) for p in pods)
    assert {p["spec"]["serviceAccountName"] for p in pods} == {"gpusteward-scheduler"}
    before = _filter_calls(box)
    pod = gpu_pod("opted-in", 1, cards="NVIDIA-L4", tolerate="nvidia.com/gpu")
    pod["spec"]["schedulerName"] = "gpusteward-scheduler"
    ns.create_pod(pod)
    assert ns.node_of("opted-in").startswith("l4-")
    assert _filter_calls(box) > before, "the extender pods answered the second scheduler"
    scheduled = [e for e in ns.api.get(ns.path("events"))["items"]
                 if e["reason"] == "Scheduled" and e["involvedObject"]["name"] == "opted-in"]
    assert scheduled and all(
        (e.get("reportingComponent") or e["source"].get("component")) == "gpusteward-scheduler"
        for e in scheduled), scheduled


def _up(box: Sandbox, job: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": f'up{{job="{job}"}} == 1'})
    with urllib.request.urlopen(f"{box.prometheus_url}/api/v1/query?{query}",
                                timeout=5) as resp:
        return list(json.loads(resp.read())["data"]["result"])


def test_prometheus_scrapes_the_pods_its_service_monitors_select(
        box: Sandbox, installed: chart.Helm, values: Path) -> None:
    jobs = chart.scrape_service_monitors(box, installed, values)
    assert sorted(jobs) == ["serviceMonitor/gpusteward/gpusteward-agent/0",
                            "serviceMonitor/gpusteward/gpusteward-extender/0",
                            "serviceMonitor/gpusteward/gpusteward-reclaimer/0"]
    # job: the Service's name, as the Operator sets it without a jobLabel
    for component, job in (("extender", "gpusteward-extender"),
                           ("reclaimer", "gpusteward-reclaimer-metrics")):
        targets = wait_for(f"both {component} pods scraped", lambda j=job: (
            found if len(found := _up(box, j)) == 2 else None), timeout=60)
        pods = {p["metadata"]["name"] for p in _pods(box, component)}
        assert {t["metric"]["pod"] for t in targets} == pods
        assert {t["metric"]["endpoint"] for t in targets} == {"metrics"}
        assert {t["metric"]["namespace"] for t in targets} == {"gpusteward"}


def _agent_series(box: Sandbox) -> dict[str, float]:
    """UUID -> DCGM_FI_DEV_GPU_UTIL as Prometheus scraped it from the agent pods."""
    query = urllib.parse.urlencode(
        {"query": 'DCGM_FI_DEV_GPU_UTIL{job="gpusteward-agent"}'})
    with urllib.request.urlopen(f"{box.prometheus_url}/api/v1/query?{query}",
                                timeout=5) as resp:
        found = json.loads(resp.read())["data"]["result"]
    return {s["metric"]["UUID"]: float(s["value"][1]) for s in found
            if s["metric"].get("Hostname") == NODE}


def test_the_agent_daemonset_reads_nvml_on_the_real_node_and_is_scraped(
        box: Sandbox, installed: chart.Helm, values: Path,
        agent_gpus: tuple[dict[str, Any], Path]) -> None:
    # The NVML test library (sandbox/fakenvml/fakenvml.c, nvml.h's signatures) mounted where
    # a node without the NVIDIA runtime class mounts the driver's (agent.extraHostVolumes).
    chart.scrape_service_monitors(box, installed, values)
    (pod,) = _pods(box, "agent")
    assert pod["spec"]["nodeName"] == NODE and _ready(pod)
    assert pod["spec"]["hostPID"] is True
    assert _metric(box, "agent", AGENT_METRICS, "gpusteward_agent_nvml_up") == [1.0]
    assert wait_for("the agent's GPU scraped", lambda: _agent_series(box) or None,
                    timeout=60) == {AGENT_GPU.uuid: 37.0}
    # the library re-reads its file: a new reading reaches Prometheus through the agent
    write_config(agent_gpus[1], [dataclasses.replace(AGENT_GPU, util_gpu=81)])
    wait_for("the new reading scraped",
             lambda: _agent_series(box) == {AGENT_GPU.uuid: 81.0}, timeout=60)


def test_helm_test_passes(box: Sandbox, installed: chart.Helm) -> None:
    done = installed.run("test", chart.RELEASE, "--timeout=3m")  # raises unless it passed
    assert "Succeeded" in done.stdout, done.stdout


def test_the_reclaimer_pod_warns_then_evicts_an_idle_pod_and_leaves_a_busy_one(
        box: Sandbox, installed: chart.Helm, ns: Namespace) -> None:
    # The sandbox policy the chart was given: enforce, a 15 s idle window, a 4 s grace.
    for name, util in (("idle", "0"), ("busy", "90")):
        ns.create_pod(gpu_pod(name, 1, node=f"l4-{0 if name == 'idle' else 1}", util=util,
                              tolerate="nvidia.com/gpu"))
        ns.running(name)
    wait_for("the idle pod marked and warned", lambda: RECLAIM_AT in annotations(ns, "idle"),
             timeout=90)
    assert not gone(ns, "idle")
    wait_for("the idle pod evicted", lambda: gone(ns, "idle"), timeout=60)
    assert {"GPUIdle", "GPUIdleWarning", "GPUReclaimed"} <= set(reasons(ns, "idle"))
    assert ns.pod("busy")["status"]["phase"] == "Running"
    assert IDLE_SINCE not in annotations(ns, "busy")
    assert not {"GPUIdleWarning", "GPUReclaimed"} & set(reasons(ns, "busy"))
    # reclaimed by a chart pod: its Event names the pod (reportingInstance, the hostname)
    (reclaimed,) = [e for e in ns.api.get(ns.path("events"))["items"]
                    if e["reason"] == "GPUReclaimed"]
    pods = {p["metadata"]["name"] for p in _pods(box, "reclaimer")}
    assert reclaimed["reportingInstance"] in pods, (reclaimed["reportingInstance"], pods)


BATCH = "/apis/batch/v1/namespaces/gpusteward"


def _run_now(box: Sandbox, cronjob: str, name: str) -> str:
    """Run ``cronjob`` once, as `kubectl create job NAME --from=cronjob/CRONJOB` does
    (kubectl's pkg/cmd/create/create_job.go, createJobFromCronJob: the jobTemplate, the
    annotation cronjob.kubernetes.io/instantiate=manual, the CronJob as controlling owner);
    return its pod's log once the Job has completed."""
    api = box.api()
    source = api.get(f"{BATCH}/cronjobs/{cronjob}")
    template = source["spec"]["jobTemplate"]
    api.create(f"{BATCH}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": template["metadata"].get("labels", {}),
                     "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                     "ownerReferences": [{
                         "apiVersion": "batch/v1", "kind": "CronJob", "name": cronjob,
                         "uid": source["metadata"]["uid"], "controller": True}]},
        "spec": template["spec"]})

    def finished() -> dict[str, Any] | None:
        status = api.get(f"{BATCH}/jobs/{name}").get("status", {})
        return status if status.get("succeeded") or status.get("failed") else None

    status = wait_for(f"the {name} Job to finish", finished, timeout=120)
    (pod,) = api.get("/api/v1/namespaces/gpusteward/pods?labelSelector=" + urllib.parse.quote(
        f"batch.kubernetes.io/job-name={name}"))["items"]
    log = str(api.get_text(f"/api/v1/namespaces/gpusteward/pods/{pod['metadata']['name']}/log"))
    assert status.get("succeeded") == 1, log
    assert pod["spec"]["nodeName"] == NODE
    return log


def test_the_report_runs_as_a_job_of_the_chart_on_its_own_read_only_account(
        box: Sandbox, installed: chart.Helm, ns: Namespace) -> None:
    ns.create_pod(gpu_pod("serving", 1, node="l4-2", util="70", tolerate="nvidia.com/gpu"))
    ns.running("serving")
    doc = stdout_document(_run_now(box, "gpusteward-report", "report-now"))
    nodes = box.api().get("/api/v1/nodes?labelSelector=" + urllib.parse.quote(
        "nvidia.com/gpu.product=NVIDIA-L4"))["items"]
    (l4,) = [g for g in doc["groups"] if g["name"] == "NVIDIA-L4"]
    assert l4["allocatable"] == sum(int(n["status"]["allocatable"]["nvidia.com/gpu"])
                                    for n in nodes)
    assert l4["allocated"] >= 1, l4  # the serving pod, at least
    (pod,) = _pods(box, "report")
    assert pod["spec"]["serviceAccountName"] == "gpusteward-report"


def test_whatif_runs_as_a_job_of_the_chart_and_replays_each_policy(
        box: Sandbox, installed: chart.Helm) -> None:
    # After the reclaim above: the installed policy (15 s window) frees the idle pod the
    # reclaimer evicted; the candidate's 1 h window, longer than the replay, frees nothing.
    doc = stdout_document(_run_now(box, "gpusteward-whatif", "whatif-now"))
    outcomes = {o["policy"]: o for o in doc["policies"]}
    # each policy's column: its file's name (whatif/cli.py)
    assert list(outcomes) == ["policy.yaml", "longer-window.yaml"]
    installed_policy = outcomes["policy.yaml"]["reclaimed"]
    assert any(r["pod"].endswith("/idle") for r in installed_policy), installed_policy
    assert outcomes["longer-window.yaml"]["reclaimed"] == []
    (pod,) = _pods(box, "whatif")
    assert pod["spec"]["automountServiceAccountToken"] is False


def _process_of(box: Sandbox, pod: str, command: str) -> int:
    """The pid, as the host sees it, of ``pod``'s container running ``gpusteward command``:
    the kubelet sets each container's HOSTNAME to its pod's name."""
    for pid in realnode.pids_in(box.real_nodes[NODE].slot):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if command.encode() in argv[:3] and f"HOSTNAME={pod}".encode() in environ:
            return pid
    raise AssertionError(f"no {command} process of pod {pod}")


def test_a_killed_leader_hands_the_lease_over_in_time_with_its_limits(
        box: Sandbox, installed: chart.Helm, ns: Namespace) -> None:
    # docs/operations.md, "Failure modes of the reclaimer": a leader killed without releasing
    # its Lease is replaced within leaseDurationSeconds + 2 renewal periods (15 s + 2 x 2.5 s
    # with the chart's defaults) of its last renewal; 3 s more for this machine's API calls.
    holder = wait_for("a reclaimer pod to lead", lambda: _lease_holder(box), timeout=60)
    pod = holder.rsplit("-", 1)[0]
    os.kill(_process_of(box, pod, "reclaimer"), signal.SIGKILL)
    killed = time.monotonic()
    successor = wait_for("another replica to lead", lambda: (
        new if (new := _lease_holder(box)) not in (None, holder) else None), timeout=40)
    assert time.monotonic() - killed <= 15 + 2 * 2.5 + 3
    assert successor != holder
    # the killed container restarts in its pod (restartPolicy Always) and stands by
    wait_for("both reclaimer pods Ready again", lambda: len(
        [p for p in _pods(box, "reclaimer") if _ready(p)]) == 2, timeout=60)
    # Limits intact: the reclaim the killed leader made this hour is in the ledger, so the
    # successor warns the next idle pod but holds its reclaim back (maxPerHour 1).
    ledger = box.api().get("/api/v1/namespaces/gpusteward/configmaps/"
                           "gpusteward-reclaimer-reclaims")["data"]
    assert "/idle" in json.dumps(ledger), ledger
    ns.create_pod(gpu_pod("idle-too", 1, node="l4-0", util="0", tolerate="nvidia.com/gpu"))
    ns.running("idle-too")
    wait_for("the successor to hold a reclaim back", lambda: sum(_metric(
        box, "reclaimer", RECLAIMER_METRICS, "gpusteward_reclaimer_held_back_total")) > 0,
        timeout=90)
    assert RECLAIM_AT in annotations(ns, "idle-too")
    leader_log = box.api().get_text("/api/v1/namespaces/gpusteward/pods/"
                                    f"{successor.rsplit('-', 1)[0]}/log")
    assert f"held-back pod={ns.name}/idle-too" in leader_log
    assert "limit: 1 per hour" in leader_log
    time.sleep(6)  # past the 4 s grace, two more cycles: still held, never evicted
    assert not gone(ns, "idle-too")
    assert "GPUReclaimed" not in reasons(ns, "idle-too")


def _rolled_out(box: Sandbox, component: str) -> dict[str, str] | None:
    """Pod name -> its policy checksum, once ``component``'s Deployment has rolled out: every
    replica updated and Ready, and no pod of an older ReplicaSet left."""
    deployment = box.api().get(f"{APPS}/deployments/gpusteward-{component}")
    status, want = deployment["status"], deployment["spec"]["replicas"]
    if (status.get("observedGeneration") != deployment["metadata"]["generation"]
            or status.get("updatedReplicas") != want or status.get("readyReplicas") != want):
        return None
    pods = [p for p in _pods(box, component) if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != want or not all(_ready(p) for p in pods):
        return None
    return {p["metadata"]["name"]: p["metadata"]["annotations"]["checksum/policy"] for p in pods}


def _policy_mode(box: Sandbox) -> str:
    text = box.api().get("/api/v1/namespaces/gpusteward/configmaps/gpusteward-policy")[
        "data"]["policy.yaml"]
    return str(yaml.safe_load(text)["reclaim"]["mode"])


def test_helm_upgrade_rolls_a_policy_change_out_and_rollback_returns(
        box: Sandbox, installed: chart.Helm) -> None:
    # The pod template carries the policy's checksum (templates/_helpers.tpl,
    # gpusteward.podMetadata): a policy change alone rolls both Deployments.
    before = {c: wait_for(f"{c} rolled out", lambda c=c: _rolled_out(box, c), timeout=90)
              for c in ("extender", "reclaimer")}
    assert _policy_mode(box) == "enforce"
    policy = yaml.safe_load(SANDBOX_POLICY.read_text())
    policy["reclaim"]["mode"] = "warn"
    warn = chart.write_values(box, {**chart.sandbox_values(box), "policy": yaml.safe_dump(policy)},
                              "warn.yaml")
    installed.upgrade(warn)
    assert _policy_mode(box) == "warn"
    after = {c: wait_for(f"{c} rolled out again", lambda c=c: _rolled_out(box, c), timeout=120)
             for c in ("extender", "reclaimer")}
    for component in ("extender", "reclaimer"):
        assert not set(after[component]) & set(before[component]), "every pod replaced"
        assert set(after[component].values()) != set(before[component].values())
    installed.run("rollback", chart.RELEASE, "1", "--wait", "--timeout=4m")
    assert _policy_mode(box) == "enforce"
    back = {c: wait_for(f"{c} rolled back", lambda c=c: _rolled_out(box, c), timeout=120)
            for c in ("extender", "reclaimer")}
    for component in ("extender", "reclaimer"):
        assert set(back[component].values()) == set(before[component].values())
    history = json.loads(installed.run("history", chart.RELEASE, "--output=json").stdout)
    assert [h["status"] for h in history][-1] == "deployed" and len(history) == 3


#: kube-scheduler's line when it places a pod without an ignorable extender that failed
#: (pkg/scheduler/schedule_one.go, findNodesThatPassExtenders, v1.36.3).
SKIPPED_EXTENDER = "Skipping extender as it returned error and has ignorable flag set"


def test_no_gpu_pod_is_placed_without_the_extender_while_it_rolls_out(
        box: Sandbox, installed: chart.Helm, values: Path, ns: Namespace) -> None:
    # The chart's extender entry is ignorable: a call that fails places its pod without the
    # card filter. A rollout must not fail one: a new replica is Ready before an old one
    # goes (the Deployment's default maxUnavailable 0 of 2), and the old one drains for
    # --shutdown-delay (docs/operations.md, "Several extender replicas"). Pods go to the
    # sandbox's scheduler through the Service while every extender pod is replaced; a probe
    # asks for a card no node has, so only the extender's filter keeps it pending.
    chart.use_chart_extender(box)
    log = box.dir / "logs" / "scheduler.log"
    offset = log.stat().st_size
    old = {p["metadata"]["name"] for p in _pods(box, "extender")}
    failed: list[BaseException] = []

    def roll() -> None:
        try:
            installed.upgrade(values,
                              f"--set-string=extender.podAnnotations.rolled={time.time_ns()}")
        except BaseException as e:  # reported after the join
            failed.append(e)

    rollout = threading.Thread(target=roll)
    rollout.start()
    deadline = time.monotonic() + 300
    placed = after = 0
    while after < 3 and not failed:  # until every old replica has gone, then three more
        assert time.monotonic() < deadline, "the rollout did not finish"
        ns.create_pod(gpu_pod("probe", 1, cards="NVIDIA-H100-80GB-HBM3",
                              tolerate="nvidia.com/gpu"))
        ns.create_pod(gpu_pod("fit", 1, cards="NVIDIA-L4", tolerate="nvidia.com/gpu"))
        assert ns.node_of("fit", timeout=30).startswith("l4-")
        # the probe, queued first, was filtered out by the extender, not placed without it
        said = wait_for("the probe refused", lambda: next(
            (c for c in ns.pod("probe")["status"].get("conditions") or ()
             if c["type"] == "PodScheduled" and c["status"] == "False"), None), timeout=30)
        assert "not accepted" in said.get("message", ""), said
        assert not ns.pod("probe")["spec"].get("nodeName")
        for name in ("probe", "fit"):
            ns.api.delete(ns.path("pods", name), {"gracePeriodSeconds": 0})
        wait_for("both pods gone", lambda: not ns.pods(), timeout=30)
        placed += 1
        left = old & {p["metadata"]["name"] for p in _pods(box, "extender")}
        after += not rollout.is_alive() and not left
    rollout.join()
    assert not failed, failed
    assert not old & {p["metadata"]["name"] for p in _pods(box, "extender")}, "all replaced"
    with log.open(errors="replace") as f:
        f.seek(offset)
        assert SKIPPED_EXTENDER not in f.read()
    assert placed >= 5, placed


def test_helm_uninstall_leaves_only_the_lease_ledgers_and_events(
        box: Sandbox, installed: chart.Helm) -> None:
    installed.run("uninstall", chart.RELEASE, "--wait", "--timeout=3m")
    api = box.api()
    left: dict[str, list[str]] = {}
    for path in ("/api/v1/namespaces/gpusteward/configmaps",
                 "/api/v1/namespaces/gpusteward/services",
                 "/api/v1/namespaces/gpusteward/serviceaccounts",
                 "/api/v1/namespaces/gpusteward/secrets",
                 "/api/v1/namespaces/gpusteward/pods",
                 f"{APPS}/deployments", f"{APPS}/daemonsets",
                 "/apis/policy/v1/namespaces/gpusteward/poddisruptionbudgets",
                 "/apis/networking.k8s.io/v1/namespaces/gpusteward/networkpolicies",
                 LEASES,
                 f"{chart.RBAC}/namespaces/gpusteward/roles",
                 f"{chart.RBAC}/namespaces/gpusteward/rolebindings",
                 f"{chart.RBAC}/clusterroles?labelSelector=app.kubernetes.io%2Fname%3Dgpusteward",
                 f"{chart.RBAC}/clusterrolebindings"
                 "?labelSelector=app.kubernetes.io%2Fname%3Dgpusteward"):
        names = [o["metadata"]["name"] for o in api.get(path)["items"]]
        if names:
            left[path.split("?")[0].rsplit("/", 1)[1]] = sorted(names)
    # pods go with their Deployments' garbage collection, a moment after helm returns
    if "pods" in left:
        wait_for("the pods to go", lambda: not api.get(
            "/api/v1/namespaces/gpusteward/pods")["items"], timeout=60)
        del left["pods"]
    assert left.pop("serviceaccounts") == ["default"]
    assert set(left.pop("configmaps")) - {"kube-root-ca.crt"} <= LEFT_BEHIND
    # the second scheduler's leader-election Lease stays too (docs/install.md, "Uninstall")
    assert left == {"leases": ["gpusteward-reclaimer", "gpusteward-scheduler"]}, left


# --- bad input at install (after the uninstall above: a fresh release each) ----------------
def test_a_values_file_the_schema_refuses_is_refused_by_name_and_creates_nothing(
        box: Sandbox, helm: chart.Helm) -> None:
    bad = chart.write_values(box, {**chart.sandbox_values(box), "extender": {"replicas": "two"}},
                             "bad-values.yaml")
    done = helm.install(bad, check=False)
    assert done.returncode != 0
    assert "at '/extender/replicas': got string, want integer" in done.stderr, done.stderr
    assert not box.api().get("/api/v1/namespaces/gpusteward/secrets?labelSelector=owner%3Dhelm")[
        "items"], "no release recorded"


def test_a_policy_that_fails_validation_exits_2_naming_every_problem(
        box: Sandbox, helm: chart.Helm) -> None:
    # --set-file policy=FILE passes text, which only gpusteward checks (docs/install.md, "Helm")
    text = "reclaim:\n  mode: sometimes\n  idle: {thresholdPercent: 150}\n"
    values = chart.write_values(box, {**chart.sandbox_values(box), "policy": text,
                                      "tests": {"enabled": False}}, "bad-policy.yaml")
    helm.run("install", chart.RELEASE, str(chart.CHART), f"--values={values}",
             "--create-namespace")  # no --wait: its pods never turn Ready
    try:
        for component in ("extender", "reclaimer"):
            terminated = wait_for(f"the {component} pods to exit", lambda c=component: next(
                (t for p in _pods(box, c) for s in p["status"].get("containerStatuses", [])
                 if (t := s.get("lastState", {}).get("terminated")
                     or s.get("state", {}).get("terminated"))), None), timeout=90)
            assert terminated["exitCode"] == 2, terminated
            message = terminated.get("message", "")
            assert "reclaim.mode: expected one of observe, warn, enforce" in message, message
            assert "reclaim.idle.thresholdPercent" in message, message
            assert "Traceback" not in message
            wait_for(f"the {component} pods in CrashLoopBackOff", lambda c=component: all(
                s.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
                for p in _pods(box, c) for s in p["status"].get("containerStatuses", [])),
                timeout=60)
        assert not any(_ready(p) for p in _pods(box, "extender")), "its readiness never passes"
    finally:
        helm.run("uninstall", chart.RELEASE, "--wait", "--timeout=3m")


def test_without_prometheus_the_extender_is_ready_and_neutral_and_the_reclaimer_waits(
        box: Sandbox, helm: chart.Helm, ns: Namespace) -> None:
    # docs/operations.md, "Extender failure modes": Ready (readiness needs only the API
    # server's lists), readings stale, scores neutral; the reclaimer marks nothing.
    first = box.real_nodes[NODE].slot
    values = chart.write_values(box, {**chart.sandbox_values(box), "tests": {"enabled": False},
                                      "prometheusUrl": f"http://{first.host_ip}:1"},
                                "no-prometheus.yaml")
    helm.install(values)  # --wait: every pod Ready
    try:
        wait_for("the extender to count failed refreshes", lambda: min(_metric(
            box, "extender", EXTENDER_METRICS, "gpusteward_telemetry_refresh_errors_total"))
            > 0, timeout=30)
        nodes = len(box.api().get("/api/v1/nodes")["items"])  # docs: "reaches the node count"
        assert _metric(box, "extender", EXTENDER_METRICS,
                       "gpusteward_telemetry_stale_nodes") == [nodes, nodes]
        ns.create_pod(gpu_pod("idle", 1, node="l4-2", util="0", tolerate="nvidia.com/gpu"))
        ns.running("idle")
        wait_for("the leader to report no telemetry", lambda: 0.0 in _metric(
            box, "reclaimer", RECLAIMER_METRICS, "gpusteward_reclaimer_telemetry_ok"), timeout=30)
        assert IDLE_SINCE not in annotations(ns, "idle")
        assert not [r for r in reasons(ns, "idle") if r.startswith("GPU")]
    finally:
        helm.run("uninstall", chart.RELEASE, "--wait", "--timeout=3m")
