"""Windows that count the same samples on Prometheus 2 and 3: 3.0 made range selectors and
lookback left-open, (t - w, t], where 2.x's are [t - w, t] (Prometheus 3.0 migration guide,
"Range selectors and lookback exclude samples coinciding with the left boundary"; CHANGELOG
3.0.0 #13904, 3.0.1 #15431 for subqueries). Timestamps are whole milliseconds, so 1 ms less on
2.x leaves out exactly the sample at the start."""

from __future__ import annotations

from gpusteward.adapters.promql import exact_range
from gpusteward.adapters.telemetry import queries
from gpusteward.core.policy import Health


def test_left_open_majors_keep_the_whole_window():
    assert exact_range(1800, left_closed=False) == "1800s"


def test_left_closed_majors_leave_out_the_starting_millisecond():
    assert exact_range(1800, left_closed=True) == "1799999ms"
    assert exact_range(0.5, left_closed=True) == "499ms"


def test_the_xid_subquery_yields_the_same_points_on_both_majors():
    window = Health().xid_window
    assert f"[{int(window)}s:" in queries(Health(), ["Hostname"])["xid"]
    assert f"[{int(window) * 1000 - 1}ms:" in queries(Health(), ["Hostname"],
                                                      left_closed=True)["xid"]
