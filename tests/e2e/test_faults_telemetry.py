"""Garbage utilization against the real reclaimer (issue 13 item 6): the sandbox's API server and
a real Prometheus scraping an exporter whose GPUs report NaN, +Inf and a negative value.

dcgm-exporter prints double fields with Go's `%f` (DCGMX internal/pkg/collector/gpu_collector.go
`toString`; see /work/shared/reference/extender-protocol-and-telemetry.md), which writes `NaN`,
`+Inf` and `-0.050000`, and Prometheus's text parser stores them as they are. Integer fields such
as DCGM_FI_DEV_GPU_UTIL cannot carry them, so the broken GPUs here report only the double
DCGM_FI_PROF_GR_ENGINE_ACTIVE, as an exporter running a profiling-only counter set does; the
reclaimer falls back to it (x100) for GPUs without DCGM_FI_DEV_GPU_UTIL.

NaN fails every comparison, so before the fix `peak >= threshold` judged the NaN pod idle, a
negative peak is below any threshold, and a GPU reading NaN on every other scrape showed the peak
of its other samples: all three were marked, warned and evicted. A healthy idle pod on
the same exporter is the control: it must be evicted, so the test cannot pass by doing nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Callable, Sequence

from gpusteward.core.dcgm import PodRef
from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT
from gpusteward.sandbox.simgpu import SimGpu, render_exposition
from tests.e2e.kube import annotations, gone, gpu_pod

# pod -> what its GPU's DCGM_FI_PROF_GR_ENGINE_ACTIVE reads, scrape after scrape, as Go's %f
# prints it. "flaky" reads NaN every other scrape: Prometheus's max_over_time skips NaN samples,
# so its peak was the 0 of the others, with full coverage.
BROKEN = {"nan": ("NaN",), "inf": ("+Inf",), "negative": ("-0.050000",),
          "flaky": ("0.000000", "NaN")}
CONTROL = "control"
_POD = re.compile(r'[{,]pod="([^"]+)"')


def broken_exporter() -> Callable[[Sequence[SimGpu]], str]:
    """dcgm-exporter's text for the GPUs, with the broken pods' GPUs reading BROKEN."""
    scrapes = itertools.count()

    def render(gpus: Sequence[SimGpu]) -> str:
        n = next(scrapes)
        lines = []
        for line in render_exposition(gpus).splitlines():
            found = _POD.search(line)
            values = BROKEN.get(found.group(1)) if found else None
            if values is not None and line.startswith("DCGM_FI_DEV_GPU_UTIL{"):
                continue
            if values is not None and line.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE{"):
                line = f"{line.rsplit(' ', 1)[0]} {values[n % len(values)]}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    return render


async def test_nan_infinite_and_negative_utilization_never_marks_or_evicts_a_pod(
        ns, reclaimer, dcgm_endpoint, prometheus_factory):
    names = [*BROKEN, CONTROL]
    for name in names:
        ns.create_pod(gpu_pod(name, 1, node="h100-0", util="0"))
    for name in names:
        ns.running(name)
    dcgm_endpoint.gpus = [SimGpu("h100-0", i, "NVIDIA H100 80GB HBM3",
                                 pod=PodRef(ns.name, name, "main"))
                          for i, name in enumerate(names)]
    dcgm_endpoint.render = broken_exporter()
    prometheus = prometheus_factory(scrape_targets=[dcgm_endpoint.target])
    rec = await reclaimer("enforce", prometheus_url=prometheus.url)

    verdicts = {}
    deadline = time.monotonic() + 150
    while not gone(ns, CONTROL):
        assert time.monotonic() < deadline, f"the idle control pod was never evicted: {verdicts}"
        decided = await asyncio.wait_for(rec.cycle(), 60)
        verdicts.update({v.pod: v for v in decided.verdicts})
        for name in BROKEN:
            marks = annotations(ns, name)
            assert IDLE_SINCE not in marks and RECLAIM_AT not in marks, (name, verdicts)
        await asyncio.sleep(1.0)

    for name in BROKEN:
        assert not gone(ns, name)
        verdict = verdicts[f"{ns.name}/{name}"]
        assert verdict.state == "unknown", verdict
        assert any("not a value in 0-100%" in r for r in verdict.reasons), verdict
