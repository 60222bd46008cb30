"""kube-state-metrics stand-in: the pod series a what-if replay reads, for the sandbox's pods.

kube-state-metrics is not served as a Go module here, so this serves, from a LIST of the
sandbox's pods at each scrape, exactly the series ``gpusteward whatif`` reads, with the names,
labels, types and values kube-state-metrics documents (``docs/metrics/workload/pod-metrics.md``)
and generates (``internal/store/pod.go``):

* ``kube_pod_info`` (gauge, 1): ``namespace, pod, uid, host_ip, pod_ip, node, created_by_kind,
  created_by_name, priority_class, host_network``; ``created_by_*`` from the controller owner
  reference, ``<none>`` without one.
* ``kube_pod_container_resource_requests`` (gauge): per container and requested resource,
  labels ``namespace, pod, uid, container, node, resource, unit``; the resource name sanitized
  as a label name (``nvidia.com/gpu`` -> ``nvidia_com_gpu``), unit ``core`` for cpu (value in
  cores), ``byte`` for memory, ``integer`` for extended resources.
* ``kube_pod_owner`` (gauge, 1): ``owner_kind, owner_name, owner_is_controller`` per owner
  reference; one series of ``<none>`` for a pod without any.
* ``kube_pod_status_phase`` (gauge): one series per phase (Pending, Succeeded, Failed, Unknown,
  Running), 1 for the pod's phase, 0 for the others.
* ``kube_pod_labels`` (gauge, 1): ``label_<sanitized key>`` for the labels on the allow-list
  (``--metric-labels-allowlist=pods=[...]``); none by default.
* ``kube_pod_created`` (gauge): the creation time in Unix seconds.
* ``kube_pod_start_time`` (gauge): ``status.startTime`` in Unix seconds, once the kubelet has
  taken the pod.

Every series starts with ``namespace, pod, uid`` (the pod store's common labels). The sandbox's
Prometheus scrapes it with ``honor_labels: true``, as kube-prometheus's kube-state-metrics
ServiceMonitor does (``honorLabels: true``), so ``namespace`` and ``pod`` stay the subject pod's.

    python -m gpusteward.sandbox.ksm --kubeconfig FILE --listen 127.0.0.1:8080 \\
        --metric-labels-allowlist 'pods=[gpusteward.io/team]'
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web

from gpusteward.adapters.addresses import parse_hostport
from gpusteward.adapters.kube import connect, list_raw
from gpusteward.core.dcgm import Family, Sample, render_text

PHASES = ("Pending", "Succeeded", "Failed", "Unknown", "Running")  # pod.go's order
JOB = "kube-state-metrics"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """A Kubernetes name as a Prometheus label name: every other character becomes ``_``."""
    return _INVALID.sub("_", name)


def parse_allowlist(text: str) -> tuple[str, ...]:
    """``pods=[a,b]`` (kube-state-metrics' --metric-labels-allowlist) -> the pod label keys."""
    match = re.fullmatch(r"\s*pods=\[([^\]]*)\]\s*", text or "")
    if not match:
        return ()
    return tuple(k.strip() for k in match.group(1).split(",") if k.strip())


def _quantity(text: Any) -> float:
    """A resource quantity's value (the units kube-state-metrics prints: cores, bytes, count)."""
    s = str(text)
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20,
                "Gi": 2**30, "Ti": 2**40}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * suffixes[suffix]
    return float(s)


def _unit(resource: str) -> str:
    if resource == "cpu":
        return "core"
    if resource in ("memory", "storage", "ephemeral-storage") or resource.startswith(
            ("hugepages-", "attachable-volumes-")):
        return "byte"
    return "integer"


def _value(v: float) -> str:
    return f"{v:g}" if v != int(v) or abs(v) >= 1e15 else str(int(v))


def pod_families(pods: Iterable[Mapping[str, Any]],
                 allowed_labels: Iterable[str] = ()) -> list[Family]:
    allowed = set(allowed_labels)
    info, requests, owners, phases, labels = [], [], [], [], []
    created: list[Sample] = []
    started: list[Sample] = []
    for p in pods:
        meta, spec, status = p.get("metadata", {}), p.get("spec", {}), p.get("status", {})
        base = (("namespace", meta.get("namespace", "")), ("pod", meta.get("name", "")),
                ("uid", meta.get("uid", "")))
        refs = meta.get("ownerReferences") or []
        ctrl = next((r for r in refs if r.get("controller")), None)
        node = spec.get("nodeName", "")
        info.append(Sample(base + (
            ("host_ip", status.get("hostIP", "")), ("pod_ip", status.get("podIP", "")),
            ("node", node), ("created_by_kind", ctrl["kind"] if ctrl else "<none>"),
            ("created_by_name", ctrl["name"] if ctrl else "<none>"),
            ("priority_class", spec.get("priorityClassName", "")),
            ("host_network", "true" if spec.get("hostNetwork") else "false")), "1"))
        for c in spec.get("containers", []):
            for resource, amount in ((c.get("resources") or {}).get("requests") or {}).items():
                requests.append(Sample(base + (
                    ("container", c.get("name", "")), ("node", node),
                    ("resource", sanitize(resource)), ("unit", _unit(resource))),
                    _value(_quantity(amount))))
        for r in refs or [None]:
            owner = (("<none>",) * 3 if r is None else
                     (r["kind"], r["name"], "true" if r.get("controller") else "false"))
            owners.append(Sample(base + tuple(zip(
                ("owner_kind", "owner_name", "owner_is_controller"), owner, strict=True)), "1"))
        phase = status.get("phase", "")
        phases += [Sample(base + (("phase", ph),), "1" if ph == phase else "0") for ph in PHASES]
        kept = sorted((f"label_{sanitize(k)}", v) for k, v in (meta.get("labels") or {}).items()
                      if k in allowed)
        labels.append(Sample(base + tuple(kept), "1"))
        for when, into in ((meta.get("creationTimestamp"), created),
                           (status.get("startTime"), started)):
            if when:
                at = datetime.fromisoformat(when.replace("Z", "+00:00"))
                into.append(Sample(base, _value(at.timestamp())))
    return [
        Family("kube_pod_info", "Information about pod.", tuple(info)),
        Family("kube_pod_container_resource_requests",
               "The number of requested request resource by a container.", tuple(requests)),
        Family("kube_pod_owner", "Information about the Pod's owner.", tuple(owners)),
        Family("kube_pod_status_phase", "The pods current phase.", tuple(phases)),
        Family("kube_pod_labels", "Kubernetes labels converted to Prometheus labels.",
               tuple(labels)),
        Family("kube_pod_created", "Unix creation timestamp", tuple(created)),
        Family("kube_pod_start_time", "Start time in unix timestamp for a pod.", tuple(started)),
    ]


def scrape_job(address: str) -> dict[str, Any]:
    """Prometheus's job for the stand-in, as kube-prometheus's kube-state-metrics
    ServiceMonitor makes it (``honorLabels: true``)."""
    return {"job_name": f"serviceMonitor/kube-system/{JOB}/0", "honor_labels": True,
            "static_configs": [{"targets": [address], "labels": {"job": JOB}}]}


def create_app(list_pods: Callable[[], Any], allowed_labels: Iterable[str]) -> web.Application:
    allowed = tuple(allowed_labels)

    async def metrics(request: web.Request) -> web.Response:
        text = render_text(pod_families(await list_pods(), allowed))
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", health)])
    return app


async def _main(args: argparse.Namespace) -> None:
    api = await connect(args.kubeconfig)

    async def list_pods() -> list[Any]:
        items, _ = await list_raw(api, "/api/v1/pods")
        return [msgspec.json.decode(i) for i in items]

    host, port = parse_hostport(args.listen)
    runner = web.AppRunner(create_app(list_pods, parse_allowlist(args.metric_labels_allowlist)),
                           access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", default="127.0.0.1:8080")
    parser.add_argument("--metric-labels-allowlist", default="",
                        help="pods=[label,...]: the pod labels kube_pod_labels carries")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
