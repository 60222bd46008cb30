"""GPU health verdicts (core/health.py) and what the reclaimer does with them (issue 31).

Node shapes as their writers store them: a health pipeline's quarantine taint and condition
(NVIDIA NVSentinel, see gpusteward.core.policy.NVSENTINEL_CONDITIONS for its keys and source), and
the kubelet's device manager, which keeps an Unhealthy device in capacity but not in allocatable
(kubernetes pkg/kubelet/cm/devicemanager/manager.go, GetCapacity)."""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.core.health import Fault, Source, node_faults, pod_faults
from gpusteward.core.model import Node, NodeCondition, Taint
from gpusteward.core.policy import NVSENTINEL_ANNOTATIONS, NVSENTINEL_CONDITIONS, parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import (
    FAULTY_GPU,
    IDLE_SINCE,
    RECLAIM_AT,
    ActionKind,
    Reason,
    VerdictState,
)
from gpusteward.core.scoring import Demand, filter_node
from gpusteward.core.times import HOUR, stamp
from tests.factories import H100, readings, state
from tests.unit.test_reclaim_decide import NOW, POLICY, gpu_pod, kinds, snapshot, warned

HEALTH = POLICY.health  # NVSentinel's conditions and annotation: no taint by default
# NVSentinel's taints are per rule set, none by default; this is the commented example of its
# chart (distros/kubernetes/nvsentinel/charts/fault-quarantine/values.yaml, `taint:`).
QUARANTINE = Taint("nvidia.com/gpu-error", "fatal", "NoSchedule")
TAINTED = parse_policy({"health": {"nodeTaints": [QUARANTINE.key]}}).health
XID79 = Fault(Source.XID, "XID 79 on GPU 0 within the health window (DCGM_EXP_XID_ERRORS_TOTAL "
                          "rose)")


def node(**kw) -> Node:
    return Node("n1", H100, 8, **{"resources": {"nvidia.com/gpu": 8},
                                  "capacity": {"nvidia.com/gpu": 8}, **kw})


def test_a_healthy_node_has_no_faults_and_foreign_taints_and_conditions_are_ignored():
    n = node(taints=(Taint("dedicated", "training", "NoSchedule"), QUARANTINE),
             unschedulable=True,  # a cordon alone is maintenance as often as a fault
             annotation_keys=frozenset({"node.alpha.kubernetes.io/ttl"}),
             conditions=(NodeCondition("Ready", "True"),
                         NodeCondition("SomeVendorGpuProblem", "True", "Broken")))
    assert node_faults(n, HEALTH) == ()


@pytest.mark.parametrize("kw, source", [
    pytest.param({"taints": (QUARANTINE,)}, Source.NODE_TAINT, id="quarantine-taint"),
    # NVSentinel's platform-connector: type = the check's name, reason <check>IsNotHealthy
    pytest.param({"conditions": (NodeCondition("GpuMemWatch", "True", "GpuMemWatchIsNotHealthy",
                                               "ErrorCode:DCGM_FR_UNCONTAINED_ERROR"),)},
                 Source.NODE_CONDITION, id="health-condition-true"),
    pytest.param({"annotation_keys": frozenset(NVSENTINEL_ANNOTATIONS)}, Source.NODE_ANNOTATION,
                 id="quarantine-annotation"),
    pytest.param({"resources": {"nvidia.com/gpu": 7}}, Source.DEVICE_PLUGIN,
                 id="allocatable-below-capacity"),
])
def test_each_node_source_marks_the_node_faulty(kw, source):
    faults = node_faults(node(**kw), TAINTED)
    assert [f.source for f in faults] == [source]
    assert "n1" in faults[0].reason


def test_a_health_condition_that_is_false_is_no_fault():
    n = node(conditions=(NodeCondition("GpuMemWatch", "False", "GpuMemWatchIsHealthy",
                                       "No Health Failures"),))
    assert node_faults(n, HEALTH) == ()


def test_the_policy_names_the_keys_of_another_pipeline():
    policy = parse_policy({"health": {"nodeTaints": ["example.com/gpu-broken"],
                                      "nodeConditions": ["GpuBroken"]}})
    n = node(taints=(Taint("example.com/gpu-broken", "", "NoExecute"), QUARANTINE),
             conditions=(NodeCondition("GpuBroken", "True"),))
    assert [f.source for f in node_faults(n, policy.health)] == [Source.NODE_CONDITION,
                                                                 Source.NODE_TAINT]
    assert "GpuMemWatch" in NVSENTINEL_CONDITIONS


def test_a_pods_own_gpu_fault_comes_before_its_nodes_and_healthy_pods_are_absent():
    pods = [gpu_pod("on-bad-gpu"), gpu_pod("beside"), gpu_pod("quarantined", node="n2"),
            gpu_pod("waiting", node=None)]
    nodes = {"n1": node(), "n2": msgspec.structs.replace(node(), name="n2",
                                                         taints=(QUARANTINE,))}
    faults = pod_faults(pods, nodes, TAINTED, {"ml/on-bad-gpu": XID79})
    assert faults["ml/on-bad-gpu"] == XID79
    assert faults["ml/quarantined"].source == Source.NODE_TAINT
    assert set(faults) == {"ml/on-bad-gpu", "ml/quarantined"}


# --- the reclaimer --------------------------------------------------------------------------

def test_an_idle_pod_on_a_faulty_gpu_is_faulty_not_idle_and_its_neighbour_is_still_reclaimed():
    bad, neighbour = warned("on-bad-gpu"), warned("beside")
    snap = msgspec.structs.replace(snapshot([bad, neighbour]), faults={bad.key: XID79})
    p = plan(snap, POLICY)
    verdicts = {v.pod: v for v in p.verdicts}
    assert verdicts["ml/on-bad-gpu"].state == VerdictState.FAULTY
    assert "XID 79" in verdicts["ml/on-bad-gpu"].reasons[0]
    assert (ActionKind.RECLAIM, "beside") in kinds(p)
    assert (ActionKind.RECLAIM, "on-bad-gpu") not in kinds(p)
    fault = next(a for a in p.actions if a.pod.name == "on-bad-gpu")
    assert (fault.kind, fault.reason) == (ActionKind.FAULT, Reason.FAULTY)
    assert fault.message.partition(": ")[2] == str(XID79)


def test_a_faulty_pod_is_never_a_queue_victim():
    bad = gpu_pod("on-bad-gpu", gpus=8)
    waiting = gpu_pod("urgent", node=None, gpus=8, priority=1000, unschedulable_since=NOW - 600)
    snap = msgspec.structs.replace(snapshot([bad, waiting]), faults={bad.key: XID79})
    assert [a.kind for a in plan(snap, POLICY).actions] == [ActionKind.FAULT]
    healthy = plan(snapshot([bad, waiting]), POLICY)
    assert (ActionKind.RECLAIM, "on-bad-gpu") in kinds(healthy)  # the fault is what held it


def test_an_unchanged_fault_writes_nothing_again():
    bad = gpu_pod("on-bad-gpu", annotations={FAULTY_GPU: str(XID79)})
    snap = msgspec.structs.replace(snapshot([bad]), faults={bad.key: XID79})
    assert plan(snap, POLICY).actions == ()


def test_a_repaired_gpu_clears_the_note_and_the_idle_clock_starts_afresh():
    bad = gpu_pod("repaired", annotations={FAULTY_GPU: str(XID79),
                                           IDLE_SINCE: stamp(NOW - 2 * HOUR)})
    p = plan(snapshot([bad]), POLICY)
    assert [(a.kind, a.reason) for a in p.actions] == [(ActionKind.CLEAR, Reason.HEALTHY)]
    assert p.verdicts[0].state == VerdictState.UNKNOWN


def test_a_fault_removes_idle_marks_in_the_same_write():
    # The actor's FAULT patch removes idle-since and reclaim-at (reclaimer/actor.py); the plan
    # asks for it on a warned pod, even one already past its deadline.
    bad = warned("on-bad-gpu", due_in=-600)
    assert RECLAIM_AT in bad.annotations
    snap = msgspec.structs.replace(snapshot([bad]), faults={bad.key: XID79})
    assert [a.kind for a in plan(snap, POLICY).actions] == [ActionKind.FAULT]


# --- the extender ---------------------------------------------------------------------------

@pytest.mark.parametrize("fresh", [True, False], ids=["with-telemetry", "telemetry-stale"])
def test_a_quarantined_node_is_filtered_out_and_scores_no_health(fresh):
    at = NOW - 5 if fresh else NOW - 600
    s = state(node(annotation_keys=frozenset(NVSENTINEL_ANNOTATIONS)),
              gpu_readings=readings(at=at))
    verdict = filter_node(s, Demand(gpus=1, card_patterns=(), class_name="training"))
    assert not verdict.ok
    assert "quarantineHealthEvent" in verdict.reason
    assert s.faulty == 8


def test_the_device_plugins_unhealthy_gpus_are_already_out_of_allocatable():
    # 7 of 8 allocatable: the node still takes a 7-GPU pod; the lost one is never offered.
    n = Node("n1", H100, 7, resources={"nvidia.com/gpu": 7}, capacity={"nvidia.com/gpu": 8})
    s = state(n, gpu_readings=readings(utils=[0.0] * 7))
    assert filter_node(s, Demand(gpus=7, card_patterns=(), class_name="training")).ok
    assert not filter_node(s, Demand(gpus=8, card_patterns=(), class_name="training")).ok


def test_a_conditions_free_text_reason_is_bounded_in_the_fault():
    # It is written into the pod's annotation and an Event: a node writer's 1 MB reason must
    # not make every fault write fail.
    n = node(conditions=(NodeCondition("GpuMemWatch", "True", "X" * 1_000_000),))
    (fault,) = node_faults(n, HEALTH)
    assert len(fault.reason) < 200
