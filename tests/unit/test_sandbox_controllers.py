"""Which optional controllers `sandbox up --with` starts, and in what order
(gpusteward.sandbox.controllers): Trainer runs every TrainJob as a JobSet, so JobSet's controller
must be up before it."""

from __future__ import annotations

import pytest

from gpusteward.sandbox.cli import CONTROLLER_NAMES
from gpusteward.sandbox.controllers import CONTROLLERS, NEEDS, STARTERS, with_needs


@pytest.mark.parametrize(
    ("asked", "started"),
    [
        pytest.param(("trainer",), ("jobset", "trainer"), id="trainer-brings-jobset-first"),
        pytest.param(("jobset", "trainer"), ("jobset", "trainer"), id="named-twice-started-once"),
        pytest.param(("trainer", "jobset", "kueue"), ("jobset", "trainer", "kueue"),
                     id="order-kept-otherwise"),
        pytest.param((), (), id="none"),
    ],
)
def test_each_controller_starts_once_after_what_it_needs(asked, started):
    assert with_needs(asked) == started


def test_every_controller_can_be_started_and_needs_only_known_ones():
    assert STARTERS.keys() == CONTROLLERS.keys()
    assert all(n in CONTROLLERS for needs in NEEDS.values() for n in needs)


def test_sandbox_up_with_offers_exactly_the_controllers_that_can_be_built():
    assert tuple(CONTROLLERS) == CONTROLLER_NAMES
