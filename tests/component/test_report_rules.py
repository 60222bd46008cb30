"""The report's recording rules: promtool accepts them, and on a known fleet they compute the
same figures the report does (allocated / used / idle / unknown GPUs by team and card), from
series stored as a Prometheus Operator ServiceMonitor stores them, in both honorLabels modes;
MIG (mixed and single strategy) and time-sliced nodes counted in physical GPUs as the report
counts them (gpusteward/core/sharing.py)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from gpusteward.core.cards import PRODUCT_LABEL
from gpusteward.core.model import Node
from gpusteward.core.sharing import REPLICAS_LABEL, node_physical_gpus, physical
from gpusteward.sandbox.controllers import PROMETHEUS_ENV, prometheus_binaries
from gpusteward.sandbox.scrape import AGENT, DCGM_EXPORTER
from tests.support.prometheus import stored_labels

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "recording-rules.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(autouse=True)
def _each_major(prometheus_major: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here on each Prometheus major's promtool (its rule engine is Prometheus's)."""
    monkeypatch.setenv(PROMETHEUS_ENV, prometheus_major)


def promtool() -> str:
    return prometheus_binaries(log=lambda _: None)[1]


def test_promtool_accepts_the_recording_rules():
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _pod(ns: str, name: str, gpus: int, team: str) -> dict[str, str]:
    sel = f'namespace="{ns}",pod="{name}"'
    return {
        f'kube_pod_container_resource_requests{{{sel},node="h100-0",resource="nvidia_com_gpu",'
        f'container="main"}}': f"{gpus}+0x60",
        f'kube_pod_status_phase{{{sel},phase="Running"}}': "1+0x60",
        f'kube_pod_labels{{{sel},label_gpusteward_io_team="{team}"}}': "1+0x60",
    }


def _scraped(metric: str, exposed: list[tuple[str, str]], honor: bool, exporter=DCGM_EXPORTER,
             node: str = "h100-0") -> str:
    target = {**exporter.target_labels(node), "instance": f"{node}:9400"}
    labels = stored_labels(exposed, target, honor)
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def _gpu(index: int, pod: str | None = None) -> list[tuple[str, str]]:
    """dcgm-exporter's label order (gpusteward/core/dcgm.py): device labels, then the pod's."""
    held = [("container", "main"), ("namespace", "ml"), ("pod", pod)] if pod else []
    return [("gpu", str(index)), ("UUID", f"GPU-{index}"), ("Hostname", "h100-0"), *held]


def _as_dcgm47(series: Mapping[str, str]) -> dict[str, str]:
    """The same fleet from dcgm-exporter 4.9 (DCGM 4.7): utilization as the 0-1
    DCGM_FI_DEV_GPU_UTIL_RATIO (DCGM's dcgm_fields.h, field 1613)."""
    def ratio(values: str) -> str:
        start, _, rest = values.partition("+")
        return f"{float(start) / 100:g}+{rest}"
    return {(k.replace("DCGM_FI_DEV_GPU_UTIL{", "DCGM_FI_DEV_GPU_UTIL_RATIO{", 1)
             if k.startswith("DCGM_FI_DEV_GPU_UTIL{") else k):
            (ratio(v) if k.startswith("DCGM_FI_DEV_GPU_UTIL{") else v) for k, v in series.items()}


@pytest.mark.parametrize("exporter", ["4.8", "4.9"], ids=["dcgm-exporter-4.8", "dcgm-exporter-4.9"])
@pytest.mark.parametrize("honor", [pytest.param(False, id="honorLabels-false"),
                                   pytest.param(True, id="honorLabels-true")])
@pytest.mark.parametrize(("metric", "labels", "value"), [
    pytest.param("gpusteward:team_gpus:allocated", {"team": "vision"}, 3, id="team-allocated"),
    pytest.param("gpusteward:team_gpus:used", {"team": "vision"}, 2, id="team-used"),
    pytest.param("gpusteward:team_gpus:idle", {"team": "vision"}, 1, id="team-idle"),
    pytest.param("gpusteward:team_gpus:unknown", {"team": "ml"}, 1, id="no-samples-is-unknown"),
    pytest.param("gpusteward:card_gpus:allocatable", {"card": H100}, 8, id="card-allocatable"),
    pytest.param("gpusteward:card_gpus:allocated", {"card": H100}, 6, id="card-allocated"),
    pytest.param("gpusteward:card_gpus:idle", {"card": H100}, 2, id="card-idle"),
    # One GPU shared by two pods (time-slicing): each judged by the agent's per-pod reading.
    pytest.param("gpusteward:team_gpus:used", {"team": "share"}, 1, id="shared-busy-pod-used"),
    pytest.param("gpusteward:team_gpus:idle", {"team": "share"}, 1, id="shared-idle-pod-idle"),
])
def test_the_rules_compute_the_reports_figures_on_a_known_fleet(tmp_path, metric, labels, value,
                                                                 honor, exporter):
    series = {
        **_pod("ml", "busy", 2, "vision"), **_pod("ml", "idle", 1, "vision"),
        **_pod("ml", "dark", 1, ""),  # no team label: its namespace; no DCGM samples: unknown
        **_pod("ml", "sa", 1, "share"), **_pod("ml", "sb", 1, "share"),
        'kube_node_status_allocatable{node="h100-0",resource="nvidia_com_gpu"}': "8+0x60",
        f'kube_node_labels{{node="h100-0",label_nvidia_com_gpu_product="{H100}"}}': "1+0x60",
        _scraped("DCGM_FI_DEV_GPU_UTIL", _gpu(0, "busy"), honor): "80+0x60",
        _scraped("DCGM_FI_DEV_GPU_UTIL", _gpu(1, "busy"), honor): "0+0x60",
        _scraped("DCGM_FI_DEV_GPU_UTIL", _gpu(2, "idle"), honor): "0+0x60",
        # A free GPU at 90 %: under either mode it names the exporter's pod, which holds none.
        _scraped("DCGM_FI_DEV_GPU_UTIL", _gpu(4), honor): "90+0x60",
        # The agent on a shared GPU: the device series without pod labels, one series per pod.
        _scraped("DCGM_FI_DEV_GPU_UTIL", _gpu(3), honor, AGENT): "60+0x60",
        _scraped("gpusteward_pod_gpu_util", _gpu(3, "sa"), honor, AGENT): "60+0x60",
        _scraped("gpusteward_pod_gpu_util", _gpu(3, "sb"), honor, AGENT): "0+0x60",
    }
    if exporter == "4.9":
        series = _as_dcgm47(series)
    _promtool_test(tmp_path, series, _labels(metric, labels), _labels(metric, labels), value)


def _promtool_test(tmp_path: Path, series: Mapping[str, str], expr: str, labels: str,
                   value: float) -> None:
    """Evaluate `expr` 40 minutes into 1m samples of `series`: one sample, `labels`, `value`."""
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": [{"expr": expr, "eval_time": "40m",
                              "exp_samples": [{"labels": labels, "value": value}]}]}]}
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    out = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _labels(metric: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{inner}}}"


# MIG and time-slicing. Node labels and allocatable as GFD and the device plugin publish them
# (k8s-device-plugin internal/lm/resource.go, mig-strategy.go: the -MIG-<profile> and -SHARED
# product suffixes, nvidia.com/gpu.replicas, 0 on MIG-enabled GPUs, nvidia.com/gpu.shared with
# renameByDefault), as kube-state-metrics exports them: resource names through its
# sanitizeLabelName, every character outside [a-zA-Z0-9_] an underscore, unit "integer" for an
# extended resource (internal/store/pod.go, node.go), node labels as label_<sanitized name>.
A100 = "NVIDIA-A100-SXM4-80GB"
A30_SINGLE = "NVIDIA-A30-MIG-1g.6gb"
T4_SHARED = "Tesla-T4-SHARED"
L4 = "NVIDIA-L4"
NODES = {n.name: n for n in (
    Node("a100-0", A100, 9, {PRODUCT_LABEL: A100, REPLICAS_LABEL: "0"},  # MIG mixed
         resources={"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2}),
    Node("a30-0", A30_SINGLE, 4, {PRODUCT_LABEL: A30_SINGLE}),  # MIG single: 4 x 1g of 4 slices
    Node("t4-0", T4_SHARED, 8, {PRODUCT_LABEL: T4_SHARED, REPLICAS_LABEL: "4"}),  # 2 GPUs x 4
    Node("l4-0", L4, 12, {PRODUCT_LABEL: L4, REPLICAS_LABEL: "12"},  # renamed, 2-digit replicas
         resources={"nvidia.com/gpu.shared": 12}),
)}
# (namespace, name, node, request, team)
PODS = [
    ("ml", "mig-busy", "a100-0", {"nvidia.com/mig-3g.40gb": 1}, "mig"),
    ("ml", "mig-idle", "a100-0", {"nvidia.com/mig-1g.10gb": 1}, "mig"),
    ("ml", "single", "a30-0", {"nvidia.com/gpu": 1}, "single"),
    ("ml", "ts-busy", "t4-0", {"nvidia.com/gpu": 1}, "ts"),
    ("ml", "ts-idle", "t4-0", {"nvidia.com/gpu": 1}, "ts"),
    ("ml", "l4", "l4-0", {"nvidia.com/gpu.shared": 3}, "renamed"),
]


def _ksm(resource: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", resource)


def _shared_fleet(honor: bool) -> dict[str, str]:
    series: dict[str, str] = {}
    for n in NODES.values():
        labels = ",".join(f'label_{_ksm(k)}="{v}"' for k, v in sorted(n.labels.items()))
        series[f'kube_node_labels{{node="{n.name}",{labels}}}'] = "1+0x60"
        for resource, count in (n.resources or {"nvidia.com/gpu": n.gpus}).items():
            series[f'kube_node_status_allocatable{{node="{n.name}",resource="{_ksm(resource)}",'
                   f'unit="integer"}}'] = f"{count}+0x60"
    for ns, name, node, request, team in PODS:
        sel = f'namespace="{ns}",pod="{name}"'
        for resource, count in request.items():
            series[f'kube_pod_container_resource_requests{{{sel},node="{node}",'
                   f'resource="{_ksm(resource)}",unit="integer",container="main"}}'] = \
                f"{count}+0x60"
        series[f'kube_pod_status_phase{{{sel},phase="Running"}}'] = "1+0x60"
        series[f'kube_pod_labels{{{sel},label_gpusteward_io_team="{team}"}}'] = "1+0x60"

    def held(node: str, index: int, pod: str, mig: tuple[str, str] | None = None):
        instance = [("GPU_I_PROFILE", mig[0]), ("GPU_I_ID", mig[1])] if mig else []
        return [("gpu", str(index)), ("UUID", f"GPU-{node}-{index}"), *instance,
                ("Hostname", node), ("container", "main"), ("namespace", "ml"), ("pod", pod)]

    busy, idle = held("a100-0", 1, "mig-busy", ("3g.40gb", "1")), \
        held("a100-0", 0, "mig-idle", ("1g.10gb", "7"))
    series.update({
        # A MIG instance: engine activity is its reading; this exporter prints GPU_UTIL 0 for
        # the busy one (NVIDIA/dcgm-exporter#216) and none for the idle one (#50).
        _scraped("DCGM_FI_PROF_GR_ENGINE_ACTIVE", busy, honor, node="a100-0"): "0.6+0x60",
        _scraped("DCGM_FI_DEV_GPU_UTIL", busy, honor, node="a100-0"): "0+0x60",
        _scraped("DCGM_FI_PROF_GR_ENGINE_ACTIVE", idle, honor, node="a100-0"): "0.01+0x60",
        # Single strategy: the instance is labelled the same way, only the resource differs.
        _scraped("DCGM_FI_PROF_GR_ENGINE_ACTIVE", held("a30-0", 0, "single", ("1g.6gb", "3")),
                 honor, node="a30-0"): "0.5+0x60",
        # Time-sliced: one series per physical GPU, named after one pod holding a replica.
        _scraped("DCGM_FI_DEV_GPU_UTIL", held("t4-0", 0, "ts-busy"), honor, node="t4-0"):
            "70+0x60",
        _scraped("DCGM_FI_DEV_GPU_UTIL", held("t4-0", 1, "ts-idle"), honor, node="t4-0"):
            "0+0x60",
    })
    return series


def _pod_gpus(*names: str) -> float:
    """Physical GPUs of the pods as the report counts them (core/report/facts.py)."""
    return sum(physical(request, sum(request.values()), NODES[node])
               for _, name, node, request, _ in PODS if name in names)


@pytest.mark.parametrize("honor", [pytest.param(False, id="honorLabels-false"),
                                   pytest.param(True, id="honorLabels-true")])
@pytest.mark.parametrize(("metric", "labels", "value"), [
    *(pytest.param("gpusteward:card_gpus:allocatable", {"card": n.product},
                   node_physical_gpus(n), id=f"allocatable-{n.name}") for n in NODES.values()),
    pytest.param("gpusteward:team_gpus:allocated", {"team": "mig"},
                 _pod_gpus("mig-busy", "mig-idle"), id="mig-allocated"),
    # GPU_UTIL 0 must not hide its engine activity: the busy instance is used.
    pytest.param("gpusteward:team_gpus:used", {"team": "mig"}, _pod_gpus("mig-busy"),
                 id="mig-busy-used"),
    pytest.param("gpusteward:team_gpus:idle", {"team": "mig"}, _pod_gpus("mig-idle"),
                 id="mig-idle-idle"),
    pytest.param("gpusteward:card_gpus:used", {"card": A30_SINGLE}, _pod_gpus("single"),
                 id="mig-single-used"),
    pytest.param("gpusteward:team_gpus:used", {"team": "ts"}, _pod_gpus("ts-busy"),
                 id="time-sliced-used"),
    pytest.param("gpusteward:team_gpus:idle", {"team": "ts"}, _pod_gpus("ts-idle"),
                 id="time-sliced-idle"),
    pytest.param("gpusteward:card_gpus:allocated", {"card": T4_SHARED},
                 _pod_gpus("ts-busy", "ts-idle"), id="time-sliced-allocated"),
    pytest.param("gpusteward:card_gpus:allocated", {"card": L4}, _pod_gpus("l4"),
                 id="renamed-shared-allocated"),
])
def test_the_rules_count_mig_and_time_sliced_gpus_as_the_report_does(tmp_path, metric, labels,
                                                                     value, honor):
    assert 0 < value < 3  # fractions of GPUs: a count of units would differ
    expr = f"abs({_labels(metric, labels)} - {value!r}) < bool 1e-9"
    _promtool_test(tmp_path, _shared_fleet(honor), expr, _labels("", labels), 1)
