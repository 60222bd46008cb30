"""dcgm-exporter's metric families as data, and their text exposition (stdlib and core only).

One definition of what a real dcgm-exporter 4.x (release 4.5.3-4.8.2, default-counters.csv)
prints for a GPU, shared by the sandbox's DCGM simulator and the NVML agent, so the PromQL our
adapters write is checked against the real names, label order and value formats, not against a
friendlier shape of our own. It lives in the core because it is pure: readings in, families
(family -> samples -> labels and value) out, and ``render_text`` only formats them; nothing here
reads or writes anything.

* one ``# HELP``/``# TYPE`` pair per metric, help text from the CSV; families
  in field-ID order, because the exporter's Go template ranges over a map keyed
  by ``Counter{FieldID, ...}``, which text/template visits sorted;
* labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname``, then the label
  fields (``DCGM_FI_DRIVER_VERSION``), then the attributes in sorted key order
  (``container, err_code, err_msg, namespace, pod``); pod attributes only on GPUs
  bound to a pod, ``err_code``/``err_msg`` only on ``DCGM_FI_DEV_XID_ERRORS``;
* integer fields printed like Go's ``%d``, double fields like ``%f``;
* a per-pod copy of a time-sliced GPU (the exporter's ``--kubernetes-virtual-gpus``) carries
  that pod's attributes and ``vgpu`` (the replica id after ``::`` in the device plugin's device
  id), as ``PodMapper.Process`` writes them (``internal/pkg/transformation/kubernetes.go``);
* a MIG instance (``mig``) is its own entity: the parent's ``gpu``/``UUID``/``device``, then
  ``GPU_I_PROFILE`` and ``GPU_I_ID`` before the node label (``gpuMetricsFormat`` in
  ``internal/pkg/rendermetrics/render_metrics.go``), and no ``DCGM_FI_DEV_GPU_UTIL`` -- or, as
  some versions print it, a 0 (``MigInstance.gpu_util``; NVIDIA/dcgm-exporter#50, #216, #430).

Optionally (``xid_count_window_ms``) also the exporter's own ``DCGM_EXP_XID_ERRORS_COUNT``,
commented out of its default CSV: per GPU one series per XID seen within the window, labelled
``window_size_in_ms`` and ``xid`` (sorted in with the label fields), or a single 0 without
``xid`` when there was none. Optionally (``xid_total``) its cumulative
``DCGM_EXP_XID_ERRORS_TOTAL`` (dcgm-exporter >= 4.8.3, also commented out of the default CSV):
a counter per GPU and ``xid`` since the exporter started, whose series appears only once that
XID occurred; labelled like the windowed count, without ``window_size_in_ms``. The double keeps
one code per GPU (its last), where the exporter keeps a series for each code seen.
Optionally (``health``) the exporter's health families, after the others:
``DCGM_FI_DEV_ROW_REMAP_FAILURE`` (field 395, in the default CSV: 1 once a row remap failed)
and ``DCGM_EXP_GPU_HEALTH_STATUS`` (commented out of it: per GPU one series for each health
watch DCGM runs, labelled ``health_watch`` and ``health_error_code`` among the attributes, its
value DCGM's result, 0 pass, 10 warn, 20 fail; ``internal/pkg/collector/gpu_health_collector.go``).
Neither is printed for a MIG instance: DCGM watches health and row remapping per GPU.

Simplifications: ``DCGM_FI_DEV_FB_FREE`` is ``memory_mib - fb_used_mib`` (the
real one also subtracts ``FB_RESERVED``); ``err_msg`` comes from a subset of the
exporter's XID table and other codes print ``Unknown Error``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

__all__ = [
    "DCGM47",
    "DCGM47_FIELDS",
    "DCGM_FIELDS",
    "ENGINE_ACTIVE",
    "GENERATIONS",
    "LEGACY",
    "EXPORTER_LABELS",
    "GPU_UTIL",
    "MIB",
    "XID_COUNT",
    "XID_TOTAL",
    "HEALTH_FAIL",
    "HEALTH_WARN",
    "HEALTH_STATUS",
    "ROW_REMAP_FAILURE",
    "XID_ERROR",
    "XID_ERRORS",
    "XID_GPU_LOST",
    "ExportedGpu",
    "Family",
    "Field",
    "Generation",
    "MigInstance",
    "PodRef",
    "Sample",
    "dcgm_families",
    "fields",
    "gpu_id",
    "label_set",
    "render_text",
    "sample",
]

DEFAULT_DRIVER_VERSION = "550.90.07"
XID_GPU_LOST = 79  # what the driver logs when a GPU falls off the bus (NVML: GPU_IS_LOST)
MAX_XID = 10_000  # XIDs are small driver codes (the highest documented is below 200)
MIB = 1 << 20  # NVML counts memory in bytes, the exporter prints MiB
DEFAULT_NODE_LABEL = "Hostname"


@dataclass(frozen=True)
class PodRef:
    """The pod (and container) a GPU is allocated to, as PodResources reports it."""

    namespace: str
    name: str
    container: str


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance: NVML's instance id and its profile name (``1g.10gb``);
    ``gpu_util``: ``absent`` or ``zero``, how the exporter prints its DCGM_FI_DEV_GPU_UTIL."""

    id: int
    profile: str
    gpu_util: str = "absent"


class ExportedGpu(Protocol):
    """One entity the exporter prints series for (a GPU, a MIG instance or a per-pod copy) at
    one instant, in the exporter's units."""

    @property
    def node(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def model_name(self) -> str: ...  # NVML name with spaces, e.g. "NVIDIA H100 80GB HBM3"
    @property
    def uuid(self) -> str: ...
    @property
    def pci_bus_id(self) -> str: ...
    @property
    def util_percent(self) -> float: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def fb_used_mib(self) -> int: ...
    @property
    def temp_c(self) -> int: ...
    @property
    def power_w(self) -> float: ...
    @property
    def xid(self) -> int: ...  # the gauge: dcgm-exporter keeps the last XID, however old
    @property
    def xid_count(self) -> int: ...  # XIDs within the exporter's count window (all of ``xid``)
    @property
    def xid_total(self) -> int: ...  # XIDs of code ``xid`` since the exporter started
    @property
    def row_remap_failure(self) -> bool: ...
    @property
    def health(self) -> tuple[tuple[str, int, str], ...]: ...  # (watch, result, error code)
    @property
    def pod(self) -> PodRef | None: ...
    @property
    def vgpu(self) -> str: ...  # on a per-pod copy: its replica id
    @property
    def mig(self) -> MigInstance | None: ...  # an instance of GPU ``index``, not the whole GPU


@dataclass(frozen=True)
class Sample:
    """One series at one instant: its labels in printed order and its value as printed."""

    labels: tuple[tuple[str, str], ...]
    value: str

    def with_labels(self, **extra: str) -> Sample:
        """The same sample with ``extra`` labels appended after its own."""
        return Sample(self.labels + tuple(extra.items()), self.value)


@dataclass(frozen=True)
class Family:
    """One metric family (a gauge, but for COUNTERS) and its samples in printed order."""

    name: str
    help: str
    samples: tuple[Sample, ...] = ()


@dataclass(frozen=True)
class Field:
    """One exported DCGM field: its family's name and help, and how a reading prints it."""

    name: str
    help: str
    value: Callable[[ExportedGpu], str]


def _go_int(value: float) -> str:
    return f"{round(value):d}"


def _go_double(value: float) -> str:
    return f"{value:f}"


GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
XID_TOTAL = "DCGM_EXP_XID_ERRORS_TOTAL"
COUNTERS = frozenset({XID_TOTAL})  # the CSV's `counter` rows among the families printed

# Field-ID order (150, 155, 203, 230, 251, 252, 1001), as the exporter prints them.
DCGM_FIELDS = (
    Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: _go_int(g.temp_c)),
    Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: _go_double(g.power_w)),
    Field(GPU_UTIL, "GPU utilization (in %).",
          lambda g: _go_int(min(max(g.util_percent, 0.0), 100.0))),
    Field(XID_ERRORS, "Value of the last XID error encountered.", lambda g: _go_int(g.xid)),
    Field(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda g: _go_int(max(g.memory_mib - g.fb_used_mib, 0)),
    ),
    Field(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: _go_int(g.fb_used_mib)
    ),
    Field(
        ENGINE_ACTIVE,
        "Ratio of time the graphics engine is active.",
        lambda g: _go_double(min(max(g.util_percent, 0.0), 100.0) / 100.0),
    ),
)

# dcgm-exporter >= 4.9 (DCGM 4.7) prints the DCGM 4.7 names of the fields above, in their units
# (DCGM's dcgm_fields.h; go-dcgm's alias table pkg/dcgm/fields.go): utilization and engine
# activity as 0-1 ratios, framebuffer in bytes. The exact default counters file and HELP texts of
# 4.9 could not be confirmed from here: the texts are DCGM's field descriptions, and nothing
# reads them.
GPU_UTIL_RATIO = "DCGM_FI_DEV_GPU_UTIL_RATIO"
XID_ERROR = "DCGM_FI_DEV_XID_ERROR"
DCGM47_FIELDS = (
    Field("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "GPU temperature (in C).",
          lambda g: _go_int(g.temp_c)),
    Field("DCGM_FI_DEV_BOARD_POWER_WATTS", "Board power draw (in W).",
          lambda g: _go_double(g.power_w)),
    Field(GPU_UTIL_RATIO, "GPU utilization (ratio 0-1).",
          lambda g: _go_double(min(max(g.util_percent, 0.0), 100.0) / 100.0)),
    Field(XID_ERROR, "Value of the last XID error encountered.", lambda g: _go_int(g.xid)),
    Field("DCGM_FI_DEV_FB_FREE_BYTES", "Framebuffer memory free (in bytes).",
          lambda g: _go_int(max(g.memory_mib - g.fb_used_mib, 0) * MIB)),
    Field("DCGM_FI_DEV_FB_USED_BYTES", "Framebuffer memory used (in bytes).",
          lambda g: _go_int(g.fb_used_mib * MIB)),
    Field("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "Ratio of time the graphics engine is active.",
          lambda g: _go_double(min(max(g.util_percent, 0.0), 100.0) / 100.0)),
)


class Generation(NamedTuple):
    """What one generation of dcgm-exporter prints: its fields and the names of its node and
    driver labels (4.8.3 renamed ``Hostname`` to ``hostname``; 4.9 the driver label)."""

    fields: tuple[Field, ...]
    node_label: str
    driver_label: str


LEGACY = Generation(DCGM_FIELDS, "Hostname", "DCGM_FI_DRIVER_VERSION")  # dcgm-exporter <= 4.8
DCGM47 = Generation(DCGM47_FIELDS, "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION")  # >= 4.9
GENERATIONS = {"4.8": LEGACY, "4.9": DCGM47}
_UTIL_FIELDS = frozenset({GPU_UTIL, GPU_UTIL_RATIO})
_XID_FIELDS = frozenset({XID_ERRORS, XID_ERROR})

XID_COUNT_FIELD = Field(
    XID_COUNT,
    "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
    lambda g: _go_int(g.xid_count),
)


XID_TOTAL_FIELD = Field(
    XID_TOTAL, "Total XID errors observed since exporter start.", lambda g: _go_int(g.xid_total))


ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
HEALTH_STATUS = "DCGM_EXP_GPU_HEALTH_STATUS"
# The watches gpu_health_collector.go exports, in its order; ALL carries the GPU-wide faults
# (XID 79, 95) no subsystem owns.
HEALTH_WATCHES = ("PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER",
                  "DRIVER", "ALL")
HEALTH_PASS, HEALTH_WARN, HEALTH_FAIL = 0, 10, 20  # DCGM's dcgmHealthWatchResult_t
HEALTH_OK = (HEALTH_PASS, "DCGM_FR_OK")
ROW_REMAP_FIELD = Field(ROW_REMAP_FAILURE, "Whether remapping of rows has failed",
                        lambda g: _go_int(g.row_remap_failure))
HEALTH_FIELD = Field(HEALTH_STATUS, "Current DCGM-reported GPU health status.",
                     lambda g: _go_int(HEALTH_PASS))  # one sample per watch: _samples
_PER_GPU = frozenset({ROW_REMAP_FAILURE, HEALTH_STATUS})


def fields(xid_count_window_ms: int | None = None, generation: Generation = LEGACY,
           xid_total: bool = False, health: bool = False) -> tuple[Field, ...]:
    """The fields an exporter prints, with ``DCGM_EXP_XID_ERRORS_COUNT`` when it counts XIDs
    in a window, ``DCGM_EXP_XID_ERRORS_TOTAL`` (``xid_total``) when it counts them all, and
    the health families (``health``)."""
    return (generation.fields + ((XID_COUNT_FIELD,) if xid_count_window_ms else ())
            + ((XID_TOTAL_FIELD,) if xid_total else ())
            + ((ROW_REMAP_FIELD, HEALTH_FIELD) if health else ()))


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

# Every label the exporter itself writes, but the node label (its name is a setting).
EXPORTER_LABELS = frozenset(
    {"gpu", "UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION",
     "DCGM_FI_SYSTEM_DRIVER_VERSION"}
    | {"GPU_I_PROFILE", "GPU_I_ID"}
    | {"container", "namespace", "pod", "vgpu", "err_code", "err_msg", "window_size_in_ms", "xid"}
    | {"health_watch", "health_error_code"}
)


def _labels(
    gpu: ExportedGpu, field: Field, driver_version: str, node_label: str,
    xid_count_window_ms: int | None, driver_label: str = LEGACY.driver_label,
    extra: Mapping[str, str] | None = None,
) -> tuple[tuple[str, str], ...]:
    labels = [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", gpu.model_name),
        *((("GPU_I_PROFILE", gpu.mig.profile), ("GPU_I_ID", str(gpu.mig.id))) if gpu.mig else ()),
        (node_label, gpu.node),
        (driver_label, driver_version),
    ]
    if field.name == XID_COUNT:
        labels.append(("window_size_in_ms", str(xid_count_window_ms)))
        if gpu.xid_count:
            labels.append(("xid", str(gpu.xid)))
    if field.name == XID_TOTAL:
        labels.append(("xid", str(gpu.xid)))
    attributes: dict[str, str] = dict(extra or {})
    if field.name in _XID_FIELDS:
        attributes["err_code"] = str(gpu.xid)
        attributes["err_msg"] = _XID_TEXT.get(gpu.xid, "Unknown Error")
    if (pod := gpu.pod) is not None:
        attributes |= {"container": pod.container, "namespace": pod.namespace, "pod": pod.name}
    if gpu.vgpu:
        attributes["vgpu"] = gpu.vgpu
    return tuple(labels + sorted(attributes.items()))


def sample(
    field: Field,
    gpu: ExportedGpu,
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    node_label: str = DEFAULT_NODE_LABEL,
    xid_count_window_ms: int | None = None,
    generation: Generation = LEGACY,
) -> Sample | None:
    """The sample ``gpu`` prints for ``field``, or None where the exporter prints none.

    ``node_label`` is ``Hostname`` in released exporters and ``hostname`` on dcgm-exporter main
    since May 2026. ``xid_count_window_ms``: the exporter's ``--xid-count-window-size``.
    """
    if field.name == XID_TOTAL and not gpu.xid_total:
        return None  # its series appears with the first XID
    if field.name in _PER_GPU and gpu.mig is not None:
        return None
    if gpu.mig is not None and field.name in _UTIL_FIELDS:
        if gpu.mig.gpu_util == "absent":
            return None
        value = "0"
    else:
        value = field.value(gpu)
    return Sample(_labels(gpu, field, driver_version, node_label, xid_count_window_ms,
                          generation.driver_label), value)


def dcgm_families(
    gpus: Iterable[ExportedGpu],
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    node_label: str = DEFAULT_NODE_LABEL,
    xid_count_window_ms: int | None = None,
    generation: Generation = LEGACY,
    xid_total: bool = False,
    health: bool = False,
) -> list[Family]:
    """Every family one scrape prints for these entities, each with their samples in order."""
    gpus = list(gpus)

    def printed(f: Field) -> tuple[Sample, ...]:
        return tuple(s for g in gpus for s in _samples(
            f, g, driver_version=driver_version, node_label=node_label,
            xid_count_window_ms=xid_count_window_ms, generation=generation))

    return [Family(f.name, f.help, printed(f))
            for f in fields(xid_count_window_ms, generation, xid_total, health)]


def _samples(field: Field, gpu: ExportedGpu, *, driver_version: str, node_label: str,
             xid_count_window_ms: int | None, generation: Generation) -> Iterator[Sample]:
    """``sample``, but a series per health watch for DCGM_EXP_GPU_HEALTH_STATUS."""
    one = sample(field, gpu, driver_version=driver_version, node_label=node_label,
                 xid_count_window_ms=xid_count_window_ms, generation=generation)
    if one is None or field.name != HEALTH_STATUS:
        yield from (one,) if one is not None else ()
        return
    found = {watch: (result, code) for watch, result, code in gpu.health}
    for watch in HEALTH_WATCHES:
        result, code = found.get(watch, HEALTH_OK)
        yield Sample(_labels(gpu, field, driver_version, node_label, xid_count_window_ms,
                             generation.driver_label,
                             {"health_watch": watch, "health_error_code": code}),
                     _go_int(result))


def gpu_id(labels: Mapping[str, str]) -> str:
    """The one name of the GPU (or MIG instance) a series is about, within its node: its UUID
    (``uuid`` in old exporters), else its index where a query kept only ``gpu``; a MIG instance
    adds ``/mig<GPU_I_ID>``. The extender's queries keep the index alone (fewer bytes, and its
    reasons say ``gpu 3``); the reclaimer's evidence and the report keep the UUID."""
    gpu = labels.get("UUID") or labels.get("uuid") or labels.get("gpu", "")
    return f"{gpu}/mig{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else gpu


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_set(labels: Iterable[tuple[str, str]]) -> str:
    """``{name="value",...}`` with the text format's escapes."""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def render_text(families: Iterable[Family]) -> str:
    """The text exposition (format 0.0.4) of these gauge families."""
    lines: list[str] = []
    for family in families:
        kind = "counter" if family.name in COUNTERS else "gauge"
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {kind}"]
        lines += [f"{family.name}{label_set(s.labels)} {s.value}" for s in family.samples]
    return "\n".join(lines) + "\n"
