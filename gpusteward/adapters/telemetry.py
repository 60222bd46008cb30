"""The extender's GPU telemetry refresh from Prometheus (dcgm-exporter series, or our NVML
agent's identical ones): a fixed set of instant queries whatever the fleet size, and their
results assembled into one reading per GPU, every unusable series counted and left out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from gpusteward.adapters.errors import TelemetryUnavailable
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.adapters.promql import (
    GPU_KEY,
    LOCATING,
    exact_range,
    gpu_labels,
    keeping,
    not_ignored,
    sampled,
    utilization,
    xid_matchers,
)
from gpusteward.core.attribution import claimed_pod, honor_mode, is_per_pod, node_of
from gpusteward.core.dcgm import MAX_XID, XID_COUNT, gpu_id
from gpusteward.core.model import GpuReading, Telemetry
from gpusteward.core.policy import Health, TelemetryPolicy
from gpusteward.core.vocabulary import Concept, Unit, Vocabulary

log = logging.getLogger("gpusteward.telemetry")

# (node names known, pod name -> node): lets a series whose node label names no node (an older
# exporter's Hostname is its pod's name) find its node; see core.attribution.node_of.
Locator = Callable[[], tuple[Collection[str], Mapping[str, str]]]



def queries(health: Health, node_labels: Sequence[str],
            vocabulary: Vocabulary | None = None, left_closed: bool = False) -> dict[str, str]:
    """The PromQL of one refresh, each concept under all its names (core.vocabulary) in the
    unit the readings use. Engine activity stands in where utilization is absent and always
    reads MIG instances (see WHOLE_GPU).

    Each query keeps the labels ``assemble`` reads; ``timestamp`` goes inside the aggregation so
    that it is still each sample's time.

    XIDs: dcgm-exporter's gauge keeps a GPU's last XID until the exporter restarts
    (NVIDIA/dcgm-exporter#500), so a single old XID would sideline the GPU for good. Where the
    exporter also has its windowed DCGM_EXP_XID_ERRORS_COUNT enabled (``xid_nodes``: one series
    per node), that count is believed instead (``xid_counted``: only GPUs with a non-ignored
    XID in the window)."""
    ignored = not_ignored(health)
    window = f"{int(health.xid_window)}s"
    step = f"{max(1, int(health.xid_window) // 40)}s"  # ~40 points per series and window
    words = vocabulary or Vocabulary()
    labels = gpu_labels(node_labels)
    by = keeping(labels)
    xid_window = f"[{exact_range(health.xid_window, left_closed)}:{step}]"
    counted = xid_matchers(health)
    return {
        # instant readings: unmarked (see Vocabulary.union)
        "util": by + utilization(words, Unit.RATIO, mark=False),
        "util_at": by + sampled(words, mark=False),
        "temp": by + words.union(Concept.TEMPERATURE, Unit.CELSIUS, mark=False),
        "fb_used": by + words.union(Concept.MEMORY_USED, Unit.MIB, mark=False),
        # an XID under either name within the window counts: marked, so both are kept
        "xid": by + words.union(Concept.XID, Unit.CODE,
                                lambda x: f"max_over_time(({x}{ignored}){xid_window})"),
        "xid_nodes": f"count by ({', '.join([*node_labels, *LOCATING])}) ({XID_COUNT})",
        "xid_counted": keeping([*labels, "xid"])
                       + f"(max_over_time({XID_COUNT}{{{', '.join(counted)}}}[{window}]) > 0)",
    }


class PrometheusSource:
    """The extender's telemetry: ``fetch`` one reading per GPU through ``client``."""

    def __init__(self, client: PrometheusClient, policy: TelemetryPolicy, health: Health,
                 locate: Locator | None = None):
        self.client = client
        self.health = health
        self.node_labels = tuple(policy.node_labels)
        self.honor = honor_mode(policy.honor_labels)
        self.locate = locate
        self._where: tuple[Collection[str], Mapping[str, str]] | None = None
        # reason -> series dropped by the last assemble (the extender counts them)
        self.last_dropped: dict[str, int] = {}
        self._gpus_read = 0
        self._built: tuple[Vocabulary, bool] | None = None
        self.queries: dict[str, str] = {}

    @classmethod
    def at(cls, connection: PrometheusConnection | str, policy: TelemetryPolicy, health: Health,
           *, clock: Callable[[], float] = time.time, attempts: int = 3,
           locate: Locator | None = None) -> PrometheusSource:
        """A source with a client of its own (one that shares nothing with other readers)."""
        return cls(PrometheusClient(connection, policy, clock, attempts), policy, health, locate)

    @property
    def unknown_names(self) -> list[str]:
        """Metric names like utilization's that no concept is read under (from the client)."""
        return self.client.unknown_names

    async def fetch(self) -> Telemetry:
        """One refresh; raises TelemetryUnavailable when Prometheus cannot answer."""
        client = self.client
        await client.check_names()
        if self._built != (client.present, bool(client.left_closed)):  # names changed
            self._built = (client.present, bool(client.left_closed))
            self.queries = queries(self.health, self.node_labels, *self._built)
        names = list(self.queries)
        results = await asyncio.gather(*(client.query(self.queries[n]) for n in names))
        telemetry = self.assemble(dict(zip(names, results, strict=True)))
        read = sum(len(r) for r in telemetry.nodes.values())
        if read < self._gpus_read:  # GPUs gone: maybe renamed (an exporter upgrade); look now
            client.recheck_names()
        self._gpus_read = read
        return telemetry

    def assemble(self, results: dict[str, list[dict[str, Any]]]) -> Telemetry:
        """Readings from one refresh's query results.

        A series that cannot be read (NaN, ±Inf or out-of-range value, missing or malformed
        labels) is dropped with its GPU for this refresh and counted in ``last_dropped``; the
        rest of the fleet is unaffected. Duplicates for one GPU keep the highest value, so the
        result never depends on series order."""
        gpus: dict[tuple[str, ...], dict[str, Any]] = {}
        bad: set[tuple[str, ...]] = set()
        dropped: dict[str, int] = {}
        counting: set[str] = set()
        copies: dict[tuple[str, ...], dict[str, Any]] = {}  # per-pod copies of shared GPUs
        self._where = self.locate() if self.locate else None
        try:
            for name, series in results.items():
                for s in series:
                    try:
                        key, labels, value = self._parse_series(name, s)
                    except BadSeries as e:
                        dropped[e.reason] = dropped.get(e.reason, 0) + 1
                        if e.key is not None:
                            bad.add(e.key)
                        log.debug("dropped %s series %r: %s", name, s, e)
                        continue
                    if name == "xid_nodes":
                        counting.add(key[0])
                        continue
                    per_pod = is_per_pod(labels)
                    if self._merge(copies if per_pod else gpus, key, name, labels, value) \
                            and not per_pod:
                        dropped["duplicate"] = dropped.get("duplicate", 0) + 1
        except (AttributeError, TypeError) as e:
            raise TelemetryUnavailable(f"unexpected query result shape: {e}") from e
        self.last_dropped = dropped
        if dropped:
            log.warning("telemetry series dropped this refresh (their GPUs read as unknown): %s",
                        ", ".join(f"{r}={n}" for r, n in sorted(dropped.items())))
        for key, fields in copies.items():  # a GPU seen only through its per-pod copies
            device = gpus.setdefault(key, fields)
            if "pod" in fields:  # a shared GPU is held: name one of its pods, always the same
                device.setdefault("pod", fields["pod"])
        now = self.client.clock()
        by_node: dict[str, list[GpuReading]] = {}
        for key, fields in sorted(gpus.items()):  # GPU order, not series order
            if key in bad:
                continue
            then = fields.pop("held_then", None)
            counted = fields.pop("counted_xid", 0)
            if fields["node"] in counting:  # the windowed count, not the sticky gauge
                fields["xid"] = counted
            if "sampled_at" not in fields and fields.get("xid"):
                # A GPU that stopped reporting utilization (lost: NVML gives none, the agent
                # exports its XID alone) but had an XID within the window is current now,
                # held by the pod its XID series name (no instant one can).
                fields["sampled_at"] = now
                if then is not None:
                    fields.setdefault("pod", then)
            if "sampled_at" in fields:
                by_node.setdefault(fields["node"], []).append(GpuReading(**fields))
        return Telemetry(nodes={n: tuple(r) for n, r in by_node.items()}, fetched_at=now)

    def _node_of(self, labels: dict[str, str]) -> str | None:
        known, pod_nodes = self._where or (None, None)
        return node_of(labels, self.node_labels, known, pod_nodes)

    def _parse_series(self, name: str, series: Any) -> tuple[tuple[str, ...], dict[str, str],
                                                                float]:
        """(GPU key, labels, value) of one series, or BadSeries saying why it is unusable."""
        try:
            labels = series["metric"]
            node = self._node_of(labels)
        except (KeyError, TypeError, AttributeError) as e:
            raise BadSeries("malformed", f"no label map: {e!r}") from e
        if not isinstance(node, str):
            raise BadSeries("malformed", "no node label")
        key = (node, *(labels.get(k, "") for k in GPU_KEY))
        try:
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BadSeries("malformed", f"no sample value: {e!r}", key) from e
        low, high = _RANGE.get(name, _ANY)
        if not low <= value <= high:  # NaN fails every comparison
            reason = "out_of_range" if math.isfinite(value) else "not_finite"
            raise BadSeries(reason, f"value {value} outside [{low}, {high}]", key)
        if name in _WHOLE and not value.is_integer():
            raise BadSeries("out_of_range", f"XID value {value} is not a whole number", key)
        if name == "xid_counted":
            xid = labels.get("xid")
            if not (isinstance(xid, str) and xid.isascii() and xid.isdigit()
                    and int(xid) <= MAX_XID):
                raise BadSeries("malformed", f"xid label {xid!r}", key)
        return key, labels, value

    def _merge(self, gpus: dict[tuple[str, ...], dict[str, Any]], key: tuple[str, ...],
               name: str, labels: dict[str, str], value: float) -> bool:
        """Fold one series into its GPU; True when it repeats an instant reading the GPU had.

        A windowed series (``_WINDOWED``) is one of those its GPU had over the window, one per
        label set: the pod that held it then, the name before an exporter upgrade. Their
        highest is the reading, and they name a holder only where no instant series does."""
        gpu = gpus.get(key)
        if gpu is None:
            gpu = gpus[key] = {"node": key[0], "gpu": gpu_id(labels)}
        pod = claimed_pod(labels, self.honor)
        holder = "held_then" if name in _WINDOWED else "pod"
        if pod and pod < gpu.get(holder, "\uffff"):  # copies of a shared GPU: the same one always
            gpu[holder] = pod
        field = _FIELDS.get(name)
        if field is None:
            return False
        if name == "xid_counted":  # one series per XID seen in the window
            gpu[field] = max(gpu.get(field, 0), int(labels["xid"]))
            return False
        old = gpu.get(field)
        if name == "xid":
            value = int(value)
        elif name == "util":
            value = min(1.0, value)  # engine activity may overshoot by rounding
        gpu[field] = value if old is None else max(old, value)  # order-independent
        return old is not None and name not in _WINDOWED


class BadSeries(ValueError):
    """One series that cannot be used; ``reason`` labels the dropped-series metric."""

    def __init__(self, reason: str, detail: str, key: tuple[str, ...] | None = None):
        super().__init__(detail)
        self.reason = reason
        self.key = key


# Plausible values per query (finite bounds, so one comparison also refuses NaN and ±Inf);
# anything else is a broken exporter or a bad recording rule.
_RANGE = {"util": (0.0, 1.0 + 1e-6), "util_at": (0.0, 1e11), "temp": (-50.0, 200.0),
          "fb_used": (0.0, 1e9), "xid": (0.0, MAX_XID), "xid_counted": (0.0, 1e12),
          "xid_nodes": (0.0, 1e12)}
_ANY = (-1e300, 1e300)
_WHOLE = frozenset({"xid", "xid_counted"})
_WINDOWED = _WHOLE  # read over health.xid_window, not at an instant
_FIELDS = {"util": "util", "util_at": "sampled_at", "temp": "temp_c", "fb_used": "fb_used_mib",
           "xid": "xid", "xid_counted": "counted_xid"}
