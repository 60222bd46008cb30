"""The sandbox's GPU scrape, shaped like a Prometheus Operator ServiceMonitor's.

The Operator turns a ServiceMonitor endpoint into one scrape target per endpoint address (one
exporter pod per GPU node) and relabels each with ``namespace`` (``__meta_kubernetes_namespace``),
``service`` (``__meta_kubernetes_service_name``), ``pod`` (``__meta_kubernetes_pod_name``),
``container`` (``__meta_kubernetes_pod_container_name``), ``endpoint`` (the port name) and
``job`` (the service name, unless ``jobLabel``); ``instance`` is the address. ``honor_labels``
comes from the endpoint's ``honorLabels``: false in dcgm-exporter's Helm chart, true in our agent's
ServiceMonitor (deploy/kustomize/monitoring/servicemonitors.yaml).

The sandbox has no pod network, so each target carries those labels statically, with the names a
chart install would give (dcgm-exporter's chart: container ``exporter``, port ``metrics``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Exporter:
    """The DaemonSet whose pods Prometheus scrapes, one per GPU node."""

    namespace: str
    service: str
    container: str
    endpoint: str
    revision: str = ""  # another revision: the DaemonSet's pods after a rolling upgrade

    def pod(self, node: str) -> str:
        """A DaemonSet pod name: the set's name and a 5-character suffix, stable per node (and
        revision)."""
        return f"{self.service}-{hashlib.sha256((node + self.revision).encode()).hexdigest()[:5]}"

    def target_labels(self, node: str) -> dict[str, str]:
        return {"namespace": self.namespace, "service": self.service, "pod": self.pod(node),
                "container": self.container, "endpoint": self.endpoint, "job": self.service}


DCGM_EXPORTER = Exporter("gpu-operator", "dcgm-exporter", "exporter", "metrics")
AGENT = Exporter("gpusteward", "gpusteward-agent", "agent", "metrics")


def simulator_path(node: str) -> str:
    """The simulator's endpoint for one node's exporter."""
    return f"/nodes/{node}/metrics"


def hami_monitor_path(node: str) -> str:
    """The simulator's endpoint for one HAMi node's vGPU monitor."""
    return f"/nodes/{node}/hami/metrics"


def scrape_config(exporter: Exporter, targets: dict[str, tuple[str, str]],
                  honor_labels: bool) -> dict[str, Any]:
    """One job over ``targets`` (node -> (host:port, metrics path))."""
    return {
        "job_name": f"serviceMonitor/{exporter.namespace}/{exporter.service}/0",
        "honor_labels": honor_labels,
        "static_configs": [
            {"targets": [address], "labels": {"__metrics_path__": path,
                                              **exporter.target_labels(node)}}
            for node, (address, path) in sorted(targets.items())
        ],
    }


@dataclass(frozen=True)
class KubernetesSD:
    """How Prometheus reaches the API server for service discovery."""

    api_server: str
    ca_file: str
    token_file: str


def _label_name(label: str) -> str:
    """A Kubernetes label as Prometheus's ``__meta_kubernetes_service_label_*`` spells it."""
    return "".join(c if c.isalnum() else "_" for c in label)


def service_monitor_jobs(monitor: dict[str, Any], sd: KubernetesSD) -> list[dict[str, Any]]:
    """The scrape jobs the Prometheus Operator generates for one ServiceMonitor, one per
    endpoint (prometheus-operator pkg/prometheus/promcfg.go, generateServiceMonitorConfig, with
    serviceDiscoveryRole EndpointSlice): EndpointSlice discovery in the monitor's namespace,
    kept when the Service carries every ``selector.matchLabels`` label and the port's name
    matches, and relabelled with namespace, service, pod, container, job and endpoint."""
    meta, spec = monitor["metadata"], monitor["spec"]
    keep_service = [
        {"action": "keep", "regex": f"({value});true", "source_labels": [
            f"__meta_kubernetes_service_label_{_label_name(key)}",
            f"__meta_kubernetes_service_labelpresent_{_label_name(key)}"]}
        for key, value in sorted(spec["selector"].get("matchLabels", {}).items())]
    jobs = []
    for index, endpoint in enumerate(spec["endpoints"]):
        port = endpoint["port"]
        jobs.append({
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            **({"scrape_interval": endpoint["interval"]} if "interval" in endpoint else {}),
            "kubernetes_sd_configs": [{
                "role": "endpointslice", "api_server": sd.api_server,
                "namespaces": {"names": [meta["namespace"]]},
                "tls_config": {"ca_file": sd.ca_file},
                "authorization": {"credentials_file": sd.token_file}}],
            "relabel_configs": [
                *keep_service,
                {"action": "keep", "regex": port,
                 "source_labels": ["__meta_kubernetes_endpointslice_port_name"]},
                {"source_labels": ["__meta_kubernetes_endpointslice_address_target_kind",
                                   "__meta_kubernetes_endpointslice_address_target_name"],
                 "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}",
                 "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"],
                 "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
                 "replacement": "${1}"},
                {"target_label": "endpoint", "replacement": port},
            ]})
    return jobs
