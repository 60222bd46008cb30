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
