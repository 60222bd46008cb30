"""The component tier runs each test that starts a real Prometheus on every major users run:
Prometheus 3 (built from its Go module) and Debian's 2.42 (what `make setup` installs), whose
left-closed windows the queries must read the same as 3's left-open ones (Prometheus 3.0
migration guide, "Range selectors and lookback exclude samples coinciding with the left
boundary"). ``-k prometheus-3`` or ``-k prometheus-2`` runs one. Module-scoped: a module's
tests run on one major, then the other, so servers its tests only read start once a major
(``module_prometheus_factory``)."""

from __future__ import annotations

import pytest

from gpusteward.sandbox.controllers import PROMETHEUS_MAJORS


@pytest.fixture(scope="module", params=PROMETHEUS_MAJORS,
                ids=[f"prometheus-{m}" for m in PROMETHEUS_MAJORS])
def prometheus_major(request: pytest.FixtureRequest) -> str:
    return str(request.param)
