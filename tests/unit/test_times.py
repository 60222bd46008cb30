"""The one timestamp format: RFC 3339 in UTC to the second, as the API server writes
``metav1.Time`` (k8s.io/apimachinery/pkg/apis/meta/v1/time.go: ``time.RFC3339``, UTC)."""

from __future__ import annotations

import pytest

from gpusteward.core.times import parse_time, stamp

NOW = 1_764_508_074.0  # 2025-11-30T13:07:54Z


def test_stamp_writes_utc_to_the_second():
    assert stamp(NOW) == "2025-11-30T13:07:54Z"
    assert stamp(NOW + 0.9) == "2025-11-30T13:07:54Z"  # fractions dropped, never rounded up


@pytest.mark.parametrize("text", [
    pytest.param("2025-11-30T13:07:54Z", id="api-server"),
    pytest.param("2025-11-30T14:07:54+01:00", id="offset"),
    pytest.param("2025-11-30T13:07:54.000000Z", id="microtime"),
])
def test_parse_time_reads_what_the_api_server_and_stamp_write(text):
    assert parse_time(text) == NOW


def test_parse_time_absent_is_none_and_garbage_is_an_error():
    assert parse_time(None) is None
    assert parse_time("") is None
    with pytest.raises(ValueError):
        parse_time("yesterday")
