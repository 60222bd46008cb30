"""Alerts and the dashboard use metric names the apps really export, and the rules pass
`promtool check rules` (the Prometheus Operator CRDs are not served by the sandbox)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpusteward.agent import exposition
from gpusteward.agent.collect import unavailable_view
from gpusteward.extender.metrics import ExtenderMetrics
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from gpusteward.sandbox.controllers import prometheus_binaries
from tests.deploy.conftest import REPO

SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _exported() -> set[str]:
    # the agent prints every family's TYPE line, even with no GPU to report
    agent = exposition.render(unavailable_view("gpu-1", "NVML not found"))
    names = set(re.findall(r"^# TYPE (\S+) ", agent, re.MULTILINE))
    for registry in (ExtenderMetrics().registry, ReclaimerMetrics().registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + s for s in SUFFIXES)
    return names


def _used(expr: str) -> set[str]:
    return set(re.findall(r"\bgpusteward_[a-z_]+", expr))


def _rule_groups(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    [rule] = [o for o in rendered["kustomize-monitoring"]
              if o["kind"] == "PrometheusRule" and o["metadata"]["name"] == "gpusteward"]
    return rule["spec"]["groups"]


def test_promtool_accepts_the_prometheusrule_groups(
        rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    promtool = prometheus_binaries(log=lambda _: None)[1]  # 3's (GPUSTEWARD_PROMETHEUS=2: 2's)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(rendered)}))
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout


def test_alerts_cover_what_operators_must_hear_about(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    alerts = {r["alert"] for g in _rule_groups(rendered) for r in g["rules"]}
    assert alerts == {
        "GpustewardTelemetryStale", "GpustewardReclaimerTelemetryDown",
        "GpustewardReclaimerNotLeading", "GpustewardReclaimerCyclesFailing",
        "GpustewardExtenderErrors", "GpustewardExtenderSlow",
        "GpustewardEvictionsRepeatedlyBlocked", "GpustewardReclaimLedgerNotSaved",
        "GpustewardExtenderDown", "GpustewardAgentNvmlDown", "GpustewardReclaimerFenced",
        "GpustewardNotificationsFailing"}


def test_every_alert_has_a_runbook_section_in_operations_md(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    headings = re.findall(r"(?m)^#+ (Gpusteward\w+)$", (REPO / "docs/operations.md").read_text())
    base = "https://github.com/gpusteward/gpusteward/blob/main/docs/operations.md#"
    for group in _rule_groups(rendered):
        for rule in group["rules"]:
            assert rule["annotations"]["runbook_url"] == base + rule["alert"].lower()
            assert rule["alert"] in headings


def test_the_recording_rules_ship_unchanged_as_a_prometheusrule(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    source = yaml.safe_load((REPO / "deploy/prometheus/recording-rules.yaml").read_text())
    for render in ("kustomize-monitoring", "helm-variant"):
        [rule] = [o for o in rendered[render] if o["kind"] == "PrometheusRule"
                  and o["metadata"]["name"] == "gpusteward-recording-rules"]
        assert rule["spec"] == source, render


def test_alerts_name_only_metrics_the_apps_export(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    used = {m for g in _rule_groups(rendered) for r in g["rules"] for m in _used(r["expr"])}
    assert used - _exported() == set()


def test_dashboard_names_only_exported_metrics_and_shows_the_promised_panels() -> None:
    dashboard = json.loads(
        (REPO / "deploy/kustomize/monitoring/gpusteward-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert set().union(*map(_used, exprs)) - _exported() == set()
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Allocated vs used GPUs by team", "Allocated vs used GPUs by card", "Idle GPUs",
            "Unknown GPUs", "Used GPUs", "Free GPUs", "Idle cost",
            "Reclaimer actions", "Extender latency (server side)"} <= titles
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "cluster", "team", "costPerGpuHour"} <= variables
    for expr in exprs:
        for selector in re.findall(r"gpusteward_gpus\{([^}]*)\}", expr):
            assert 'cluster=~"$cluster"' in selector, expr


#: Grafana's variables as a dashboard with "All" selected would send them.
VARIABLES = {"$cluster": ".*", "$team": ".*", "$costPerGpuHour": "2", "$__rate_interval": "5m",
             "$__range": "1h"}


def _panel_expr(title: str) -> str:
    dashboard = json.loads(
        (REPO / "deploy/kustomize/monitoring/gpusteward-dashboard.json").read_text())
    [expr] = [p["targets"][0]["expr"] for p in dashboard["panels"] if p["title"] == title]
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_dashboard_stats_evaluate_as_promised_in_prometheus(tmp_path: Path) -> None:
    """`promtool test rules` runs the panels' PromQL in Prometheus's engine over series shaped
    as the reclaimer (two replicas, one leading) and kube-state-metrics export them."""
    leader = 'gpusteward_reclaimer_leader{namespace="gpusteward",pod="%s"}'
    gpus = 'gpusteward_gpus{namespace="gpusteward",pod="r0",team="ml",card="H100",state="%s"}'
    series = [
        {"series": leader % "r0", "values": "1x70"},
        {"series": leader % "r1", "values": "0x70"},
        {"series": gpus % "allocated", "values": "7x70"},
        {"series": gpus % "idle", "values": "2x70"},
        {"series": gpus % "unknown", "values": "4x70"},
        {"series": 'kube_node_status_allocatable{node="n1",resource="nvidia_com_gpu"}',
         "values": "8x70"},
        {"series": 'gpusteward_idle_gpu_seconds_total{namespace="gpusteward",pod="r0",team="ml"}',
         "values": "0+120x70"},  # 2 idle GPUs, 60 s apart: 2 GPU-hours an hour
    ]
    expected = {"Used GPUs": 1, "Unknown GPUs": 4, "Idle GPUs": 2, "Allocated GPUs": 7,
                "Free GPUs": 1, "Idle cost": 4}
    tests = {"tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": _panel_expr(title), "eval_time": "65m", "exp_samples": [{"labels": "{}",
                                                                         "value": value}]}
        for title, value in expected.items()]}]}
    _promtool_test(tests, tmp_path / "dashboard_test.yaml")


def test_the_new_alerts_fire_on_what_they_promise(
        rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """promtool's rule unit tests: no extender series for 5 min fires GpustewardExtenderDown; an
    agent whose NVML does not answer (its `gpusteward_agent_nvml_up{error=...} 0`) fires
    GpustewardAgentNvmlDown naming the node, and one that answers does not."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(rendered)}))
    nvml = 'gpusteward_agent_nvml_up{Hostname="%s",error="%s"}'
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": nvml % ("gpu-1", "DriverNotLoaded"), "values": "0x20"},
            {"series": 'gpusteward_agent_nvml_up{Hostname="gpu-2"}', "values": "1x20"},
            {"series": "gpusteward_extender_nodes", "values": "_x20"},
        ],
        "alert_rule_test": [
            {"eval_time": "12m", "alertname": "GpustewardAgentNvmlDown", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "Hostname": "gpu-1",
                               "error": "DriverNotLoaded"},
                "exp_annotations": _annotations(rendered, "GpustewardAgentNvmlDown",
                                                Hostname="gpu-1")}]},
            {"eval_time": "7m", "alertname": "GpustewardExtenderDown", "exp_alerts": [{
                "exp_labels": {"severity": "warning"},
                "exp_annotations": _annotations(rendered, "GpustewardExtenderDown")}]},
        ]}]}
    _promtool_test(tests, tmp_path / "alerts_test.yaml")


def test_the_error_alert_counts_failed_calls_not_clients_that_hung_up(
        rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """A flood of 499s (clients gone before the answer, which anyone who can connect can make)
    neither fires GpustewardExtenderErrors nor hides real failures: 10 % of calls answered 500
    beside it fire the alert, at 10 / (60 + 10) of the calls answered."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(rendered)}))
    calls = 'gpusteward_extender_requests_total{verb="filter",code="%s"}'
    flood = [{"series": calls % "200", "values": "0+60x30"},
             {"series": calls % "499", "values": "0+600x30"}]
    failing = [*flood, {"series": calls % "500", "values": "0+10x30"}]
    summary = "{{ $value | humanizePercentage }}"
    annotations = {k: v.replace(summary, "14.29%") for k, v in
                   _annotations(rendered, "GpustewardExtenderErrors").items()}
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": flood, "alert_rule_test": [
            {"eval_time": "25m", "alertname": "GpustewardExtenderErrors", "exp_alerts": []}]},
        {"interval": "1m", "input_series": failing, "alert_rule_test": [
            {"eval_time": "25m", "alertname": "GpustewardExtenderErrors", "exp_alerts": [{
                "exp_labels": {"severity": "warning"}, "exp_annotations": annotations}]}]},
    ]}
    _promtool_test(tests, tmp_path / "errors_test.yaml")


def _annotations(rendered: dict[str, list[dict[str, Any]]], alert: str,
                 **labels: str) -> dict[str, str]:
    [rule] = [r for g in _rule_groups(rendered) for r in g["rules"] if r.get("alert") == alert]
    out = dict(rule["annotations"])
    for name, value in labels.items():
        out = {k: v.replace("{{ $labels." + name + " }}", value) for k, v in out.items()}
    return out


def _promtool_test(tests: dict[str, Any], path: Path) -> None:
    """Run a promtool rule unit-test file (Prometheus's own rule engine)."""
    path.write_text(yaml.safe_dump(tests))
    promtool = prometheus_binaries(log=lambda _: None)[1]  # 3's (GPUSTEWARD_PROMETHEUS=2: 2's)
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
