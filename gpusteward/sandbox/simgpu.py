"""Simulated GPUs, and what dcgm-exporter prints for them: live and as promtool history.

The sandbox's DCGM simulator, the component tests and the benchmarks describe GPUs as
``SimGpu`` records; ``gpusteward.core.dcgm`` turns them into the exporter's families. What is
simulation lives here: a UUID and PCI bus id made up from (node, index), the NVML model name
guessed back from GFD's product label, and the per-pod copies of a time-sliced GPU whose exporter
runs with ``--kubernetes-virtual-gpus`` (``shares``): one copy of each of its series per pod
sharing it, in place of the device's, each with that pod's attributes and ``vgpu``; the
utilization families read the pod's own share (per-process metrics, dcgm-exporter PR #594), the
others the device's. Simplification: a free GPU keeps its device series (the exporter drops it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from gpusteward.core.cards import physical_card
from gpusteward.core.dcgm import (
    DEFAULT_DRIVER_VERSION,
    DEFAULT_NODE_LABEL,
    EXPORTER_LABELS,
    LEGACY,
    Generation,
    MigInstance,
    PodRef,
    dcgm_families,
    fields,
    label_set,
    render_text,
)

__all__ = [
    "Share",
    "SimGpu",
    "model_name_for_product",
    "render_exposition",
    "join_openmetrics",
    "render_openmetrics_history",
]


@dataclass(frozen=True)
class Share:
    """One pod's replica of a time-sliced GPU and its own utilization."""

    pod: PodRef
    vgpu: str  # the replica id: ``n`` of the device plugin's ``<uuid>::<n>``
    util_percent: float


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
    xid_total: int = 0  # XIDs of code ``xid`` since the exporter started
    row_remap_failure: bool = False
    health: tuple[tuple[str, int, str], ...] = ()  # (watch, result, error code) not passing
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


def _entities(gpus: Iterable[SimGpu]) -> Iterator[SimGpu]:
    """What the exporter prints series for: each GPU, or its per-pod copies."""
    for gpu in gpus:
        if not gpu.shares:
            yield gpu
        for s in gpu.shares:
            yield dataclasses.replace(gpu, pod=s.pod, vgpu=s.vgpu, util_percent=s.util_percent,
                                      shares=())


def render_exposition(
    gpus: Iterable[SimGpu],
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    node_label: str = DEFAULT_NODE_LABEL,
    xid_count_window_ms: int | None = None,
    generation: Generation = LEGACY,
    xid_total: bool = False,
    health: bool = False,
) -> str:
    """One scrape of ``/metrics`` (text format 0.0.4) for the given GPUs.

    ``node_label`` is ``Hostname`` in exporters up to 4.8.2 and ``hostname`` from 4.8.3.
    ``xid_count_window_ms``: the exporter's ``--xid-count-window-size`` with
    ``DCGM_EXP_XID_ERRORS_COUNT`` enabled. ``generation``: the field names and units (up to
    4.8, or 4.9 and later: ``core.dcgm.DCGM47``).
    """
    return render_text(dcgm_families(_entities(gpus), driver_version=driver_version,
                                     node_label=node_label,
                                     xid_count_window_ms=xid_count_window_ms,
                                     generation=generation, xid_total=xid_total,
                                     health=health))


def render_openmetrics_history(
    samples: Iterable[tuple[float, Iterable[SimGpu]]],
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    node_label: str = DEFAULT_NODE_LABEL,
    extra_labels: dict[str, str] | None = None,
    xid_count_window_ms: int | None = None,
    scrape: Callable[[str, list[tuple[str, str]]], list[tuple[str, str]]] | None = None,
    generation: Generation = LEGACY,
    xid_total: bool = False,
    health: bool = False,
) -> str:
    """OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``.

    ``samples`` are ``(unix_seconds, gpus)`` frames in any order. OpenMetrics wants
    each family contiguous, so the output is grouped by family, then by series
    (first-seen order), each series' samples in time order. ``extra_labels`` (say
    ``instance``/``job``) stand in for the target labels a scrape would add; ``scrape(node,
    labels)``, if given, turns each series' labels into what Prometheus stores from that node's
    exporter (target labels, ``honor_labels``).
    Timestamps are written to the millisecond, the resolution Prometheus stores.
    ``generation``: the exporter's field names and units (``core.dcgm``); the history of a fleet
    upgraded mid-way is two of these joined (``join_openmetrics``): their families differ.
    """
    extra = sorted((extra_labels or {}).items())
    clash = {name for name, _ in extra} & (EXPORTER_LABELS | {node_label})
    if clash:
        raise ValueError(f"extra_labels would replace exporter labels: {sorted(clash)}")
    frames = [
        (ts, dcgm_families(_entities(gpus), driver_version=driver_version,
                           node_label=node_label, xid_count_window_ms=xid_count_window_ms,
                           generation=generation, xid_total=xid_total, health=health))
        for ts, gpus in sorted(samples, key=lambda frame: frame[0])
    ]
    lines: list[str] = []
    for i, field in enumerate(fields(xid_count_window_ms, generation, xid_total, health)):
        # Typed gauge even for the XID counter: OpenMetrics names a counter's samples with a
        # lower-case `_total`, which DCGM_EXP_XID_ERRORS_TOTAL is not; queries do not care.
        lines += [f"# HELP {field.name} {field.help}", f"# TYPE {field.name} gauge"]
        by_series: dict[str, list[str]] = {}
        for ts, families in frames:
            for s in families[i].samples:
                labels = [*s.labels, *extra]
                if scrape is not None:
                    node = dict(s.labels)[node_label]
                    labels = scrape(node, labels)
                name = field.name + label_set(labels)
                by_series.setdefault(name, []).append(f"{name} {s.value} {ts:.3f}")
        lines += [line for series_lines in by_series.values() for line in series_lines]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def join_openmetrics(*texts: str) -> str:
    """OpenMetrics histories of disjoint families as one (a single ``# EOF``)."""
    return "".join(t.removesuffix("# EOF\n") for t in texts) + "# EOF\n"
