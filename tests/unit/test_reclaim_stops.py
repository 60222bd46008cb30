"""Restore trusts only what gpusteward itself recorded: the pure checks (core/reclaim/trust.py),
the stop record (reclaimer/stops.py) through its own seams (the ConfigMap records, the object
reads), and the loop writing each stop ahead of making it (reclaimer/loop.py)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from gpusteward.adapters.records import RecordsConflict
from gpusteward.core.reclaim import trust
from gpusteward.core.reclaim.model import (
    RECLAIM_REASON,
    REPLICAS_BEFORE,
    Action,
    ActionKind,
    How,
    Owner,
    Reason,
    StopEntry,
    Switch,
)
from gpusteward.reclaimer import stops
from gpusteward.reclaimer.stops import StopBook, StopRecordError
from tests.unit.test_reclaim_decide import NOW, gpu_pod, warned
from tests.unit.test_reclaim_loop import Writer, reclaimer

WHAT = "Deployment ml/serve"
WHERE = "ConfigMap gpusteward/gpusteward-reclaimer-stops"


def entry(name: str = "serve", uid: str = "uid-1", replicas: int | None = 2, kind: str =
          "Deployment", group: str = "apps", how: str = How.SCALE) -> StopEntry:
    plural = {"Deployment": "deployments", "Job": "jobs"}.get(kind, kind.lower() + "s")
    return StopEntry("ml", group, kind, plural, name, uid, how, replicas, "idle", NOW)


# --- the decision: which record vouches, which count comes back ------------------------------

@pytest.mark.parametrize(("recorded", "uid", "refusal"), [
    pytest.param(None, "uid-1", "is not in gpusteward's stop record (ConfigMap gpusteward/",
                 id="hand-written-annotations-without-a-record"),
    pytest.param(entry(), "uid-2", "is uid uid-2, but gpusteward stopped uid uid-1",
                 id="deleted-and-created-again-under-the-same-name"),
    pytest.param(entry(), "uid-1", "", id="the-object-gpusteward-stopped"),
])
def test_only_an_entry_for_this_very_object_vouches_for_a_restore(recorded, uid, refusal):
    why = trust.unvouched(recorded, uid, WHAT, WHERE)
    assert (refusal in why) if refusal else why == ""


@pytest.mark.parametrize(("annotations", "back", "refusal"), [
    pytest.param({REPLICAS_BEFORE: "2", RECLAIM_REASON: "idle: scaled from 2 to 0"}, 2, "",
                 id="annotations-agree"),
    pytest.param({}, 2, "", id="annotations-removed-the-record-still-says-2"),
    pytest.param({REPLICAS_BEFORE: "100000", RECLAIM_REASON: "idle: scaled from 100000 to 0"},
                 0, "'100000' disagrees with gpusteward's stop record (2 replicas)",
                 id="forged-count-with-a-matching-reason"),
    pytest.param({REPLICAS_BEFORE: "1"}, 0, "'1' disagrees", id="fewer-is-a-disagreement-too"),
    pytest.param({REPLICAS_BEFORE: "٣"}, 0, "disagrees", id="arabic-indic-digit"),
    pytest.param({REPLICAS_BEFORE: "+2"}, 0, "disagrees", id="sign"),
    pytest.param({REPLICAS_BEFORE: "2", RECLAIM_REASON: "idle: scaled from 9 to 0"}, 0,
                 "reclaim-reason='idle: scaled from 9 to 0' disagrees", id="reason-edited"),
])
def test_a_scale_down_comes_back_to_the_recorded_count_or_not_at_all(annotations, back,
                                                                      refusal):
    count, why = trust.replicas_back(entry(), annotations, WHAT)
    assert count == back
    assert (refusal in why and "not restored" in why) if refusal else why == ""


def test_a_record_without_a_count_restores_no_replicas():
    count, why = trust.replicas_back(entry(replicas=None), {REPLICAS_BEFORE: "2"}, WHAT)
    assert count == 0 and "holds no replica count" in why


# --- the record: the ConfigMap's semantics and the object reads, faked at the seams ---------

class Records:
    """A ConfigMap: a save names the version its load read, else a conflict."""

    where = WHERE

    def __init__(self, entries: list[StopEntry] | None = None) -> None:
        self.entries, self.version, self.seen = list(entries or []), 1, 0
        self.saves = 0
        self.conflicts = 0  # how many saves meet someone else's write first

    async def load(self) -> list[StopEntry]:
        self.seen = self.version
        return list(self.entries)

    async def save(self, items: list[StopEntry]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1
        if self.seen != self.version:
            raise RecordsConflict("changed meanwhile", 409)
        self.entries, self.saves = list(items), self.saves + 1
        self.version += 1


class Objects:
    """The API server's objects by path, and the groups it serves."""

    def __init__(self, objects: dict[str, dict] | None = None, failing: int = 0) -> None:
        self.objects = objects or {}
        self.failing = failing  # an HTTP status every GET answers, when set
        self.gets: list[str] = []

    async def get(self, path: str) -> dict:
        self.gets.append(path)
        if self.failing:
            raise ApiException(status=self.failing, reason="no")
        if path not in self.objects:
            raise ApiException(status=404, reason="not found")
        return self.objects[path]

    async def served(self, group: str) -> str | None:
        return {"ray.io": "v1", "keda.sh": "v1alpha1"}.get(group)


def book(records: Records, objects: Objects, pruned_at: float | None = NOW) -> StopBook:
    b = StopBook.__new__(StopBook)
    b.records, b.switches = records, objects  # type: ignore[assignment]
    b.catalog, b.clock, b.pruned_at = stops.kinds.DEFAULT, lambda: NOW, pruned_at
    return b


DEPLOYMENT = "/apis/apps/v1/namespaces/ml/deployments/serve"


def reclaim(owner: Owner, how: How | None = None) -> Action:
    return Action(ActionKind.RECLAIM, gpu_pod("p"), "ml", Reason.IDLE, "idle", owner, how)


async def test_a_scale_down_is_recorded_with_the_uid_and_replicas_it_is_about_to_stop():
    records = Records()
    objects = Objects({DEPLOYMENT: {"metadata": {"uid": "uid-1"}, "spec": {"replicas": 3}}})
    got = await book(records, objects).ahead(reclaim(Owner("Deployment", "ml", "serve"),
                                                     How.SCALE))
    assert got == entry(replicas=3)
    assert records.entries == [got]


async def test_a_keda_pause_is_recorded_on_the_scaled_object_restore_acts_on():
    objects = Objects({"/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects/api": {
        "metadata": {"uid": "so-1"}}})
    owner = Owner("Deployment", "ml", "web", group="apps", how=How.PAUSE,
                  via=Switch("ScaledObject", "keda.sh", "v1alpha1", "api"))
    got = await book(Records(), objects).ahead(reclaim(owner))
    assert got is not None
    assert (got.group, got.kind, got.name, got.uid, got.how, got.replicas) == (
        "keda.sh", "ScaledObject", "api", "so-1", "pause", None)


async def test_a_stop_finishing_a_recorded_keda_pause_keeps_the_first_entry():
    """KEDA took the pause but its target still runs: the next stop finishes it
    (kinds.keda_pause). Recording it anew, and then forgetting that entry when the finishing
    stop came to nothing (stale), left a stopped workload restore refused as unrecorded."""
    objects = Objects({"/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects/api": {
        "metadata": {"uid": "so-1"}}})
    owner = Owner("Deployment", "ml", "web", group="apps", how=How.PAUSE,
                  via=Switch("ScaledObject", "keda.sh", "v1alpha1", "api"))
    records = Records()
    first = await book(records, objects).ahead(reclaim(owner))
    assert await book(records, objects).ahead(reclaim(owner)) is None
    assert records.entries == [first]
    # The ScaledObject created again (another uid): a new stop, recorded anew.
    objects.objects["/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects/api"] = {
        "metadata": {"uid": "so-2"}}
    again = await book(records, objects).ahead(reclaim(owner))
    assert again is not None and records.entries == [again]


async def test_an_eviction_leaves_nothing_to_restore_and_records_nothing():
    records = Records()
    assert await book(records, Objects()).ahead(reclaim(Owner("Pod", "ml", "p"),
                                                        How.EVICT)) is None
    assert records.saves == 0


async def test_an_object_that_cannot_be_read_is_not_recorded_and_says_why():
    with pytest.raises(StopRecordError, match="HTTP 403"):
        await book(Records(), Objects(failing=403)).ahead(
            reclaim(Owner("Deployment", "ml", "serve"), How.SCALE))


async def test_a_new_stop_replaces_the_entry_of_the_same_object_and_keeps_the_others():
    records = Records([entry(uid="old"), entry("other")])
    await book(records, Objects()).record(entry(uid="new"))
    assert [(e.name, e.uid) for e in records.entries] == [("other", "uid-1"), ("serve", "new")]


async def test_a_write_that_meets_someone_elses_reads_again_and_keeps_both():
    records = Records([entry("restored-elsewhere")])
    records.conflicts = 1
    await book(records, Objects()).record(entry())
    assert records.saves == 1 and records.entries[-1] == entry()


async def test_a_record_that_keeps_conflicting_fails_after_its_retries():
    records = Records()
    records.conflicts = stops.RETRIES
    with pytest.raises(RecordsConflict):
        await book(records, Objects()).record(entry())


async def test_forget_removes_only_the_entry_restored():
    restored, newer = entry(uid="uid-1"), entry("other", uid="uid-9")
    records = Records([restored, newer])
    await book(records, Objects()).forget(restored)
    assert records.entries == [newer]
    await book(records, Objects()).forget(restored)  # gone already: nothing written
    assert records.saves == 1


async def test_prune_drops_entries_whose_object_is_gone_or_created_again_and_keeps_in_doubt():
    kept, recreated, gone = entry("kept"), entry("recreated"), entry("gone")
    ray = entry("rc", kind="RayCluster", group="ray.io", how=How.SUSPEND, replicas=None)
    objects = Objects({
        "/apis/apps/v1/namespaces/ml/deployments/kept": {"metadata": {"uid": "uid-1"}},
        "/apis/apps/v1/namespaces/ml/deployments/recreated": {"metadata": {"uid": "uid-2"}},
        "/apis/ray.io/v1/namespaces/ml/rayclusters/rc": {"metadata": {"uid": "uid-1"}}})
    records = Records([kept, recreated, gone, ray])
    await book(records, objects, pruned_at=None).record(entry("new"))
    assert [e.name for e in records.entries] == ["kept", "rc", "new"]
    unsure = Records([kept, gone])
    await book(unsure, Objects(failing=500), pruned_at=None).record(entry("new"))
    assert [e.name for e in unsure.entries] == ["kept", "gone", "new"]


async def test_prune_waits_its_interval_unless_the_record_is_full():
    objects = Objects()
    await book(Records([entry("gone")]), objects).record(entry())
    assert objects.gets == []  # pruned at NOW already


async def test_a_record_full_of_existing_objects_refuses_the_next_stop(monkeypatch):
    monkeypatch.setattr(stops, "MAX_ENTRIES", 2)
    objects = Objects({f"/apis/apps/v1/namespaces/ml/deployments/{n}": {
        "metadata": {"uid": "uid-1"}} for n in ("a", "b")})
    records = Records([entry("a"), entry("b")])
    with pytest.raises(StopRecordError, match="holds 2 stops of existing objects"):
        await book(records, objects).record(entry())
    assert records.saves == 0


# --- the loop: no stop without its entry ------------------------------------------------------

class StopRecord:
    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.recorded: list[str] = []
        self.forgotten: list[str] = []

    async def ahead(self, action: Action) -> StopEntry | None:
        if self.fail is not None:
            raise self.fail
        self.recorded.append(action.pod.name)
        return entry(action.pod.name)

    async def forget(self, e: StopEntry) -> None:
        self.forgotten.append(e.name)


class Watching(Writer):
    """A writer that notes what the stop record held when each action was applied."""

    def __init__(self, book: StopRecord, result: str = "done") -> None:
        super().__init__(result=result)
        self.book, self.recorded_at_apply = book, []

    async def apply(self, action: Action) -> str:
        self.recorded_at_apply.append(list(self.book.recorded))
        return await super().apply(action)


async def test_a_stop_is_recorded_before_it_is_made():
    record = StopRecord()
    writer = Watching(record)
    rec = reclaimer([warned("due")], writer=writer)
    rec.stops = record
    await rec.cycle()
    assert writer.applied == [("reclaim", "due")]
    assert writer.recorded_at_apply == [["due"]]
    assert record.forgotten == []


@pytest.mark.parametrize(("fail", "result"), [
    pytest.param(StopRecordError("writing ConfigMap: HTTP 500", 500), "error", id="unwritable"),
    pytest.param(StopRecordError("writing ConfigMap: HTTP 403", 403), "forbidden",
                 id="rbac-names-the-configmap"),
])
async def test_a_stop_that_cannot_be_recorded_is_not_made(fail, result):
    writer = Writer()
    rec = reclaimer([warned("due"), gpu_pod("fresh")], writer=writer)
    rec.stops = StopRecord(fail)
    await rec.cycle()
    assert writer.applied == [("mark", "fresh")]  # the other writes go on
    assert rec.metrics.actions.labels("reclaim", "idle", "ml", result)._value.get() == 1
    assert rec.recent == []  # no intent in the ledger either


@pytest.mark.parametrize(("result", "forgotten"), [
    pytest.param("stale", ["due"], id="nothing-written-entry-forgotten"),
    pytest.param("error", [], id="may-be-half-stopped-entry-kept"),
    pytest.param("forbidden", [], id="a-keda-pause-may-be-taken-entry-kept"),
])
async def test_an_entry_goes_only_when_its_stop_was_surely_not_made(result, forgotten):
    record = StopRecord()
    rec = reclaimer([warned("due")], writer=Writer(result=result))
    rec.stops = record
    await rec.cycle()
    assert record.forgotten == forgotten
