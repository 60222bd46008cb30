"""`gpusteward report` against the sandbox: a known workload on the default fleet (2x8 H100,
2x8 A100, 3x4 L4) gives exact numbers; the HTML report renders its charts in headless Chromium.

The workload (one team, quota 2 GPUs, priced cards) runs longer than the 20 s window before the
report is taken, so every figure is exact: GPU-hours are GPUs x 20 s.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpusteward.sandbox.cluster import SANDBOX_POLICY
from tests.e2e.kube import Namespace, gpu_pod, wait_for_gpu_samples

WINDOW_S = 20
PREMIUM, ECONOMY = 90.0, 36.0  # $ per GPU-hour: 20 s of one GPU costs 0.50 and 0.20
HARNESS = ("import argparse, sys\n"
           "from gpusteward.report.cli import add_report_parser, run_report\n"
           "p = argparse.ArgumentParser(prog='gpusteward')\n"
           "add_report_parser(p.add_subparsers(dest='command'))\n"
           "sys.exit(run_report(p.parse_args(sys.argv[1:])))\n")


class Workload:
    def __init__(self, sandbox, ns: Namespace, team: str, policy: Path):
        self.sandbox, self.ns, self.team, self.policy = sandbox, ns, team, policy

    def report(self, *flags: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", HARNESS, "report", f"--policy={self.policy}",
               f"--window={WINDOW_S}s", "--step=1s", f"--kubeconfig={self.sandbox.kubeconfig}",
               f"--prometheus-url={self.sandbox.prometheus_url}", *flags]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out

    def json(self, by: str) -> dict:
        return json.loads(self.report("--format=json", f"--by={by}").stdout)


@pytest.fixture(scope="module")
def workload(sandbox, tmp_path_factory) -> Iterator[Workload]:
    team = f"report-{secrets.token_hex(3)}"
    policy = yaml.safe_load(SANDBOX_POLICY.read_text())
    policy["cardTiers"] = [
        {"name": "premium", "products": ["NVIDIA-H100*"], "costPerGpuHour": PREMIUM},
        {"name": "standard", "products": ["NVIDIA-A100*"]},
        {"name": "economy", "products": ["NVIDIA-L4"], "costPerGpuHour": ECONOMY}]
    policy["teams"][team] = {"quotaGpus": 2}
    path = tmp_path_factory.mktemp("report") / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    ns = Namespace(sandbox.api(), team)
    ns.create()
    labels = {"gpusteward.io/team": team}
    ns.create_pod(gpu_pod("busy", 2, node="h100-0", util="80", labels=labels))
    ns.running("busy")
    time.sleep(1.5)  # created a second before the others: it holds the quota, they borrow
    ns.create_pod(gpu_pod("idle", 1, node="h100-0", util="0", labels=labels))
    ns.create_pod(gpu_pod("cheap", 1, node="l4-0", util="0", labels=labels))
    ns.create_pod(gpu_pod("waiting", 9, labels=labels))  # no node has 9 GPUs: it queues
    for name in ("busy", "idle", "cheap"):
        ns.running(name)
    wait_for_gpu_samples(sandbox.prometheus_url, team, ["busy", "idle", "cheap"], settle=0)
    time.sleep(WINDOW_S + 4)  # the whole window after the pods started, plus scrape slack
    yield Workload(sandbox, ns, team, path)
    ns.delete()


def hours(gpus: float) -> float:
    return round(gpus * WINDOW_S / 3600, 4)


def test_a_known_workload_gives_exact_numbers_by_team(workload):
    doc = workload.json("team")
    assert doc["telemetry"] == {"ok": True, "problem": ""}
    (mine,) = [g for g in doc["groups"] if g["name"] == workload.team]
    assert {k: mine[k] for k in ("allocatable", "allocated", "used", "idle", "unknown", "free",
                                 "active_ratio", "allocated_gpu_hours", "idle_gpu_hours",
                                 "unknown_gpu_hours", "idle_cost")} == {
        "allocatable": None, "allocated": 4.0, "used": 2.0, "idle": 2.0, "unknown": 0.0,
        "free": None, "active_ratio": 0.5, "allocated_gpu_hours": hours(4),
        "idle_gpu_hours": hours(2), "unknown_gpu_hours": 0.0, "idle_cost": 0.7}
    assert mine["mean_util_percent"] == 40.0  # 2 GPUs at 80 %, 2 at 0 %
    idle = {p["pod"]: p for p in doc["top_idle_pods"] if p["namespace"] == workload.team}
    assert set(idle) == {"idle", "cheap"}
    assert idle["idle"]["idle_cost"] == 0.5 and idle["cheap"]["idle_cost"] == 0.2
    for p in idle.values():
        assert (p["owner"], p["state"], p["idle_gpu_hours"]) == (
            f"Pod/{p['pod']}", "idle", hours(1))
        assert p["reclaimer"]["state"] == "idle" and p["reclaimer"]["action"] == "mark"
        assert "peak 0% < 5%" in p["reclaimer"]["why"]
    (queued,) = [g for g in doc["queue"]["by_team_class"] if g["team"] == workload.team]
    assert (queued["class"], queued["pods"], queued["gpus"]) == ("batch", 1, 9)
    (quota,) = [q for q in doc["quotas"] if q["team"] == workload.team]
    assert quota == {"team": workload.team, "quota": 2, "used": 4.0, "borrowed": 2.0,
                     "idle_within_quota": 0.0, "idle_borrowed": 2.0}


def test_card_groups_show_the_fleets_allocatable_gpus(workload):
    doc = workload.json("card")
    cards = {g["name"]: g for g in doc["groups"]}
    assert {n: g["allocatable"] for n, g in cards.items()} == {
        "NVIDIA-H100-80GB-HBM3": 16.0, "NVIDIA-A100-SXM4-80GB": 16.0, "NVIDIA-L4": 12.0}
    assert doc["totals"]["allocatable"] == 44.0
    for g in cards.values():
        assert g["free"] == g["allocatable"] - g["allocated"]


def test_the_table_and_csv_carry_the_same_totals(workload):
    out = workload.report("--by=team")
    assert workload.team in out.stdout and "total" in out.stdout
    assert "Top idle pods" in out.stdout and f"{workload.team}/idle" in out.stdout
    assert "range query 1/1 done" in out.stderr  # the progress indicator (not a terminal)
    rows = workload.report("--format=csv", "--by=team").stdout.splitlines()
    assert rows[0].startswith("team,allocatable,allocated,used,idle")
    assert rows[-1].startswith("total,44.0,")


def test_the_html_report_renders_its_charts_in_headless_chromium(workload, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is missing: install Debian's `chromium` package"
    page = tmp_path / "report.html"
    workload.report("--format=json", f"--html={page}")
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1400,2000",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert dom.count('class="chart timeline"') >= 2  # at least one team and one card chart
    assert 'class="chart idle-hours"' in dom and "<polygon" in dom
    assert workload.team in dom
    for bad in ("Traceback", "Error", "NaN", "undefined"):
        assert bad not in dom
    assert shot.stat().st_size > 10_000
    print(f"\nHTML report screenshot: {shot}")


def test_a_report_without_telemetry_is_written_and_exits_3(sandbox, tmp_path):
    """A cron job or CSV export tells a failed report from an empty one by the exit code
    (docs/report.md): Prometheus down, the real API server up."""
    with socket.socket() as s:  # a port nothing listens on: Prometheus down
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    out = subprocess.run(
        [sys.executable, "-m", "gpusteward", "report", "--format=csv", "--window=60s",
         f"--kubeconfig={sandbox.kubeconfig}", f"--prometheus-url={down}"],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 3, out.stderr
    assert out.stdout.splitlines()[0].startswith("team,allocatable,allocated,used,idle")
    assert out.stderr.splitlines()[-1].startswith(
        f"gpusteward report: telemetry unavailable, usage shown as unknown: prometheus at "
        f"{down}: unreachable: ")
