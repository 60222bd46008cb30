"""dcgm-exporter's exposition, rendered from simulated GPUs (stdlib and core only).

The sandbox and the component tests feed Prometheus with what a real
dcgm-exporter 4.x (release 4.5.3-4.8.2, default-counters.csv) would print, so
the PromQL our adapters write is checked against the real names, label order
and value formats, not against a friendlier shape of our own:

* one ``# HELP``/``# TYPE`` pair per metric, help text from the CSV; families
  in field-ID order, because the exporter's Go template ranges over a map keyed
  by ``Counter{FieldID, ...}``, which text/template visits sorted;
* labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname``, then the label
  fields (``DCGM_FI_DRIVER_VERSION``), then the attributes in sorted key order
  (``container, err_code, err_msg, namespace, pod``); pod attributes only on GPUs
  bound to a pod, ``err_code``/``err_msg`` only on ``DCGM_FI_DEV_XID_ERRORS``;
* integer fields printed like Go's ``%d``, double fields like ``%f``;
* a time-sliced GPU whose exporter runs with ``--kubernetes-virtual-gpus`` (``shares``): one copy
  of each of its series per pod sharing it, in place of the device's, each with that pod's
  attributes and ``vgpu`` (the replica id after ``::`` in the device plugin's device id), as
  ``PodMapper.Process`` writes them (``internal/pkg/transformation/kubernetes.go``); the
  utilization families read the pod's own share (per-process metrics, PR #594), the others the
  device's. Simplification: a free GPU keeps its device series (the exporter drops it).
* a MIG instance (``mig``) is its own entity: the parent's ``gpu``/``UUID``/``device``, then
  ``GPU_I_PROFILE`` and ``GPU_I_ID`` before the node label (``gpuMetricsFormat`` in
  ``internal/pkg/rendermetrics/render_metrics.go``), and no ``DCGM_FI_DEV_GPU_UTIL`` -- or, as
  some versions print it, a 0 (``MigInstance.gpu_util``; NVIDIA/dcgm-exporter#50, #216, #430).

Optionally (``xid_count_window_ms``) also the exporter's own ``DCGM_EXP_XID_ERRORS_COUNT``,
commented out of its default CSV: per GPU one series per XID seen within the window, labelled
``window_size_in_ms`` and ``xid`` (sorted in with the label fields), or a single 0 without
``xid`` when there was none.

Simplifications: ``DCGM_FI_DEV_FB_FREE`` is ``memory_mib - fb_used_mib`` (the
real one also subtracts ``FB_RESERVED``); ``err_msg`` comes from a subset of the
exporter's XID table and other codes print ``Unknown Error``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from gpusteward.core.cards import physical_card

__all__ = [
    "XID_GPU_LOST",
    "MigInstance",
    "PodRef",
    "Share",
    "SimGpu",
    "model_name_for_product",
    "render_exposition",
    "render_openmetrics_history",
]

DEFAULT_DRIVER_VERSION = "550.90.07"
XID_GPU_LOST = 79  # what the driver logs when a GPU falls off the bus (NVML: GPU_IS_LOST)
DEFAULT_NODE_LABEL = "Hostname"


@dataclass(frozen=True)
class PodRef:
    """The pod (and container) a GPU is allocated to, as PodResources reports it."""

    namespace: str
    name: str
    container: str


@dataclass(frozen=True)
class Share:
    """One pod's replica of a time-sliced GPU and its own utilization."""

    pod: PodRef
    vgpu: str  # the replica id: ``n`` of the device plugin's ``<uuid>::<n>``
    util_percent: float


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance: NVML's instance id and its profile name (``1g.10gb``);
    ``gpu_util``: ``absent`` or ``zero``, how the exporter prints its DCGM_FI_DEV_GPU_UTIL."""

    id: int
    profile: str
    gpu_util: str = "absent"


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU at one instant; units as the exporter reports them."""

    node: str
    index: int
    model_name: str  # NVML name with spaces, e.g. "NVIDIA H100 80GB HBM3"
    util_percent: float = 0.0
    memory_mib: int = 81559
    fb_used_mib: int = 0
    temp_c: int = 35
    power_w: float = 70.0
    xid: int = 0  # the gauge: dcgm-exporter keeps the last XID, however old
    xid_count: int = 0  # XIDs within the exporter's count window (all of code ``xid``)
    pod: PodRef | None = None
    shares: tuple[Share, ...] = ()  # per-pod copies (--kubernetes-virtual-gpus) in its place
    vgpu: str = ""  # on a per-pod copy: its replica id
    mig: MigInstance | None = None  # an instance of GPU ``index``, not the whole GPU

    @property
    def uuid(self) -> str:
        """Stable per (node, index), so history and live scrapes name the same series."""
        h = hashlib.sha256(f"{self.node}/{self.index}".encode()).hexdigest()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    @property
    def pci_bus_id(self) -> str:
        """DCGM's ``PCI.BusID`` form; one bus per index, as on an 8-GPU board."""
        return f"00000000:{(0x07 + 0x10 * self.index) % 0x100:02X}:00.0"


_FORM_FACTOR = re.compile(r"SXM\d*|PCIE")


def model_name_for_product(product: str) -> str:
    """NVML model name for a GFD ``nvidia.com/gpu.product`` label.

    GFD turns the NVML name's spaces into dashes, so the inverse is a guess. The
    rule: drop GFD's ``-MIG-<profile>`` / ``-SHARED`` suffix (dcgm-exporter
    reports the parent GPU's name), then turn dashes into spaces except around an
    upper-case form-factor token (``SXM<n>``, ``PCIE``), which NVML writes dashed:
    ``NVIDIA-A100-SXM4-80GB`` -> ``NVIDIA A100-SXM4-80GB``, but
    ``NVIDIA-A100-80GB-PCIe`` -> ``NVIDIA A100 80GB PCIe``.
    """
    tokens = physical_card(product).split("-")
    name = tokens[0]
    for left, right in zip(tokens, tokens[1:], strict=False):
        dashed = _FORM_FACTOR.fullmatch(left) or _FORM_FACTOR.fullmatch(right)
        name += ("-" if dashed else " ") + right
    return name


def _go_int(value: float) -> str:
    return f"{round(value):d}"


def _go_double(value: float) -> str:
    return f"{value:f}"


@dataclass(frozen=True)
class _Family:
    name: str
    help: str
    value: Callable[[SimGpu], str]


# Field-ID order (150, 155, 203, 230, 251, 252, 1001), as the exporter prints them.
_FAMILIES = (
    _Family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: _go_int(g.temp_c)),
    _Family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: _go_double(g.power_w)),
    _Family(
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        lambda g: _go_int(min(max(g.util_percent, 0.0), 100.0)),
    ),
    _Family(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        lambda g: _go_int(g.xid),
    ),
    _Family(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda g: _go_int(max(g.memory_mib - g.fb_used_mib, 0)),
    ),
    _Family(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: _go_int(g.fb_used_mib)
    ),
    _Family(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        lambda g: _go_double(min(max(g.util_percent, 0.0), 100.0) / 100.0),
    ),
)

XID_COUNT = _Family(
    "DCGM_EXP_XID_ERRORS_COUNT",
    "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
    lambda g: _go_int(g.xid_count),
)


def _families(xid_count_window_ms: int | None) -> tuple[_Family, ...]:
    return _FAMILIES + ((XID_COUNT,) if xid_count_window_ms else ())


# Texts from dcgm-exporter's xidErrCodeToText for the XIDs a GPU fleet commonly sees.
_XID_TEXT = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: (
        "Preemptive cleanup, due to previous errors -- "
        "Most likely to see when running multiple cuda"
    ),
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}


_EXPORTER_LABELS = frozenset(
    {"gpu", "UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION"}
    | {"GPU_I_PROFILE", "GPU_I_ID"}
    | {"container", "namespace", "pod", "vgpu", "err_code", "err_msg", "window_size_in_ms", "xid"}
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(
    gpu: SimGpu, family: _Family, driver_version: str, node_label: str,
    xid_count_window_ms: int | None = None,
) -> list[tuple[str, str]]:
    labels = [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", gpu.model_name),
        *((("GPU_I_PROFILE", gpu.mig.profile), ("GPU_I_ID", str(gpu.mig.id))) if gpu.mig else ()),
        (node_label, gpu.node),
        ("DCGM_FI_DRIVER_VERSION", driver_version),
    ]
    if family is XID_COUNT:
        labels.append(("window_size_in_ms", str(xid_count_window_ms)))
        if gpu.xid_count:
            labels.append(("xid", str(gpu.xid)))
    attributes: dict[str, str] = {}
    if family.name == "DCGM_FI_DEV_XID_ERRORS":
        attributes["err_code"] = str(gpu.xid)
        attributes["err_msg"] = _XID_TEXT.get(gpu.xid, "Unknown Error")
    if (pod := gpu.pod) is not None:
        attributes |= {"container": pod.container, "namespace": pod.namespace, "pod": pod.name}
    if gpu.vgpu:
        attributes["vgpu"] = gpu.vgpu
    return labels + sorted(attributes.items())


def _entities(gpus: Iterable[SimGpu]) -> Iterator[SimGpu]:
    """What the exporter prints series for: each GPU, or its per-pod copies."""
    for gpu in gpus:
        if not gpu.shares:
            yield gpu
        for s in gpu.shares:
            yield dataclasses.replace(gpu, pod=s.pod, vgpu=s.vgpu, util_percent=s.util_percent,
                                      shares=())


def _value(family: _Family, gpu: SimGpu) -> str | None:
    """The printed value, or None where the exporter prints no series."""
    if gpu.mig is not None and family.name == "DCGM_FI_DEV_GPU_UTIL":
        return None if gpu.mig.gpu_util == "absent" else "0"
    return family.value(gpu)


def _series(labels: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def render_exposition(
    gpus: Iterable[SimGpu],
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    node_label: str = DEFAULT_NODE_LABEL,
    xid_count_window_ms: int | None = None,
) -> str:
    """One scrape of ``/metrics`` (text format 0.0.4) for the given GPUs.

    ``node_label`` is ``Hostname`` in released exporters and ``hostname`` on
    dcgm-exporter main since May 2026. ``xid_count_window_ms``: the exporter's
    ``--xid-count-window-size`` with ``DCGM_EXP_XID_ERRORS_COUNT`` enabled.
    """
    gpus = list(_entities(gpus))
    lines: list[str] = []
    for family in _families(xid_count_window_ms):
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} gauge"]
        for gpu in gpus:
            value = _value(family, gpu)
            if value is None:
                continue
            series = _series(_labels(gpu, family, driver_version, node_label,
                                     xid_count_window_ms))
            lines.append(f"{family.name}{series} {value}")
    return "\n".join(lines) + "\n"


def render_openmetrics_history(
    samples: Iterable[tuple[float, Iterable[SimGpu]]],
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    node_label: str = DEFAULT_NODE_LABEL,
    extra_labels: dict[str, str] | None = None,
    xid_count_window_ms: int | None = None,
    scrape: Callable[[str, list[tuple[str, str]]], list[tuple[str, str]]] | None = None,
) -> str:
    """OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``.

    ``samples`` are ``(unix_seconds, gpus)`` frames in any order. OpenMetrics wants
    each family contiguous, so the output is grouped by family, then by series
    (first-seen order), each series' samples in time order. ``extra_labels`` (say
    ``instance``/``job``) stand in for the target labels a scrape would add; ``scrape(node,
    labels)``, if given, turns each series' labels into what Prometheus stores from that node's
    exporter (target labels, ``honor_labels``).
    Timestamps are written to the millisecond, the resolution Prometheus stores.
    """
    extra = sorted((extra_labels or {}).items())
    clash = {name for name, _ in extra} & (_EXPORTER_LABELS | {node_label})
    if clash:
        raise ValueError(f"extra_labels would replace exporter labels: {sorted(clash)}")
    frames = sorted(((ts, list(_entities(gpus))) for ts, gpus in samples),
                    key=lambda frame: frame[0])
    lines: list[str] = []
    for family in _families(xid_count_window_ms):
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} gauge"]
        by_series: dict[str, list[str]] = {}
        for ts, gpus in frames:
            for gpu in gpus:
                value = _value(family, gpu)
                if value is None:
                    continue
                labels = _labels(gpu, family, driver_version, node_label,
                                 xid_count_window_ms) + extra
                if scrape is not None:
                    labels = scrape(gpu.node, labels)
                series = family.name + _series(labels)
                by_series.setdefault(series, []).append(f"{series} {value} {ts:.3f}")
        lines += [line for series_lines in by_series.values() for line in series_lines]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"
