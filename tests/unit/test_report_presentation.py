"""The report as a finance or platform lead reads it: a headline, the cluster's name, the
currency, dated UTC axes, one y scale per dimension, and the text table's formats in the HTML.
Reports come from the pure report (tests/unit/test_report.py's fleet and helpers)."""

from __future__ import annotations

import re

import pytest

from gpusteward.core.report.axes import Tick, shared_top, time_ticks
from gpusteward.core.report.model import TeamQuota
from gpusteward.core.times import ago
from gpusteward.report.html import to_html
from gpusteward.report.render import Presentation, headline, quota_cells, to_table
from tests.unit.test_report import BUSY, HOURS, NOW, ZERO, pod, report, samples

DAY = 86_400
MIDNIGHT = 1_764_460_800.0  # 2025-11-30T00:00:00Z


@pytest.mark.parametrize(("start", "end", "expected"), [
    pytest.param(MIDNIGHT - 6 * 3600, MIDNIGHT + 18 * 3600, [
        Tick(MIDNIGHT - 6 * 3600, "18:00", "2025-11-29"), Tick(MIDNIGHT, "00:00", "2025-11-30"),
        Tick(MIDNIGHT + 6 * 3600, "06:00", ""), Tick(MIDNIGHT + 12 * 3600, "12:00", ""),
        Tick(MIDNIGHT + 18 * 3600, "18:00", "")], id="24h-names-each-day-once"),
    pytest.param(MIDNIGHT + 47, MIDNIGHT + 67, [
        Tick(MIDNIGHT + 50, "00:00:50", "2025-11-30"), Tick(MIDNIGHT + 55, "00:00:55", ""),
        Tick(MIDNIGHT + 60, "00:01:00", ""), Tick(MIDNIGHT + 65, "00:01:05", "")],
        id="20s-in-seconds-on-round-times"),
    pytest.param(MIDNIGHT - 7 * DAY, MIDNIGHT, [
        Tick(MIDNIGHT - 6 * DAY, "2025-11-24", ""), Tick(MIDNIGHT - 4 * DAY, "2025-11-26", ""),
        Tick(MIDNIGHT - 2 * DAY, "2025-11-28", ""), Tick(MIDNIGHT, "2025-11-30", "")],
        id="a-week-in-dates"),
])
def test_time_ticks_fall_on_round_utc_times_and_name_the_date(start, end, expected):
    assert time_ticks(start, end) == expected


@pytest.mark.parametrize("seconds", [20, 3600, 6 * 3600, DAY, 7 * DAY, 30 * DAY])
def test_time_ticks_stay_few_and_inside_the_window(seconds):
    ticks = time_ticks(NOW - seconds, NOW, most=4)
    assert 2 <= len(ticks) <= 4
    assert all(NOW - seconds <= t.at <= NOW for t in ticks)
    assert ticks[0].date or re.fullmatch(r"\d{4}-\d\d-\d\d", ticks[0].clock)


@pytest.mark.parametrize(("values", "top"), [
    ([], 1.0), ([0.0], 1.0), ([0.5], 1.0), ([1.0, 3.0], 5.0), ([8.0], 10.0), ([10.5], 20.0),
    ([120.0], 200.0)])
def test_charts_side_by_side_share_a_round_y_maximum(values, top):
    assert shared_top(values) == top


@pytest.mark.parametrize(("currency", "amount", "text"), [
    ("$", 1234.5, "$1,234.50"), ("€", 3.0, "€3.00"), ("EUR", 12.0, "EUR 12.00"),
    ("CHF", 0.704, "CHF 0.70"), ("$", None, "-")])
def test_money_names_the_currency_as_written(currency, amount, text):
    assert Presentation(currency=currency).money(amount) == text


def _fleet():
    """Team vision: 1 busy and 2 idle GPUs on $3 H100s; team small: 1 idle GPU."""
    pods = [pod("busy"), pod("idle", 2), pod("lone", team="small"),
            pod("waiting", 1, node=None, started=NOW - 3725)]
    series = [samples("busy", BUSY), samples("idle", ZERO), samples("idle", ZERO, gpu="1"),
              samples("lone", ZERO, gpu="2")]
    return report(pods, series)


def test_the_headline_gives_idle_gpus_and_their_cost_over_the_window():
    r = _fleet()
    assert headline(r, Presentation(currency="€")) == [
        ("Idle GPUs", "3 of 4", "allocated GPUs idle all 10m"),
        ("Idle GPU-hours", f"{3 * HOURS:,.2f}", f"of {4 * HOURS:,.2f} allocated in the last 10m"),
        ("Idle cost", f"€{3 * HOURS * 3.0:,.2f}", "last 10m")]


def test_the_headline_says_unknown_when_telemetry_failed():
    r = report([pod("a")], [], telemetry_ok=False, range_ok=False)
    assert [value for _, value, _ in headline(r, Presentation())] == ["unknown"] * 3


def test_the_html_has_the_cluster_currency_headline_and_the_tables_formats():
    r = _fleet()
    look = Presentation(cluster="prod-eu-1", currency="EUR")
    page = to_html(r, look)
    assert "<title>GPU fleet report for prod-eu-1</title>" in page
    assert "<h1>GPU fleet report for prod-eu-1</h1>" in page
    assert '<div class="kpi">Idle cost<b>EUR 1.50</b>' in page  # 3 GPUs x 10 min x EUR 3
    assert "<th>IDLE EUR</th>" in page and "IDLE $" not in page
    # the queue's wait as the text table writes it (1h02m), not in seconds
    assert "<td class=n>1h02m</td>" in page and "1h02m" in to_table(r, look)
    assert ago(3725) == "1h02m"
    assert to_table(r, look).startswith("GPU fleet report for prod-eu-1: 10m window")


def test_team_charts_share_one_y_scale_and_carry_dated_utc_ticks():
    page = to_html(_fleet())
    team_section = page.split("GPUs by team")[1].split("GPUs by card")[0]
    charts = re.findall(r'<svg class="chart timeline".*?</svg>', team_section)
    assert len(charts) == 2  # vision (3 GPUs) and small (1 GPU)
    tops = [max(float(v) for v in re.findall(r'text-anchor="end">([\d.]+)</text>', c))
            for c in charts]
    assert tops == [5.0, 5.0]
    for chart in charts:
        dates = re.findall(r">(\d{4}-\d\d-\d\d)</text>", chart)
        clocks = re.findall(r">(\d\d:\d\d(?::\d\d)?)</text>", chart)
        assert dates == ["2027-01-15"] and len(clocks) >= 2


def test_fractional_team_gpus_print_like_the_card_table():
    # A MIG 1g.10gb slice is 1/7 of its card (core/sharing.py): 24 whole GPUs and one slice.
    cells = quota_cells(TeamQuota("demo", None, 24 + 1 / 7, 0.0, 1 / 7, 0.0))
    assert cells == ["demo", "-", "24.14", "0", "0.14", "0"]
