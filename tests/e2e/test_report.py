"""`gpusteward report` against the sandbox: a known workload on the default fleet (2x8 H100,
2x8 A100, 3x4 L4) gives exact numbers; the HTML report renders its charts in headless Chromium.

The workload (one team, quota 2 GPUs, priced cards) runs longer than the 20 s window before the
report is taken, so every figure is exact: GPU-hours are GPUs x 20 s.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.e2e import scenarios
from tests.e2e.scenarios import Workload, report_workload


@pytest.fixture(scope="module")
def workload(sandbox, tmp_path_factory) -> Iterator[Workload]:
    with report_workload(sandbox, tmp_path_factory.mktemp("report")) as w:
        yield w


def test_a_known_workload_gives_exact_numbers_by_team(workload):
    scenarios.a_known_workload_gives_exact_numbers_by_team(workload)


def test_card_groups_show_the_fleets_allocatable_gpus(workload):
    doc = workload.json("card")
    cards = {g["name"]: g for g in doc["groups"]}
    # Physical GPUs: a100-mig-0's 14 MIG 1g.10gb slices are its 2 A100s, t4-0's 8 replicas
    # its 2 T4s.
    assert {n: g["allocatable"] for n, g in cards.items()} == {
        "NVIDIA-H100-80GB-HBM3": 16.0, "NVIDIA-A100-SXM4-80GB": 18.0, "NVIDIA-L4": 12.0,
        "Tesla-T4-SHARED": 2.0}
    assert doc["totals"]["allocatable"] == 48.0
    for g in cards.values():
        assert g["free"] == g["allocatable"] - g["allocated"]


def test_the_table_and_csv_carry_the_same_totals(workload):
    out = workload.report("--by=team")
    assert workload.team in out.stdout and "total" in out.stdout
    assert "Top idle pods" in out.stdout and f"{workload.team}/idle" in out.stdout
    assert "range query 1/1 done" in out.stderr  # the progress indicator (not a terminal)
    rows = workload.report("--format=csv", "--by=team").stdout.splitlines()
    assert rows[0].startswith("team,allocatable,allocated,used,idle")
    assert rows[-1].startswith("total,48.0,")


# Written into a copy of the page only (the report itself has no script): how wide the laid-out
# page is, read back from the DOM Chromium dumps.
WIDTH_PROBE = ('<script>document.body.dataset.scrollWidth = '
               'document.documentElement.scrollWidth</script></body>')


def test_the_html_report_renders_its_charts_in_headless_chromium(workload, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is missing: install Debian's `chromium` package"
    page = tmp_path / "report.html"
    workload.report("--format=json", f"--html={page}", "--cluster-name=sandbox-eu",
                    "--currency=€")
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,2400"]
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=120, check=True)
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert dom.count('class="chart timeline"') >= 2  # at least one team and one card chart
    assert 'class="chart idle-hours"' in dom and "<polygon" in dom
    assert workload.team in dom
    for bad in ("Traceback", "Error", "NaN", "undefined"):
        assert bad not in dom
    # the headline: the workload's 2 idle GPUs of 4 and their cost (0.50 + 0.20) among the
    # fleet's; the cluster's name; costs in the currency asked for
    assert "<h1>GPU fleet report for sandbox-eu</h1>" in dom
    assert re.search(r'<div class="kpi">Idle GPUs<b>\d+ of \d+</b>', dom)
    assert re.search(r'<div class="kpi">Idle cost<b>€\d[\d,]*\.\d\d</b>', dom)
    assert "<th>IDLE €</th>" in dom
    # dated UTC ticks: a date under the first tick of each chart, the report's own day among them
    dates = re.findall(r'fill="#666">(\d{4}-\d\d-\d\d)</text>', dom)
    assert len(dates) >= dom.count('class="chart timeline"')
    assert time.strftime("%Y-%m-%d", time.gmtime()) in dates
    # at 1,000 px nothing runs off to the right
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", WIDTH_PROBE))
    laid_out = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True,
                              text=True, timeout=120, check=True).stdout
    width = re.search(r'data-scroll-width="(\d+)"', laid_out)
    assert width and int(width.group(1)) <= 1000, width
    assert shot.stat().st_size > 10_000
    print(f"\nHTML report screenshot (1000 px wide): {shot}")


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
