"""HAMi's vGPU monitor as Prometheus reads it: each container's SM utilization of its GPU.

From github:Project-HAMi/HAMi v2.10.0 (4707fb0) ``cmd/vGPUmonitor/metrics.go``: a gauge per
(container, device) of the container's processes' SM utilization summed, percent of the whole
GPU (HAMi-core's ``nvmlProcessUtilizationSample.smUtil``; ``pkg/monitor/nvidia/v1/spec.go``),
every series with the const label ``zone="vGPU"``. v2.9.0 renamed the family (#1644):

* v2.9+: ``hami_container_device_utilization_ratio{namespace, pod, container, vdevice_index,
  device_uuid}``;
* v2.8 and earlier, and v2.9+ with ``--legacy-metrics``: ``Device_utilization_desc_of_container
  {podnamespace, podname, ctrname, vdeviceid, deviceuuid}``.

``vdevice_index`` is the device's place in the container's own list. The monitor serves
``:9394/metrics`` from a DaemonSet pod per node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpusteward.sandbox.scrape import Exporter

HAMI_MONITOR = Exporter("kube-system", "hami-device-plugin-monitor", "vgpu-monitor", "monitorport")
HELP = "Container device SM utilization ratio"
LEGACY_HELP = "Container device utilization description"
Scrape = Callable[[str, list[tuple[str, str]]], list[tuple[str, str]]]


@dataclass(frozen=True)
class ContainerSlice:
    """One container's use of one GPU slice on ``node``."""

    node: str
    namespace: str
    pod: str
    container: str
    uuid: str
    util_percent: float
    vdevice: int = 0

    def labels(self, legacy: bool) -> list[tuple[str, str]]:
        if legacy:
            return [("podnamespace", self.namespace), ("podname", self.pod),
                    ("ctrname", self.container), ("vdeviceid", str(self.vdevice)),
                    ("deviceuuid", self.uuid), ("zone", "vGPU")]
        return [("namespace", self.namespace), ("pod", self.pod), ("container", self.container),
                ("vdevice_index", str(self.vdevice)), ("device_uuid", self.uuid),
                ("zone", "vGPU")]


def family(legacy: bool) -> tuple[str, str]:
    return (("Device_utilization_desc_of_container", LEGACY_HELP) if legacy
            else ("hami_container_device_utilization_ratio", HELP))


def _text(labels: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels)


def render_history(frames: Iterable[tuple[float, Iterable[ContainerSlice]]], *,
                   legacy: bool = False, scrape: Scrape | None = None) -> str:
    """OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``: one family, each
    series' samples in time order; ``scrape(node, labels)`` gives what Prometheus stores."""
    name, help_text = family(legacy)
    by_series: dict[str, list[str]] = {}
    for ts, slices in sorted(frames, key=lambda f: f[0]):
        for s in slices:
            exposed = s.labels(legacy)
            stored = scrape(s.node, exposed) if scrape else exposed
            by_series.setdefault(_text(sorted(stored)), []).append(
                f"{s.util_percent:g} {ts:.3f}")
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for text, samples in by_series.items():
        lines += [f"{name}{{{text}}} {sample}" for sample in samples]
    return "\n".join(lines) + "\n# EOF\n"


def render_exposition(slices: Iterable[ContainerSlice], legacy: bool = False) -> str:
    """The monitor's ``/metrics`` (Prometheus text format) for these containers' slices."""
    name, help_text = family(legacy)
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{{{_text(s.labels(legacy))}}} {s.util_percent:g}" for s in slices]
    return "\n".join(lines) + "\n"
