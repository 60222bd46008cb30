"""Bad telemetry never crashes a refresh nor looks fresh (issue 13 item 7, issue 12).

Results are in the shape of Prometheus's instant-query API (``/api/v1/query``: a vector of
``{"metric": {labels}, "value": [unix_time, "sample as a string"]}``, with NaN and ±Inf spelled
``"NaN"``, ``"+Inf"``, ``"-Inf"``: prometheus/docs/querying/api.md, "Expression query result
formats"). The real server serving such samples is in tests/component.
"""

from __future__ import annotations

import random

import pytest

from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.fleet import FleetStore
from gpusteward.core.model import GpuReading, Telemetry
from gpusteward.core.policy import parse_policy
from gpusteward.extender.app import Extender
from gpusteward.extender.view import PlacementView
from tests.factories import H100, NOW, node, readings

POLICY = parse_policy({})


def sample(node_name: str, gpu: str, value: str, **labels: str) -> dict:
    return {"metric": {"Hostname": node_name, "gpu": gpu, **labels}, "value": [NOW, value]}


def source() -> PrometheusSource:
    return PrometheusSource.at("http://127.0.0.1:1", POLICY.telemetry, POLICY.health,
                            clock=lambda: NOW)


def results(util: list[dict]) -> dict[str, list[dict]]:
    return {"util": util,
            "util_at": [sample("n1", g, str(NOW - 5)) for g in ("0", "1")],
            "xid": [sample("n1", "0", "0"), sample("n1", "1", "0")]}


def test_duplicates_for_one_gpu_give_the_same_reading_in_any_order():
    util = [sample("n1", "0", "0.2", pod="a"), sample("n1", "0", "0.9", pod="a"),
            sample("n1", "1", "0.5")]
    seen = set()
    for seed in range(10):
        shuffled = util[:]
        random.Random(seed).shuffle(shuffled)
        src = source()
        telemetry = src.assemble(results(shuffled))
        seen.add(tuple((r.gpu, r.util) for r in telemetry.for_node("n1")))
        assert src.last_dropped == {"duplicate": 1}
    assert seen == {(("0", 0.9), ("1", 0.5))}


@pytest.mark.parametrize(("value", "reason"), [
    ("NaN", "not_finite"), ("+Inf", "not_finite"), ("-Inf", "not_finite"),
    ("-0.05", "out_of_range"), ("2.5", "out_of_range"), ("x", "malformed")])
def test_an_unusable_utilization_drops_only_its_gpu(value, reason):
    src = source()
    telemetry = src.assemble(results([sample("n1", "0", value), sample("n1", "1", "0.5")]))
    assert [(r.gpu, r.util) for r in telemetry.for_node("n1")] == [("1", 0.5)]
    assert src.last_dropped == {reason: 1}


def test_malformed_labels_drop_the_series_not_the_refresh():
    src = source()
    bad = [{"metric": None, "value": [NOW, "1"]}, {"value": [NOW, "1"]},
           sample("n1", "1", "1", xid="٣")]
    telemetry = src.assemble({**results([sample("n1", "0", "0.5"), sample("n1", "1", "0.5")]),
                              "xid_counted": bad})
    assert [r.gpu for r in telemetry.for_node("n1")] == ["0"]  # gpu 1's XID cannot be read
    assert src.last_dropped == {"malformed": 3}


def scraped(extender: Extender, name: str) -> float | None:
    return extender.metrics.registry.get_sample_value(name)


class Crashing:
    """A source whose fetch fails with something that is not TelemetryUnavailable."""

    last_dropped: dict[str, int] = {}
    unknown_names: list[str] = []

    async def fetch(self) -> Telemetry:
        raise OverflowError("cannot convert float infinity to integer")


async def test_a_crashing_refresh_never_leaves_old_readings_looking_fresh():
    now = [NOW]
    fleet = FleetStore()
    fleet.replace_all([node("n1", H100)], [])
    view = PlacementView(POLICY, fleet, clock=lambda: now[0])
    extender = Extender(view, Crashing())
    extender.last_ok = NOW
    view.set_telemetry(Telemetry(nodes={"n1": readings("n1", [0.5] * 8)}, fetched_at=NOW))
    assert view.stale_nodes() == 0
    now[0] += 600
    await extender.refresh()  # must not raise
    assert extender.metrics.refresh_errors._value.get() == 1
    assert scraped(extender, "gpusteward_telemetry_age_seconds") == 600  # read at scrape time
    assert scraped(extender, "gpusteward_telemetry_stale_nodes") == 1  # the readings aged out


async def test_stale_states_show_even_when_the_rebuild_itself_stops():
    now = [NOW]
    fleet = FleetStore()
    fleet.replace_all([node("n1", H100)], [])
    view = PlacementView(POLICY, fleet, clock=lambda: now[0])
    extender = Extender(view, None)
    view.set_telemetry(Telemetry(nodes={"n1": readings("n1", [0.5] * 8)}, fetched_at=NOW))
    assert scraped(extender, "gpusteward_telemetry_stale_nodes") == 0
    now[0] += 600  # no refresh ran since: its states were judged ten minutes ago
    assert scraped(extender, "gpusteward_telemetry_stale_nodes") == 1


class Indigestible:
    """Readings that pass the adapter but break the scoring (a bug's stand-in)."""

    last_dropped: dict[str, int] = {}
    unknown_names: list[str] = []

    async def fetch(self) -> Telemetry:
        return Telemetry(nodes={"n1": (GpuReading(node="n1", gpu="0", util="0.5",  # type: ignore[arg-type]
                                                  sampled_at=NOW),)}, fetched_at=NOW)


async def test_readings_the_scoring_cannot_digest_turn_neutral_not_frozen():
    fleet = FleetStore()
    fleet.replace_all([node("n1", H100)], [])
    view = PlacementView(POLICY, fleet, clock=lambda: NOW)
    extender = Extender(view, Indigestible())
    await extender.refresh()  # must not raise
    assert extender.metrics.refresh_errors._value.get() == 1
    assert view.telemetry == Telemetry()
    assert scraped(extender, "gpusteward_telemetry_stale_nodes") == 1


def test_one_xid_under_both_names_of_a_rolling_upgrade_is_not_a_duplicate():
    """The XID query reads a 10-minute window: a GPU whose node's exporter went from 4.8
    (DCGM_FI_DEV_XID_ERRORS, ``Hostname``) to 4.9 (DCGM_FI_DEV_XID_ERROR, ``hostname``)
    within it has a series under each, one reading; an instant reading twice is a duplicate."""
    both = [sample("n1", "0", "79"),
            {"metric": {"hostname": "n1", "gpu": "0"}, "value": [NOW, "79"]}]
    src = source()
    telemetry = src.assemble({**results([sample("n1", "0", "0.5"), sample("n1", "1", "0.5")]),
                              "xid": both})
    assert [(r.gpu, r.xid) for r in telemetry.for_node("n1")] == [("0", 79), ("1", 0)]
    assert src.last_dropped == {}
    src.assemble({**results([sample("n1", "0", "0.5"), sample("n1", "0", "0.5")]), "xid": both})
    assert src.last_dropped == {"duplicate": 1}


def test_an_xid_seen_under_an_earlier_pod_names_neither_that_pod_nor_a_duplicate():
    """The XID query reads a window (max_over_time over 10 minutes): a GPU whose sticky XID
    gauge was labelled with the pod that held it then, and with the pod holding it now, gives
    two series. The GPU's reading is the higher XID; its holder is the one utilization names
    now, never the earlier pod (nor a lower-sorting name)."""
    src = source()
    util = [sample("n1", "0", "0.5", pod="zz-now", namespace="ml"),
            sample("n1", "1", "0.5")]
    xid = [sample("n1", "0", "48", pod="aa-before", namespace="ml"),
           sample("n1", "0", "79", pod="zz-now", namespace="ml")]
    telemetry = src.assemble({**results(util), "xid": xid})
    gpu0 = telemetry.for_node("n1")[0]
    assert (gpu0.pod, gpu0.xid) == ("ml/zz-now", 79)
    assert src.last_dropped == {}


def test_a_free_gpu_is_not_given_to_the_pod_its_xid_window_remembers():
    src = source()
    util = [sample("n1", "0", "0.0"), sample("n1", "1", "0.5")]
    xid = [sample("n1", "0", "79", pod="gone", namespace="ml")]
    assert src.assemble({**results(util), "xid": xid}).for_node("n1")[0].pod is None


def test_a_lost_gpu_is_held_by_the_pod_its_xid_names():
    """NVML gives no utilization for a GPU that fell off the bus; its XID alone says it is
    there, and which pod holds it."""
    src = source()
    telemetry = src.assemble({"util": [sample("n1", "1", "0.5")],
                              "util_at": [sample("n1", "1", str(NOW - 5))],
                              "xid": [sample("n1", "0", "79", pod="job", namespace="ml")]})
    lost = telemetry.for_node("n1")[0]
    assert (lost.gpu, lost.pod, lost.xid, lost.util) == ("0", "ml/job", 79, None)
