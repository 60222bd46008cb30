"""Helpers for e2e tests: GPU pod manifests, waiting on the real API server, stepping a
reclaimer."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpusteward.core.attribution import claimed_pod
from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.sandbox.kubehttp import KubeHTTP, KubeHTTPError, wait_for
from gpusteward.sandbox.simulator import UTIL_ANNOTATION


def gpu_pod(name: str, gpus: int = 1, *, cards: str | None = None, cls: str | None = None,
            util: str | None = None, node: str | None = None,
            labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            priority_class: str | None = None, resource: str = "nvidia.com/gpu",
            tolerate: str | None = None) -> dict[str, Any]:
    meta_labels = dict(labels or {})
    meta_annotations = dict(annotations or {})
    if cls:
        meta_labels["gpusteward.io/class"] = cls
    if cards:
        meta_annotations["gpusteward.io/card-types"] = cards
    if util is not None:
        meta_annotations[UTIL_ANNOTATION] = util
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/cuda-job:1",
                        "resources": {"limits": {resource: str(gpus)}}}],
        "terminationGracePeriodSeconds": 1,
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if tolerate:
        spec["tolerations"] = [{"key": tolerate, "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": meta_labels, "annotations": meta_annotations},
            "spec": spec}


class Namespace:
    def __init__(self, api: KubeHTTP, name: str):
        self.api = api
        self.name = name

    def create(self) -> None:
        self.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": self.name}})

    def delete(self) -> None:
        """Workloads first (or their controllers make new pods), then pods, then the namespace."""
        for group, kind in (("apps/v1", "deployments"), ("apps/v1", "statefulsets"),
                            ("apps/v1", "replicasets"), ("batch/v1", "jobs")):
            self.api.delete(f"/apis/{group}/namespaces/{self.name}/{kind}",
                            {"propagationPolicy": "Background"})
        # Pending pods first, while the others still hold their GPUs: a pending pod that
        # kube-scheduler places in the room this teardown frees, just as the pod is deleted,
        # stays assumed in its cache at a gang's Permit ("Failed to update the nominated node
        # name in the binding cycle": not found) and keeps a GPU from the next test.
        unbound = self.path() + "?fieldSelector=" + urllib.parse.quote("spec.nodeName=")
        self.api.delete(unbound)
        wait_for(f"pending pods in {self.name} to go away",
                 lambda: not self.api.get(unbound)["items"], timeout=60)
        self.api.delete(f"/api/v1/namespaces/{self.name}/pods")
        wait_for(f"pods in {self.name} to go away", lambda: not self.pods(), timeout=60)
        self.api.delete(f"/api/v1/namespaces/{self.name}")

    def path(self, kind: str = "pods", name: str = "") -> str:
        base = f"/api/v1/namespaces/{self.name}/{kind}"
        return f"{base}/{name}" if name else base

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.api.create(self.path(), manifest)

    def pod(self, name: str) -> dict[str, Any]:
        return self.api.get(self.path("pods", name))

    def pods(self) -> list[dict[str, Any]]:
        return self.api.get(self.path())["items"]

    def node_of(self, name: str, timeout: float = 60) -> str:
        try:
            return wait_for(f"pod {self.name}/{name} to be scheduled",
                            lambda: self.pod(name)["spec"].get("nodeName"), timeout=timeout)
        except TimeoutError as e:
            raise TimeoutError(f"{e}; {self.scheduling(name)}") from None

    def scheduling(self, name: str) -> str:
        """What the scheduler last said of a pending pod, and the namespace's Events."""
        status = self.pod(name)["status"]
        said = [f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                for c in status.get("conditions") or ()]
        seen = [f"{e['involvedObject']['name']} {e['reason']}: {e.get('message', '')}"
                for e in self.api.get(self.path("events"))["items"]]
        return (f"nominatedNodeName={status.get('nominatedNodeName')!r}, conditions {said}, "
                f"events {seen[-12:]}")

    def running(self, name: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(f"pod {self.name}/{name} to run",
                        lambda: (p := self.pod(name))["status"].get("phase") == "Running" and p,
                        timeout=timeout)


def apply_priority_classes(api: KubeHTTP, values: dict[str, int]) -> None:
    for name, value in values.items():
        api.apply(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value})


def promql(prometheus_url: str, query: str) -> list[dict[str, Any]]:
    """An instant query's result vector."""
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return list(json.load(resp)["data"]["result"])


def wait_for_gpu_samples(prometheus_url: str, namespace: str, pods: list[str],
                         settle: float = 4.0, metric: str = "DCGM_FI_DEV_GPU_UTIL") -> None:
    """Until Prometheus holds utilization samples for these pods; then let the extender refresh.

    The default settle outlasts the sandbox policy's podWarmup (3 s), so the extender judges the
    pods by what they read rather than as just-started. ``metric``: MIG instances have no
    DCGM_FI_DEV_GPU_UTIL, only DCGM_FI_PROF_GR_ENGINE_ACTIVE."""

    def present() -> bool:
        sampled = pods_sampled(prometheus_url, namespace, metric)
        return {f"{namespace}/{p}" for p in pods} <= set(sampled)

    wait_for(f"GPU samples for {pods}", present, timeout=60)
    time.sleep(settle)


def pods_sampled(prometheus_url: str, namespace: str,
                 metric: str = "DCGM_FI_DEV_GPU_UTIL") -> dict[str, str]:
    """``namespace/pod`` -> its node, for the pods of ``namespace`` holding sampled GPUs, in
    either label mode of the scrape (``exported_*`` under honor_labels false)."""
    query = (f'{metric}{{exported_namespace="{namespace}"}} or '
             f'{metric}{{namespace="{namespace}"}}')
    return {pod: r["metric"].get("Hostname", "") for r in promql(prometheus_url, query)
            if (pod := claimed_pod(r["metric"])) is not None}


async def cycle_until(rec: Reclaimer, what: str, check, timeout: float = 75.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.wait_for(rec.cycle(), 60)
        if check():
            return
        await asyncio.sleep(1.0)
    raise TimeoutError(f"reclaimer never reached: {what}")


async def cycle_for(rec: Reclaimer, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.wait_for(rec.cycle(), 60)
        await asyncio.sleep(1.0)


def annotations(ns, name: str) -> dict:
    return ns.pod(name)["metadata"].get("annotations") or {}


def gone(ns, name: str) -> bool:
    try:
        return "deletionTimestamp" in ns.pod(name)["metadata"]
    except KubeHTTPError as e:
        return e.status == 404


def stdout_document(log: str) -> Any:
    """The JSON document (indented, as gpusteward writes it) in a container's log. The log
    holds stderr's lines too (progress, log records); containerd copies each stream a line at
    a time from a reader of its own (1.6: pkg/cri/io/logger.go), so under load they may come
    before, after or inside the document. Its own lines are "{", "}" and indented ones."""
    return json.loads("".join(line for line in log.splitlines(keepends=True)
                              if line.rstrip("\n") in ("{", "}") or line.startswith(" ")))


def events(ns, name: str) -> list[tuple[str, str]]:
    """(reason, message) of every Event about ``name``, oldest first. A list comes in name
    order (random suffixes); the sandbox's etcd gives each create a higher revision, which is
    the only order finer than the Events' whole-second timestamps."""
    items = ns.api.get(f"/api/v1/namespaces/{ns.name}/events")["items"]
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e.get("message", "")) for e in items
            if e["involvedObject"]["name"] == name]


def reasons(ns, name: str) -> list[str]:
    return [reason for reason, _ in events(ns, name)]


# Where the in-process reclaimers (tests/support/sandbox.py) keep their Lease and the records
# beside it, the stop record restore trusts among them.
RECLAIMER_NAMESPACE = "kube-system"


def stop_entries(ns: Namespace) -> list[dict[str, Any]]:
    """The stop record's entries for ``ns``'s workloads (reclaimer/stops.py)."""
    try:
        cm = ns.api.get(f"/api/v1/namespaces/{RECLAIMER_NAMESPACE}/configmaps/"
                        "gpusteward-reclaimer-stops")
    except KubeHTTPError as e:
        if e.status == 404:
            return []
        raise
    return [e for e in json.loads(cm.get("data", {}).get("stops") or "[]")
            if e["namespace"] == ns.name]


def restore(kubeconfig: Path, *args: str, policy: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    """`gpusteward reclaimer [--policy] restore ARGS` against a sandbox, reading the stop
    record the sandbox's reclaimers keep."""
    flags = [f"--policy={policy}"] if policy else []
    return subprocess.run([sys.executable, "-m", "gpusteward", "reclaimer", *flags, "restore",
                           *args, f"--kubeconfig={kubeconfig}",
                           f"--lease-namespace={RECLAIMER_NAMESPACE}"],
                          capture_output=True, text=True, timeout=60)


def placed_then_restored(ns: Namespace, kubeconfig: Path, kind: str, name: str,
                         running: Callable[[], int], want: int) -> None:
    """After an owner was stopped: the pod "waiting" runs on its freed GPUs (placed by the real
    scheduler), `restore --list` lists the owner as stopped, and once "waiting" is gone
    `restore` brings the owner's ``want`` pods back (``running`` counts them)."""
    ns.running("waiting", timeout=120)
    listed = restore(kubeconfig, "--list")
    assert re.search(rf"{kind}\s+{ns.name}/{name}\s+stopped\s", listed.stdout), listed.stdout
    ns.api.delete(ns.path("pods", "waiting"))
    out = restore(kubeconfig, f"{ns.name}/{kind}/{name}")
    assert out.returncode == 0, out.stderr
    wait_for(f"the {kind}'s controllers to bring its pods back", lambda: running() == want,
             timeout=120)


async def left_running(rec: Reclaimer, stopped: Callable[[], bool],
                       pods: Callable[[], list[dict[str, Any]]], want: int) -> None:
    """A busy owner over twice the idle window (an idle one is stopped by then): never
    ``stopped()``, none of its ``want`` pods marked idle."""
    await cycle_for(rec, 30)
    assert not stopped()
    assert all(IDLE_SINCE not in (p["metadata"].get("annotations") or {}) for p in pods())
    assert len(pods()) == want


def set_util(ns: Namespace, pods: list[str], util: str) -> None:
    """What the DCGM simulator reports for these pods' GPUs from its next scrape on."""
    for p in pods:
        ns.api.merge_patch(ns.path("pods", p), {"metadata": {"annotations": {
            UTIL_ANNOTATION: util}}})


async def partly_idle_only_marked(rec: Reclaimer, ns: Namespace, stopped: Callable[[], bool],
                                  pods: Callable[[], list[dict[str, Any]]]) -> None:
    """An idle owner one of whose pods turns busy: the others are warned, and well past the
    grace the owner is still not ``stopped()`` and keeps every pod."""
    busy, *idle = sorted(p["metadata"]["name"] for p in pods())
    set_util(ns, [busy], "75")
    await cycle_until(rec, "the idle pods warned", lambda: all(
        RECLAIM_AT in annotations(ns, p) for p in idle))
    await cycle_for(rec, 8)  # well past the 4 s grace
    assert not stopped()
    assert RECLAIM_AT not in annotations(ns, busy)
    assert sorted(p["metadata"]["name"] for p in pods()) == sorted([busy, *idle])


def spec_suspend(ns: Namespace, path: str) -> bool:
    """Whether the owner at path has its spec.suspend set."""
    return bool(ns.api.get(path)["spec"].get("suspend"))


BUSY_OR_PARTLY = pytest.mark.parametrize("busy", [True, False],
                                         ids=["busy-left-running", "partly-idle-only-marked"])


async def kept_unless_wholly_idle(rec: Reclaimer, ns: Namespace, busy: bool,
                                  stopped: Callable[[], bool],
                                  pods: Callable[[], list[dict[str, Any]]]) -> None:
    """A busy owner (left_running) or an idle one with one pod turned busy
    (partly_idle_only_marked): either way never stopped."""
    if busy:
        await left_running(rec, stopped, pods, len(pods()))
    else:
        await partly_idle_only_marked(rec, ns, stopped, pods)


def managers(obj: dict[str, Any], field: str) -> set[str]:
    """The field managers that own ``field`` (a managedFields key such as ``f:suspend``)."""
    return {m["manager"] for m in obj["metadata"].get("managedFields") or ()
            if field in str(m.get("fieldsV1", {}))}
