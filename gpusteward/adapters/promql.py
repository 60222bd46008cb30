"""The PromQL gpusteward reads GPUs with: each concept under all its names (core.vocabulary),
the labels that place a GPU, and windows that mean the same on Prometheus 2 and 3. Text only:
the client (adapters.promclient) runs it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpusteward.core.attribution import POD_LABELS, SCRAPE_NODE_LABELS, VIRTUAL_GPU_LABEL
from gpusteward.core.dcgm import (
    HEALTH_FAIL,
    HEALTH_STATUS,
    ROW_REMAP_FAILURE,
    XID_COUNT,
    XID_TOTAL,
)
from gpusteward.core.policy import Health
from gpusteward.core.vocabulary import Concept, Unit, Vocabulary, fallback

GPU_KEY = ("gpu", "GPU_I_ID")
# dcgm-exporter reports no GPU_UTIL for a MIG instance (series with GPU_I_ID/GPU_I_PROFILE),
# or a 0 whatever it computes (NVIDIA/dcgm-exporter#50, #216, #430): an instance is only ever
# read from the profiling engine-activity field, which ``fallback`` supplies where utilization
# is left out.
WHOLE_GPU = 'GPU_I_ID=""'


def utilization(vocabulary: Vocabulary, unit: Unit | None,
                body: Callable[[str], str] = lambda selector: selector, mark: bool = True,
                aggregate: str = "") -> str:
    """``body`` over each GPU's utilization, under any of its names, in ``unit``; engine
    activity where a GPU (a MIG instance always) has no utilization series. ``mark`` and
    ``aggregate``: see Vocabulary.union."""
    return fallback(
        vocabulary.union(Concept.UTILIZATION, unit, body, WHOLE_GPU, mark, aggregate),
        vocabulary.union(Concept.ENGINE_ACTIVITY, unit, body, mark=mark, aggregate=aggregate))


def sampled(vocabulary: Vocabulary, mark: bool = True, aggregate: str = "") -> str:
    """Each utilization (or engine-activity) series' newest sample time."""
    return utilization(vocabulary, None, _timestamp, mark, aggregate)


def _timestamp(selector: str) -> str:
    return f"timestamp({selector})"


def newest_sample(vocabulary: Vocabulary) -> str:
    """The newest sample of any GPU or MIG instance (the reclaimer's fleet-wide probe)."""
    return f"max({sampled(vocabulary, mark=False)})"  # one number: no series to tell apart


# Whether Prometheus's windows include a sample at their start. Prometheus 3 made range
# selectors left-open: ``x[60s]`` at t holds the samples in (t - 60s, t], 2.x's holds
# [t - 60s, t] (Prometheus 3.0 migration guide, "Range selectors and lookback exclude samples
# coinciding with the left boundary"; CHANGELOG 3.0.0, #13904); subqueries followed in 3.0.1
# (CHANGELOG 3.0.1, #15431: ``x[30m:1m]`` yields 30 points, not 31). This subquery of a 1 ms
# window at a 1 ms resolution is evaluated at t and, left-closed, at t - 1 ms too: 2 on 2.x,
# 1 from 3.0.1 on. (3.0.0 alone, left-open ranges but left-closed subqueries, reads as 2.x and
# then misses a sample exactly 1 ms after a step's start.)
LEFT_CLOSED_PROBE = "count_over_time(vector(1)[1ms:1ms])"


def exact_range(seconds: float, left_closed: bool) -> str:
    """A range covering exactly (t - seconds, t] (timestamps are whole milliseconds) on either
    major: on a left-closed (2.x) Prometheus one millisecond shorter, so a sample at the
    window's start is left out as 3.x leaves it out. The what-if's steps then partition time, as
    core.whatif.history's sliding window sums require (step-aligned scrapes put samples exactly
    there); the reclaimer's windows count the same samples, and the XID subquery yields the
    same points, on both."""
    return f"{int(seconds * 1000) - 1}ms" if left_closed else f"{int(seconds)}s"


# What ``node_of`` may fall back on: the scrape's node label, the exporter's own pod.
LOCATING = (*SCRAPE_NODE_LABELS, "pod")

def gpu_labels(node_labels: Sequence[str]) -> list[str]:
    """The labels that name one GPU (or MIG instance), its node and the pod holding it."""
    return [*dict.fromkeys([*node_labels, *GPU_KEY, *POD_LABELS, VIRTUAL_GPU_LABEL,
                            *LOCATING])]


def keeping(labels: Sequence[str]) -> str:
    """``max by (labels) `` for a query: dcgm-exporter's series carry a dozen long labels (UUID,
    bus id, model, driver) that, at 8,000 GPUs, were most of the bytes Prometheus encoded and
    we decoded; the caller keeps only those it reads."""
    return f"max by ({', '.join(labels)}) "


GPU_PLACE = ("gpu", "UUID", "GPU_I_ID")  # with the node labels: one GPU, whoever holds it


def xid_matchers(health: Health) -> list[str]:
    """Label matchers of the XID series that count (``xid`` labelled, not ignored)."""
    codes = "|".join(str(x) for x in sorted(health.ignored_xids))
    return ['xid!=""'] + ([f'xid!~"{codes}"'] if codes else [])


def not_ignored(health: Health) -> str:
    """A filter for an XID gauge's value: no XID (0) and ignored XIDs dropped."""
    return "".join(f" != {x}" for x in sorted({0, *health.ignored_xids}))


def fault_queries(health: Health, node_labels: Sequence[str], vocabulary: Vocabulary,
                  window: float, window_span: str) -> dict[str, str]:
    """Per GPU (and the pod its series name), the XIDs that count as faults within
    ``health.xidWindow`` (``window_span``: its range text, adapters.promql.exact_range):

    - ``xid_total``: the cumulative DCGM_EXP_XID_ERRORS_TOTAL rose (it also counts an XID
      between two scrapes, which the gauge misses);
    - ``xid_new``: a series of it appeared within the window: it appears with a GPU's first XID
      of that code, so ``increase`` (which needs two samples) sees none. Matched on the GPU and
      code alone: a pod arriving on a GPU with an old XID carries the old count in a series
      of its own labels, which is history, not a fault;
    - ``xid_counted``: the exporter's windowed count, where enabled, is above 0;
    - ``xid_gauge``: the XID gauge shows a code it did not show at the window's start. It keeps
      the last XID until the exporter restarts (NVIDIA/dcgm-exporter#500): a code it has held
      for longer is history. Each code is a series of its own (``err_code``, ``err_msg``), so
      the GPU's series then are compared, not one series' changes.
    Ignored XIDs (application faults) count in none of them. And, read at the instant:

    - ``health_failed``: a DCGM health watch of the GPU failed (DCGM_EXP_GPU_HEALTH_STATUS at
      DCGM's FAIL, 20; a warning, 10, is no fault);
    - ``row_remap_failed``: the GPU could not remap a row of memory
      (DCGM_FI_DEV_ROW_REMAP_FAILURE 1): it needs a reset, or replacing."""
    labels = ["UUID", *gpu_labels(node_labels)]  # UUID: a DRA pod's GPU is known by it
    by = keeping([*labels, "xid"])
    gpu = ", ".join(dict.fromkeys([*node_labels, *GPU_PLACE]))
    place = f"{gpu}, xid"
    matchers = ", ".join(xid_matchers(health))
    total, counted = f"{XID_TOTAL}{{{matchers}}}", f"{XID_COUNT}{{{matchers}}}"
    ignored = not_ignored(health)
    return {
        "xid_total": by + f"(increase({total}[{window_span}]) > 0)",
        "xid_new": f"{by}({total}) unless on ({place}) "
                   f"max by ({place}) ({total} offset {int(window)}s)",
        "xid_counted": by + f"(max_over_time({counted}[{window_span}]) > 0)",
        "xid_gauge": keeping(labels) + vocabulary.union(
            Concept.XID, Unit.CODE,
            lambda x: f"(({x}{ignored}) unless on ({gpu}, err_code) {x} offset {int(window)}s)",
            mark=False),
        "health_failed": keeping([*labels, "health_watch", "health_error_code"])
                         + f"({HEALTH_STATUS} >= {HEALTH_FAIL})",
        "row_remap_failed": keeping(labels) + f"({ROW_REMAP_FAILURE} > 0)",
    }


# Series that are one pod's own use of a GPU it may share, each labelled ``vgpu`` (so per_pod
# prefers them to the device's series, core.attribution) with the GPU's ``UUID`` (so they meet
# the device series of the same GPU):
# * the agent's per-pod readings of a shared GPU (docs/agent.md);
# * HAMi's vGPU monitor, each container's SM utilization in percent of the whole GPU, summed
#   over its processes (Project-HAMi/HAMi cmd/vGPUmonitor/metrics.go; pkg/monitor/nvidia/v1/
#   spec.go). v2.9 names it ``hami_container_device_utilization_ratio`` with ``namespace``,
#   ``pod``, ``device_uuid`` -- under a ServiceMonitor the target's ``namespace``/``pod`` win and
#   the workload's become ``exported_*``, as dcgm-exporter's do; v2.8 and earlier (and v2.9+
#   with ``--legacy-metrics``) name it ``Device_utilization_desc_of_container`` with
#   ``podnamespace``, ``podname``, ``deviceuuid``, relabelled here to ``exported_*``. A pod's
#   containers on one GPU are several series: the evidence keeps their max.
AGENT_POD_UTIL = "gpusteward_pod_gpu_util"
HAMI_CONTAINER_UTIL = "hami_container_device_utilization_ratio"
HAMI_LEGACY_CONTAINER_UTIL = "Device_utilization_desc_of_container"
HAMI_MARK, AGENT_MARK = "hami", "agent"


def per_pod_util(body: Callable[[str], str]) -> str:
    """``body`` over every per-pod utilization series (percent), marked and keyed as above."""
    agent = _relabel(body(AGENT_POD_UTIL), (VIRTUAL_GPU_LABEL, AGENT_MARK, ""))
    hami = _relabel(body(HAMI_CONTAINER_UTIL), (VIRTUAL_GPU_LABEL, HAMI_MARK, ""),
                    ("UUID", "$1", "device_uuid"))
    legacy = _relabel(body(HAMI_LEGACY_CONTAINER_UTIL), (VIRTUAL_GPU_LABEL, HAMI_MARK, ""),
                      ("UUID", "$1", "deviceuuid"), ("exported_namespace", "$1", "podnamespace"),
                      ("exported_pod", "$1", "podname"))
    return f"({agent} or {hami} or {legacy})"


def _relabel(expr: str, *moves: tuple[str, str, str]) -> str:
    """``label_replace`` for each (label, replacement, source): the source's whole value, or a
    constant where the source is ""."""
    for label, replacement, source in moves:
        expr = f'label_replace({expr}, "{label}", "{replacement}", "{source}", "(.+)")' \
            if source else f'label_replace({expr}, "{label}", "{replacement}", "", "")'
    return expr
