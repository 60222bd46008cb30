"""Alerts and the dashboard use metric names the apps really export, and the rules pass
`promtool check rules` (the Prometheus Operator CRDs are not served by the sandbox)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpusteward.extender.metrics import ExtenderMetrics
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from tests.deploy.conftest import REPO

SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _exported() -> set[str]:
    names: set[str] = set()
    for registry in (ExtenderMetrics().registry, ReclaimerMetrics().registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + s for s in SUFFIXES)
    return names


def _used(expr: str) -> set[str]:
    return set(re.findall(r"\bgpusteward_[a-z_]+", expr))


def _rule_groups(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    [rule] = [o for o in rendered["kustomize-monitoring"] if o["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def test_promtool_accepts_the_prometheusrule_groups(
        rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(rendered)}))
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_alerts_cover_what_operators_must_hear_about(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    alerts = {r["alert"] for g in _rule_groups(rendered) for r in g["rules"]}
    assert alerts == {
        "GpustewardTelemetryStale", "GpustewardReclaimerTelemetryDown",
        "GpustewardReclaimerNotLeading", "GpustewardReclaimerCyclesFailing",
        "GpustewardExtenderErrors", "GpustewardExtenderSlow",
        "GpustewardEvictionsRepeatedlyBlocked", "GpustewardReclaimLedgerNotSaved",
        "GpustewardReclaimerFenced"}


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
            "Reclaimer actions", "Extender latency (server side)"} <= titles
