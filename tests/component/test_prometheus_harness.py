"""The Prometheus harness: backfilled DCGM history and live scrapes, in a real Prometheus."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpusteward.core.dcgm import PodRef
from gpusteward.sandbox.scrape import DCGM_EXPORTER, scrape_config
from gpusteward.sandbox.simgpu import SimGpu, render_exposition, render_openmetrics_history
from tests.support.fixtures import (  # noqa: F401 - fixtures
    DcgmEndpoint,
    PrometheusFactory,
    dcgm_endpoint,
    prometheus_factory,
)
from tests.support.prometheus import (
    SCRAPE_JOB,
    PrometheusError,
    PrometheusServer,
    stored_labels,
)

NODE = "gpu-node-1"
H100 = "NVIDIA H100 80GB HBM3"
TRAINER = PodRef(namespace="ml", name="train-0", container="trainer")
STEP_S = 30
BUSY_UTIL = 90
IDLE_UTIL = 0


def gpus(util: float) -> list[SimGpu]:
    """GPU 0 runs the trainer at ``util``; GPU 1 is free and idles at 5 %."""
    return [
        SimGpu(NODE, 0, H100, util_percent=util, fb_used_mib=40000, pod=TRAINER),
        SimGpu(NODE, 1, H100, util_percent=5),
    ]


class History:
    """Three hours at 30 s ending 30 s ago: the trainer is busy, then idle for the last hour."""

    def __init__(self, now: int) -> None:
        self.end = now - STEP_S
        self.start = self.end - 3 * 3600
        self.idle_from = self.end - 3600
        self.times = list(range(self.start, self.end + 1, STEP_S))

    def util(self, t: int) -> int:
        return IDLE_UTIL if t >= self.idle_from else BUSY_UTIL

    def openmetrics(self, instance: str = "dcgm:9400") -> str:
        frames = [(t, gpus(self.util(t))) for t in self.times]
        return render_openmetrics_history(
            frames, extra_labels={"instance": instance, "job": SCRAPE_JOB}
        )


@pytest.fixture
def history() -> History:
    return History(int(time.time()))


@pytest.fixture
def backfilled(prometheus_factory: PrometheusFactory, history: History) -> PrometheusServer:  # noqa: F811
    return prometheus_factory(history_openmetrics=history.openmetrics())


def by_gpu(result: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {series["metric"]["gpu"]: series for series in result}


def wait_for_series(prometheus: PrometheusServer, query: str, timeout_s: float = 30) -> list[Any]:
    """Poll until ``query`` returns series; the first scrape comes ~5 s after start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = prometheus.api("query", query=query)["result"]
        if result:
            return list(result)
        time.sleep(0.5)
    raise AssertionError(f"no series for {query} after {timeout_s} s:\n{prometheus.log_tail()}")


@pytest.mark.parametrize(
    "offset_s",
    [
        pytest.param(0, id="first-sample"),
        pytest.param(600, id="while-busy"),
        pytest.param(2 * 3600, id="first-idle-sample"),
        pytest.param(3 * 3600, id="last-sample"),
    ],
)
def test_instant_query_at_a_sample_time_returns_that_sample(
    backfilled: PrometheusServer, history: History, offset_s: int
) -> None:
    t = history.start + offset_s

    result = backfilled.api("query", query="DCGM_FI_DEV_GPU_UTIL", time=t)["result"]

    series = by_gpu(result)
    assert series["0"]["value"] == [t, str(history.util(t))]
    assert series["1"]["value"] == [t, "5"]


def test_backfilled_series_keep_the_exporter_labels(
    backfilled: PrometheusServer, history: History
) -> None:
    result = backfilled.api("query", query="DCGM_FI_DEV_XID_ERRORS", time=history.end)["result"]

    labels = by_gpu(result)
    trainer = SimGpu(NODE, 0, H100)
    assert labels["0"]["metric"] == {
        "__name__": "DCGM_FI_DEV_XID_ERRORS",
        "gpu": "0",
        "UUID": trainer.uuid,
        "pci_bus_id": trainer.pci_bus_id,
        "device": "nvidia0",
        "modelName": H100,
        "Hostname": NODE,
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
        "container": "trainer",
        "err_code": "0",
        "err_msg": "No Error",
        "namespace": "ml",
        "pod": "train-0",
        "instance": "dcgm:9400",
        "job": SCRAPE_JOB,
    }
    assert not {"pod", "namespace", "container"} & labels["1"]["metric"].keys()


@pytest.mark.parametrize(
    ("window", "peak"),
    [
        pytest.param("30m", IDLE_UTIL, id="last-30m-idle"),
        pytest.param("90m", BUSY_UTIL, id="last-90m-reaches-busy"),
    ],
)
def test_windows_ending_now_see_the_backfilled_history(
    backfilled: PrometheusServer, window: str, peak: int
) -> None:
    now = time.time()

    query = f'max_over_time(DCGM_FI_DEV_GPU_UTIL{{pod="train-0"}}[{window}])'
    (series,) = backfilled.api("query", query=query, time=now)["result"]

    assert series["value"][1] == str(peak)


def test_the_newest_backfilled_sample_is_within_the_last_minute(
    backfilled: PrometheusServer, history: History
) -> None:
    now = time.time()

    query = 'timestamp(DCGM_FI_DEV_GPU_UTIL{gpu="0"})'
    (series,) = backfilled.api("query", query=query, time=now)["result"]

    assert float(series["value"][1]) == history.end > now - 60


def test_range_query_returns_every_sample_across_the_busy_to_idle_edge(
    backfilled: PrometheusServer, history: History
) -> None:
    start, end = history.idle_from - 5 * STEP_S, history.idle_from + 4 * STEP_S

    data = backfilled.api(
        "query_range",
        query='DCGM_FI_DEV_GPU_UTIL{pod="train-0"}',
        start=start,
        end=end,
        step=STEP_S,
    )

    (series,) = data["result"]
    assert series["values"] == [[t, str(history.util(t))] for t in range(start, end + 1, STEP_S)]
    assert [v for _, v in series["values"]] == ["90"] * 5 + ["0"] * 5


def test_scraping_a_live_endpoint_yields_series_with_the_dcgm_labels(
    prometheus_factory: PrometheusFactory,  # noqa: F811
    dcgm_endpoint: DcgmEndpoint,  # noqa: F811
) -> None:
    dcgm_endpoint.gpus = gpus(util=73)
    prometheus = prometheus_factory(scrape_targets=[dcgm_endpoint.target])

    result = by_gpu(wait_for_series(prometheus, "DCGM_FI_DEV_GPU_UTIL"))

    trainer = result["0"]["metric"]
    assert result["0"]["value"][1] == "73"
    assert trainer["Hostname"] == NODE
    assert (trainer["namespace"], trainer["pod"], trainer["container"]) == (
        "ml",
        "train-0",
        "trainer",
    )
    assert (trainer["modelName"], trainer["device"]) == (H100, "nvidia0")
    assert (trainer["instance"], trainer["job"]) == (dcgm_endpoint.target, SCRAPE_JOB)
    assert not {"pod", "namespace", "container"} & result["1"]["metric"].keys()
    assert "exported_pod" not in trainer  # honor_labels keeps the exporter's own labels


def test_live_scrapes_continue_the_backfilled_series(
    prometheus_factory: PrometheusFactory,  # noqa: F811
    dcgm_endpoint: DcgmEndpoint,  # noqa: F811
    history: History,
) -> None:
    dcgm_endpoint.gpus = gpus(util=55)
    prometheus = prometheus_factory(
        history_openmetrics=history.openmetrics(instance=dcgm_endpoint.target),
        scrape_targets=[dcgm_endpoint.target],
    )

    wait_for_series(prometheus, 'DCGM_FI_DEV_GPU_UTIL{gpu="0"} == 55')
    query = 'count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="0"}[4h])'
    (series,) = prometheus.api("query", query=query, time=time.time())["result"]

    assert int(series["value"][1]) > len(history.times)  # one series: history, then live


@pytest.mark.parametrize("honor", [pytest.param(False, id="honorLabels-false"),
                                   pytest.param(True, id="honorLabels-true")])
def test_a_servicemonitor_shaped_scrape_stores_what_stored_labels_says(
    prometheus_factory: PrometheusFactory,  # noqa: F811
    dcgm_endpoint: DcgmEndpoint,  # noqa: F811
    honor: bool,
) -> None:
    # The sandbox's scrape job (gpusteward.sandbox.scrape: the Operator's target labels) against
    # a real Prometheus: what it stores is what the backfill helper writes for component tests.
    dcgm_endpoint.gpus = gpus(util=61)
    job = scrape_config(DCGM_EXPORTER, {NODE: (dcgm_endpoint.target, "/metrics")}, honor)
    prometheus = prometheus_factory(scrape_configs=[job])

    stored = by_gpu(wait_for_series(prometheus, "DCGM_FI_DEV_GPU_UTIL"))

    target = {**DCGM_EXPORTER.target_labels(NODE), "instance": dcgm_endpoint.target}
    for gpu in dcgm_endpoint.gpus:
        (line,) = [x for x in render_exposition([gpu]).splitlines()
                   if x.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        exposed = [tuple(kv.split("=", 1)) for kv in line[line.index("{") + 1:line.index("}")]
                   .replace('"', "").split(",")]
        expected = dict(stored_labels(exposed, target, honor), __name__="DCGM_FI_DEV_GPU_UTIL")
        assert stored[str(gpu.index)]["metric"] == expected
    trainer, free = stored["0"]["metric"], stored["1"]["metric"]
    if honor:  # the workload's labels kept; the free GPU gets the exporter's own pod
        assert (trainer["namespace"], trainer["pod"]) == ("ml", "train-0")
        assert free["pod"] == DCGM_EXPORTER.pod(NODE)
    else:  # the workload's labels moved to exported_*; every series names the exporter's pod
        assert (trainer["exported_namespace"], trainer["exported_pod"]) == ("ml", "train-0")
        assert trainer["pod"] == free["pod"] == DCGM_EXPORTER.pod(NODE)
        assert "exported_pod" not in free


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param({"prometheus_bin": "no-such-prometheus"}, id="prometheus"),
        pytest.param({"promtool_bin": "no-such-promtool"}, id="promtool"),
    ],
)
def test_a_missing_binary_fails_loudly_and_names_the_package(
    tmp_path: Path, missing: dict[str, str]
) -> None:
    server = PrometheusServer(tmp_path, **missing)

    with pytest.raises(
        PrometheusError, match="the 2.x is the Debian package `prometheus` `make setup` installs"
    ):
        server.start()


#: What each major's ``--version`` starts with: the module build stamps its release (gpusteward/
#: sandbox/controllers.py VERSION_LDFLAGS), Debian's is bookworm's package.
VERSIONS = {"3": "prometheus, version 3.16.0 ", "2": "prometheus, version 2.42."}


def test_each_major_runs_the_release_it_names(tmp_path: Path, prometheus_major: str) -> None:
    for binary in PrometheusServer(tmp_path, major=prometheus_major).binaries():
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        name = Path(binary).name
        assert out.returncode == 0 and (out.stdout + out.stderr).startswith(
            VERSIONS[prometheus_major].replace("prometheus", name)), out.stdout + out.stderr


def test_history_promtool_rejects_fails_with_promtools_output(
    prometheus_factory: PrometheusFactory,  # noqa: F811
) -> None:
    with pytest.raises(PrometheusError, match="promtool backfill .* failed"):
        prometheus_factory(history_openmetrics="not openmetrics\n")


def test_a_prometheus_that_exits_at_start_fails_with_its_log(
    prometheus_factory: PrometheusFactory,  # noqa: F811
) -> None:
    with pytest.raises(
        PrometheusError, match="(?s)exited before it was ready.*not a valid duration"
    ):
        prometheus_factory(scrape_targets=["127.0.0.1:9"], scrape_interval="soon")
