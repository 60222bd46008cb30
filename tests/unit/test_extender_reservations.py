"""The extender keeps GPUs reserved for a waiting pod (core/reclaim/reserve.py: its
``gpusteward.io/reserved`` annotation and its ``status.nominatedNodeName``, as the reclaimer
writes them) from every other pod: filter fails the node where the reserved GPUs were all it had
free, prioritize scores it as that full; the pod they are reserved for finds them free. The
reservation is read from the watched pod, so every replica of the extender honours it.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gpusteward.core.fleet import FleetStore
from gpusteward.core.model import RESERVED, Pod, Telemetry
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.model import Evidence
from gpusteward.core.reclaim.reserve import Reservation, written
from gpusteward.core.times import stamp
from gpusteward.extender import wire
from gpusteward.extender.app import respond
from gpusteward.extender.preempt import Preempter
from gpusteward.extender.preemptwire import decode_preemption_args
from gpusteward.extender.replies import filter_reply, prioritize_reply
from gpusteward.extender.view import PlacementView
from gpusteward.extender.wire import BadRequest
from tests.factories import H100, NOW, node, pod, readings

POLICY = parse_policy({"classes": {"batch": {"weights": {
    "card": 0, "coolness": 1, "packing": 0, "health": 0}}}})


def waiting(uid: str, gpus: int = 4, *, reserved_on: str | None = None,
            nominated: str | None = None, until: float = NOW + 60) -> Pod:
    """A pending pod; ``reserved_on``: holding a reservation there (nominated there too unless
    ``nominated`` says otherwise)."""
    annotations = {}
    if reserved_on is not None:
        annotations[RESERVED] = written(Reservation(reserved_on, gpus, 0, stamp(until)))
    return msgspec.structs.replace(pod(uid, node=None, gpus=gpus), uid=uid,
                                   annotations=annotations,
                                   nominated_node=nominated or reserved_on)


def cluster(*pending) -> tuple[PlacementView, FleetStore]:
    """x: 8 GPUs, 4 of them held by a running pod; y: 8 GPUs, 6 held."""
    fleet = FleetStore()
    view = PlacementView(POLICY, fleet, clock=lambda: NOW)
    fleet.replace_all([node("x", H100), node("y", H100)],
                      [pod("run-x", node="x", gpus=4), pod("run-y", node="y", gpus=6), *pending])
    view.set_telemetry(Telemetry(nodes={"x": readings("x", [0.0] * 8),
                                        "y": readings("y", [0.0] * 8)}))
    return view, fleet


def ask(view: PlacementView, uid: str, gpus: int = 4, verb=filter_reply) -> dict:
    body = {"metadata": {"name": uid, "namespace": "ml", "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)}}}]}}
    args = wire.decode_args(json.dumps({"Pod": body, "NodeNames": ["x", "y"]}).encode())
    return json.loads(respond(view, verb, args).body)


def passing(view: PlacementView, uid: str) -> list[str]:
    return ask(view, uid)["NodeNames"]


def test_reserved_gpus_are_kept_from_other_pods_and_free_for_their_own():
    view, _ = cluster(waiting("reserved", reserved_on="x"), waiting("other"))
    assert passing(view, "other") == []  # x: 4 free, all reserved; y: 2 free
    assert ask(view, "other")["FailedNodes"]["x"] == (
        "pod needs 4 healthy free GPUs, node has 0 (4 reserved for a waiting pod)")
    assert passing(view, "reserved") == ["x"]
    assert passing(view, "other") == []  # answering its own pod left nothing behind


def test_prioritize_scores_the_reserved_gpus_as_taken():
    view, _ = cluster(waiting("reserved", gpus=2, reserved_on="x"), waiting("other", gpus=2))
    other = {e["Host"]: e["Score"] for e in ask(view, "other", 2, prioritize_reply)}
    view2, _ = cluster(waiting("other", gpus=2))
    free = {e["Host"]: e["Score"] for e in ask(view2, "other", 2, prioritize_reply)}
    assert other["x"] < free["x"]


@pytest.mark.parametrize(
    "reserved",
    [
        pytest.param(waiting("reserved", reserved_on="x", until=NOW - 1), id="expired"),
        pytest.param(waiting("reserved", reserved_on="x", nominated="y"),
                     id="nominated-elsewhere"),
        pytest.param(msgspec.structs.replace(waiting("reserved", gpus=2, reserved_on="x"),
                                             gpus=4), id="demand-changed"),
        pytest.param(msgspec.structs.replace(waiting("reserved"), annotations={RESERVED: "{"},
                                             nominated_node="x"), id="unreadable"),
        pytest.param(msgspec.structs.replace(waiting("reserved"), nominated_node="x"),
                     id="nominated-without-a-reservation"),
    ],
)
def test_a_reservation_that_is_over_or_not_one_keeps_nothing(reserved):
    view, _ = cluster(reserved, waiting("other"))
    assert passing(view, "other") == ["x"]


def test_a_reservation_counts_as_soon_as_the_watch_shows_it_and_goes_with_its_release():
    view, fleet = cluster(waiting("reserved"), waiting("other"))
    assert passing(view, "other") == ["x"]
    fleet.upsert_pod(waiting("reserved", reserved_on="x"))  # the reclaimer's reserve
    assert passing(view, "other") == []
    # its release: the annotation goes first (the nomination may be the scheduler's own)
    fleet.upsert_pod(msgspec.structs.replace(waiting("reserved"), nominated_node="x"))
    assert passing(view, "other") == ["x"]


def test_the_pod_bound_ends_its_reservation():
    view, fleet = cluster(waiting("reserved", reserved_on="x"), waiting("other", gpus=2))
    bound = msgspec.structs.replace(waiting("reserved", reserved_on="x"), node="x",
                                    phase="Running", bound_at=NOW)
    fleet.upsert_pod(bound)  # 4 + 4 of x's 8 taken, by pods: nothing reserved on top
    assert ask(view, "other", 2)["NodeNames"] == ["y"]
    fleet.upsert_pod(msgspec.structs.replace(bound, node=None, nominated_node=None,
                                             deleting=True))
    assert ask(view, "other", 2)["NodeNames"] == ["x", "y"]


# --- the preempt verb: one mind with the reservations -----------------------------------------

class IdleEvidence:
    async def evidence(self, pods, now):
        return {1800.0: {p.key: Evidence(1800.0, 0.0, 1.0, p.gpus) for p in pods}}, True, ""


async def preempter(*reserving: Pod) -> Preempter:
    """x and y: 8 GPUs each, each held by one idle 4-GPU victim beside 4 free GPUs."""
    fleet = FleetStore()
    fleet.replace_all([node("x", H100), node("y", H100)],
                      [pod("vx", node="x", gpus=4), pod("vy", node="y", gpus=4), *reserving])
    p = Preempter(parse_policy({}), fleet, IdleEvidence(), CollectorRegistry(),
                  clock=lambda: NOW)
    await p.refresh()
    return p


def preempt(p: Preempter, uid: str, gpus: int = 8, quantity: str | None = None) -> list[str]:
    urgent = {"metadata": {"name": uid, "namespace": "ml", "uid": uid},
              "spec": {"containers": [{"name": "c", "resources": {
                  "limits": {"nvidia.com/gpu": quantity or str(gpus)}}}]}}
    body = json.dumps({"Pod": urgent, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": f"uid-ml-v{n}"}], "NumPDBViolations": 0} for n in ("x", "y")}})
    return list(json.loads(p.answer(decode_preemption_args(body.encode())).body)[
        "NodeNameToMetaVictims"])


async def test_the_verb_keeps_a_preemptor_off_gpus_reserved_for_another_pod():
    p = await preempter(waiting("reserved", reserved_on="x"))
    # x: evicting vx frees 4 beside 4 free, but 4 of those 8 are reserved: no room for 8
    assert preempt(p, "urgent") == ["y"]
    assert preempt(p, "urgent", gpus=4) == ["x", "y"]  # room for it beside the reservation
    assert preempt(p, "reserved") == ["x", "y"]  # its own reservation is room for it


async def test_the_preemptor_request_is_read_only_beside_a_reservation_and_must_be_readable():
    p = await preempter(waiting("other"))
    assert preempt(p, "urgent", quantity="lots") == ["x", "y"]  # nothing reserved: no cost
    p = await preempter(waiting("reserved", reserved_on="x"))
    with pytest.raises(BadRequest, match="GPU request"):
        preempt(p, "urgent", quantity="lots")
