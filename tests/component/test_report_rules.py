"""The report's recording rules: promtool accepts them, and on a known fleet they compute the
same figures the report does (allocated / used / idle / unknown GPUs by team and card), from
series stored as a Prometheus Operator ServiceMonitor stores them, in both honorLabels modes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpusteward.sandbox.scrape import AGENT, DCGM_EXPORTER
from tests.support.prometheus import stored_labels

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "recording-rules.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: install Debian's `prometheus` package"
    return found


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
                                                                 honor):
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
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": [{"expr": _labels(metric, labels), "eval_time": "40m",
                              "exp_samples": [{"labels": _labels(metric, labels),
                                               "value": value}]}]}]}
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    out = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _labels(metric: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{inner}}}"
