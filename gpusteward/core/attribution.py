"""Which pod holds a GPU, and which node a series is from: the one rule every reader applies.

A DCGM series names the pod holding its GPU with dcgm-exporter's own ``namespace``/``pod``
attributes (``DCGMX: internal/pkg/transformation/kubernetes.go``, only on GPUs mapped to a pod).
Prometheus then adds the scrape target's labels. Under a Prometheus Operator ServiceMonitor these
are ``namespace``, ``service``, ``pod``, ``container``, ``endpoint``, ``job`` and ``instance`` of
the *exporter's* pod (the Operator's generated relabelings from
``__meta_kubernetes_namespace``, ``__meta_kubernetes_service_name``,
``__meta_kubernetes_pod_name``, ``__meta_kubernetes_pod_container_name``, the endpoint port).
Where both name a label:

* ``honorLabels: false`` (dcgm-exporter's chart default): the target's labels win and the
  exporter's become ``exported_namespace``/``exported_pod``/``exported_container``; ``pod`` is
  the exporter's own pod on every series.
* ``honorLabels: true``: the exporter's labels win where present, but a GPU no pod holds carries
  none, so Prometheus fills in the exporter's (or our agent's) own ``pod`` there.

So the workload labels (``exported_*`` when present) win over ``pod``, and a ``pod`` label is
believed only for a pod the API server shows holding GPUs on that node: the exporter's and the
agent's own pods hold none, and a GPU they are named on stays free. ``telemetry.honorLabels``
forces a mode where auto-detection cannot decide: ``false`` never reads ``pod`` as a workload
(every series carries the target's), ``true`` never reads ``exported_*``.

Per-pod series (dcgm-exporter's ``--kubernetes-virtual-gpus`` copies, labelled ``vgpu``, the
agent's ``gpusteward_pod_gpu_util`` and HAMi's per-container utilization) share their GPU's
(node, GPU) key with the device series: node load is read from the device series alone, a pod's
own use from its per-pod series.

A GPU HAMi slices (core/hami.py) is named by no exporter's pod mapping (its kubelet device ids
are ``<UUID>-<n>``), so its device series is attributed by UUID from the pods' HAMi
annotations -- but only to a pod alone on it: with several, the device's reading is their sum
and none of them alone, and a pod there with no series of its own is unknown.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from gpusteward.core.hami import slices
from gpusteward.core.model import GpuReading, Pod

HonorLabels = Literal["auto", "true", "false"]

WORKLOAD_LABELS = ("exported_namespace", "exported_pod")  # the exporter's, under honorLabels: false
TARGET_LABELS = ("namespace", "pod")  # the exporter's under honorLabels: true, else the target's
POD_LABELS = (*TARGET_LABELS, *WORKLOAD_LABELS)
# dcgm-exporter's per-pod copy of a shared GPU's series (--kubernetes-virtual-gpus).
VIRTUAL_GPU_LABEL = "vgpu"
# Where a scrape names the exporter pod's node (the Operator's ``node`` target label, or a
# relabeling from __meta_kubernetes_pod_node_name), and where an old exporter's Hostname, or the
# target's ``pod``, names the exporter's pod.
SCRAPE_NODE_LABELS = ("node", "kubernetes_node")


def honor_mode(value: bool | str) -> HonorLabels:
    """The policy's ``honorLabels`` (YAML reads ``true``/``false`` as booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value not in ("auto", "true", "false"):
        raise ValueError(f"honorLabels must be auto, true or false, not {value!r}")
    return value  # type: ignore[return-value]


def claimed_pod(labels: Mapping[str, str], honor: HonorLabels = "auto") -> str | None:
    """``namespace/name`` of the pod a series names as its GPU's holder, unverified."""
    if honor != "true" and labels.get("exported_pod"):
        return f"{labels.get('exported_namespace', '')}/{labels['exported_pod']}"
    if honor != "false" and labels.get("pod"):
        return f"{labels.get('namespace', '')}/{labels['pod']}"
    return None


def holder(claim: str | None, node: str, holders: Mapping[str, Collection[str]]) -> str | None:
    """The claim if the API server shows that pod holding GPUs on ``node``, else None."""
    return claim if claim is not None and claim in holders.get(node, ()) else None


def held_only(readings: Iterable[GpuReading], held: Collection[str]) -> tuple[GpuReading, ...]:
    """A node's readings with every pod not in ``held`` (keys of the pods the API server shows
    holding GPUs on it) taken off: their GPUs count as free."""
    return tuple(r if r.pod is None or r.pod in held else msgspec.structs.replace(r, pod=None)
                 for r in readings)


def is_per_pod(labels: Mapping[str, str]) -> bool:
    """A per-pod copy of a shared GPU's series (not the device's own reading)."""
    return bool(labels.get(VIRTUAL_GPU_LABEL))


def node_of(labels: Mapping[str, str], node_labels: Sequence[str],
            known: Collection[str] | None = None,
            pod_nodes: Mapping[str, str] | None = None) -> str | None:
    """The node a series is from.

    Without ``known`` nodes: the first of ``node_labels`` present. With them: the first of
    ``node_labels`` and the scrape's node labels that names a known node; else, for an older
    exporter whose ``Hostname`` is its own pod's name (no ``NODE_NAME``), or a target ``pod``
    label naming the exporter, that pod's node from ``pod_nodes`` (pod name -> node); else the
    first present (a node we do not know: counted, never matched).
    """
    for k in node_labels:  # the common case first: the exporter names a known node
        value = labels.get(k)
        if value and (known is None or value in known):
            return value
    if known is None:
        return None
    present = [labels[k] for k in (*node_labels, *SCRAPE_NODE_LABELS) if labels.get(k)]
    for value in present:
        if value in known:
            return value
    for value in (*present, labels.get("pod", "")):
        if pod_nodes and value in pod_nodes:
            return pod_nodes[value]
    return present[0] if present else None


@dataclass(frozen=True)
class Attribution:
    """The rule, bound to what the API server shows: nodes, and which pods hold GPUs where."""

    node_labels: Sequence[str]
    honor: HonorLabels = "auto"
    known_nodes: Collection[str] = ()
    holders: Mapping[str, Collection[str]] = field(default_factory=dict)  # node -> pod keys
    pod_nodes: Mapping[str, str] = field(default_factory=dict)  # any pod's name -> its node
    # GPU UUID -> pod key, for GPUs allocated through DRA claims (core/dra.py): an exporter
    # that does not map DRA pods labels their GPUs with no pod, but always with ``UUID``.
    by_uuid: Mapping[str, str] = field(default_factory=dict)
    # UUIDs of GPUs several pods hold HAMi slices of: their device series are nobody's.
    shared: Collection[str] = frozenset()

    @classmethod
    def of(cls, node_labels: Sequence[str], honor: bool | str, nodes: Iterable[str],
           pods: Iterable[Pod], pod_nodes: Mapping[str, str] | None = None,
           by_uuid: Mapping[str, str] | None = None) -> Attribution:
        holders: dict[str, set[str]] = {}
        bound = [p for p in pods if p.node and p.gpus > 0]
        for p in bound:
            holders.setdefault(p.node or "", set()).add(p.key)
        sole, shared = slice_holders(bound)
        return cls(tuple(node_labels), honor_mode(honor), frozenset(nodes), holders,
                   dict(pod_nodes or {}), {**sole, **(by_uuid or {})}, shared)

    def node(self, labels: Mapping[str, str]) -> str | None:
        return node_of(labels, self.node_labels, self.known_nodes, self.pod_nodes)

    def pod(self, labels: Mapping[str, str], node: str | None = None) -> str | None:
        """The verified holder of a series' GPU, or None (a free GPU, or the exporter's pod)."""
        node = node if node is not None else self.node(labels)
        if self.shared and not is_per_pod(labels) and labels.get("UUID") in self.shared:
            return None
        return (holder(claimed_pod(labels, self.honor), node or "", self.holders)
                or holder(self.by_uuid.get(labels.get("UUID", "")), node or "", self.holders))


def slice_holders(pods: Iterable[Pod]) -> tuple[dict[str, str], frozenset[str]]:
    """HAMi-sliced GPUs by UUID: the pod alone on each, and those several pods share."""
    on: dict[str, set[str]] = {}
    for p in pods:
        for s in slices(p.annotations):
            on.setdefault(s.uuid, set()).add(p.key)
    return ({uuid: next(iter(keys)) for uuid, keys in on.items() if len(keys) == 1},
            frozenset(uuid for uuid, keys in on.items() if len(keys) > 1))
