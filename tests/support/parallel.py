"""How `make test` shares the suite between its two pytest-xdist workers (``-n 2 --dist
loadgroup --no-loadscope-reorder``): each test file is one unit of work, run whole on one
worker, so a module's own sandbox starts once and its tests keep their order.

The files that touch the host itself (container storage, real nodes and their one services
route, the chart on them) are marked ``host``: `make test` runs them after the workers, on
their own. Beside a second sandbox on two cores the chart's timed steps (a 15 s idle window
replayed from 2 s scrapes, a rolling extender) missed their marks; alone they never have.

Units go out in the order below: the long e2e files first, the short pure tiers last, where
they fill whichever worker finishes first. Without xdist the order is the same and nothing
else changes."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
HOST = "host"
HOST_FILES = {"e2e/test_chart.py", "e2e/test_real_nodes.py", "image/test_image.py"}
TIERS = ("e2e", "agent", "component", "deploy", "unit")  # what is left goes last


def unit_of(item: pytest.Item) -> tuple[int, str]:
    """(rank, unit): the rank orders the units; the unit names one worker's share."""
    path = Path(item.path).resolve().relative_to(TESTS).as_posix()
    if path in HOST_FILES:
        return 0, HOST
    tier = path.split("/", 1)[0]
    return 1 + (TIERS.index(tier) if tier in TIERS else len(TIERS)), path


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    units = {id(item): unit_of(item) for item in items}
    items.sort(key=lambda item: units[id(item)][0])  # stable: files keep their own order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(units[id(item)][1]))
        if units[id(item)][1] == HOST:
            item.add_marker(pytest.mark.host)
