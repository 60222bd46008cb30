"""Each owner kind stopped through its own switch (core.reclaim.kinds): the patches against the
upstream field names, what counts as stopped, and how decide() acts on them. Upstream sources:
the `source` of each entry in KINDS, checked against the named upstream files."""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.core.owners import SCALE, STOP, SUSPEND, Kind
from gpusteward.core.policy import PolicyError, parse_policy
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import RECLAIM_BLOCKED, RECLAIM_REASON, RECLAIMED_AT, Owner
from tests.unit.test_reclaim_decide import (
    POLICY,
    gpu_pod,
    pending,
    queue_snapshot,
    reclaimed,
    snapshot,
    warned,
)

AT = "2027-01-15T08:00:00Z"


def kind(name: str) -> Kind:
    (k,) = kinds.DEFAULT.by_kind(name)
    return k


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        pytest.param("JobSet", {"suspend": True}, id="jobset-spec-suspend"),
        pytest.param("TrainJob", {"suspend": True}, id="trainjob-spec-suspend"),
        pytest.param("PyTorchJob", {"runPolicy": {"suspend": True}},
                     id="pytorchjob-runpolicy-suspend"),
        pytest.param("RayCluster.ray.io", {"suspend": True}, id="raycluster-spec-suspend"),
        pytest.param("RayJob", {"suspend": True}, id="rayjob-spec-suspend"),
        pytest.param("Workload", {"active": False}, id="kueue-workload-deactivated"),
    ],
)
def test_a_field_switch_is_set_and_the_reclaim_recorded(name, spec):
    body = kinds.stop_patch(kind(name), "idle: 1 GPU idle", AT)
    assert body == {"spec": spec, "metadata": {"annotations": {
        RECLAIM_REASON: "idle: 1 GPU idle", RECLAIMED_AT: AT}}}


@pytest.mark.parametrize(
    ("name", "stopped", "restored"),
    [
        # the notebook controller reads the annotation's presence; its value is the stop time
        pytest.param("Notebook", {"kubeflow-resource-stopped": AT},
                     {"kubeflow-resource-stopped": None,
                      "notebooks.kubeflow.org/last-activity": "2027-01-16T00:00:00Z"},
                     id="notebook-stopped-annotation-and-fresh-last-activity"),
        pytest.param("InferenceService", {"serving.kserve.io/stop": "true"},
                     {"serving.kserve.io/stop": "false"}, id="kserve-stop-true-then-false"),
        pytest.param("LLMInferenceService", {"serving.kserve.io/stop": "true"},
                     {"serving.kserve.io/stop": "false"}, id="llm-kserve-stop"),
    ],
)
def test_an_annotation_switch_stops_and_restores(name, stopped, restored):
    stop = kinds.stop_patch(kind(name), "idle", AT)["metadata"]["annotations"]
    assert stop == {RECLAIM_REASON: "idle", RECLAIMED_AT: AT, **stopped}
    back = kinds.restore_patch(kind(name), "2027-01-16T00:00:00Z")
    assert back == {"metadata": {"annotations": {RECLAIM_REASON: None, RECLAIMED_AT: None,
                                                 **restored}}}


def test_restoring_a_field_switch_flips_it_back():
    assert kinds.restore_patch(kind("Workload"), AT)["spec"] == {"active": True}
    assert kinds.restore_patch(kind("PyTorchJob"), AT)["spec"] == {
        "runPolicy": {"suspend": False}}


@pytest.mark.parametrize(
    ("name", "obj", "switched", "gone"),
    [
        pytest.param("RayCluster", {"spec": {"suspend": True}}, True, False,
                     id="raycluster-suspending-has-not-let-go"),
        pytest.param("RayCluster", {"spec": {"suspend": True}, "status": {"conditions": [
            {"type": "RayClusterSuspended", "status": "True"}]}}, True, True,
            id="raycluster-suspended-condition"),
        pytest.param("RayJob", {"spec": {"suspend": True},
                                "status": {"jobDeploymentStatus": "Suspending"}}, True, False,
                     id="rayjob-suspending"),
        pytest.param("RayJob", {"spec": {"suspend": True},
                                "status": {"jobDeploymentStatus": "Suspended"}}, True, True,
                     id="rayjob-suspended"),
        pytest.param("JobSet", {"spec": {"suspend": False}}, False, False, id="jobset-running"),
        pytest.param("Workload", {"spec": {"active": False}}, True, True,
                     id="workload-inactive"),
        pytest.param("Workload", {"spec": {}}, False, False, id="workload-active-by-default"),
        pytest.param("InferenceService", {"metadata": {"annotations": {
            "serving.kserve.io/stop": "false"}}}, False, False, id="kserve-stop-false-runs"),
    ],
)
def test_an_owner_counts_as_stopped_only_once_it_says_so(name, obj, switched, gone):
    assert kinds.switched_off(kind(name), obj) is switched
    assert kinds.let_go(kind(name), obj) is gone


@pytest.mark.parametrize(
    ("group", "kind_name", "why"),
    [
        pytest.param("apps", "Deployment", "", id="built-in"),
        pytest.param("jobset.x-k8s.io", "JobSet", "", id="known-crd"),
        pytest.param("ray.io", "RayService", "RayService has no spec.suspend (kuberay v1.5.0)",
                     id="rayservice-has-no-switch"),
        pytest.param("example.com", "Trainer", "unsupported owner Trainer.example.com",
                     id="unknown-crd"),
        pytest.param("jobset.x-k8s.io", "Deployment", "unsupported owner Deployment."
                     "jobset.x-k8s.io", id="a-known-name-in-another-group-is-unknown"),
    ],
)
def test_unsupported_owners_say_why(group, kind_name, why):
    assert kinds.DEFAULT.unsupported(group, kind_name) == why


@pytest.mark.parametrize(
    ("name", "obj", "refused"),
    [
        # KubeRay v1.5.0 ValidateRayJobSpec: suspend with shutdownAfterJobFinishes false is
        # invalid, and the controller then sets jobDeploymentStatus ValidationFailed
        pytest.param("RayJob", {"spec": {"shutdownAfterJobFinishes": True}}, False,
                     id="rayjob-that-shuts-its-cluster-down-may-be-suspended"),
        pytest.param("RayJob", {"spec": {"shutdownAfterJobFinishes": False}}, True,
                     id="rayjob-keeping-its-cluster-is-refused"),
        pytest.param("RayJob", {"spec": {}}, True, id="rayjob-default-false-is-refused"),
        pytest.param("RayJob", {"spec": {"suspend": True}}, False,
                     id="rayjob-already-suspended-is-ours-to-follow"),
        pytest.param("RayCluster", {"spec": {}}, False, id="raycluster-has-no-such-rule"),
    ],
)
def test_a_switch_its_controller_would_refuse_is_not_thrown(name, obj, refused):
    assert bool(kinds.refused(kind(name), obj)) is refused


KEDA = "autoscaling.keda.sh/paused-replicas"  # keda.sh docs, "Pause autoscaling"
PAUSED_BY_US = {KEDA: "0", RECLAIM_REASON: "idle"}


@pytest.mark.parametrize(
    ("annotations", "conditions", "state"),
    [
        pytest.param({}, [], "", id="not-paused"),
        pytest.param({KEDA: "0"}, [{"type": "Paused", "status": "True"}], "",
                     id="paused-by-someone-else-is-not-ours"),
        pytest.param({KEDA: "2", RECLAIM_REASON: "idle"}, [], "", id="paused-at-two-is-not-ours"),
        pytest.param(PAUSED_BY_US, [{"type": "Paused", "status": "False"}], "asked",
                     id="asked-not-yet-taken"),
        # KEDA v2.18 controllers/keda/scaledobject_controller.go: the Paused condition
        pytest.param(PAUSED_BY_US, [{"type": "Ready", "status": "True"},
                                    {"type": "Paused", "status": "True"}], "taken",
                     id="taken"),
    ],
)
def test_how_far_a_keda_pause_has_got(annotations, conditions, state):
    so = {"metadata": {"annotations": annotations}, "status": {"conditions": conditions}}
    assert kinds.keda_pause(so) == state


# --- what decide() does with them -------------------------------------------------------------

def test_an_owner_with_its_own_switch_is_stopped_through_it():
    owner = Owner("JobSet", "ml", "train", ("p",), group="jobset.x-k8s.io", version="v1alpha2",
                  how=SUSPEND)
    p = plan(snapshot([warned("p")], owners={"p": owner}), POLICY)
    assert [(a.kind, a.how, a.owner.kind) for a in p.actions] == [
        ("reclaim", "suspend", "JobSet")]


def test_a_partly_idle_notebook_is_only_marked():
    owner = Owner("Notebook", "ml", "nb", ("a", "b"), group="kubeflow.org", how=STOP)
    p = plan(snapshot([warned("a"), gpu_pod("b")], owners={"a": owner, "b": owner}), POLICY)
    # b is not yet warned: the notebook is not due as a whole
    assert [a.kind for a in p.actions if a.kind == "reclaim"] == []


def test_a_blocked_owner_gets_one_event_and_is_never_evicted():
    owner = Owner("Trainer", "ml", "t", ("p",), group="example.com")
    first = plan(snapshot([warned("p")], owners={"p": owner}), POLICY)
    (a,) = first.actions
    assert (a.kind, a.how) == ("block", "block")
    assert a.message == "GPUs idle but not reclaimed: unsupported owner Trainer.example.com"
    told = warned("p", annotations={RECLAIM_BLOCKED: "unsupported owner Trainer.example.com"})
    assert plan(snapshot([told], owners={"p": owner}), POLICY).actions == ()


def test_blocked_events_do_not_use_up_the_reclaim_limits():
    policy = parse_policy({"reclaim": {"limits": {"maxPerCycle": 1}}})
    blocked = Owner("Deployment", "ml", "web", ("a",), group="apps",
                    blocked="driven by HorizontalPodAutoscaler web")
    p = plan(snapshot([warned("a"), warned("b")], owners={"a": blocked}), policy)
    assert sorted((a.how, a.pod.name) for a in p.actions) == [("block", "a"), ("evict", "b")]


def test_the_policy_may_still_evict_unknown_owners():
    policy = parse_policy({"reclaim": {"ownerActions": {"unknown": "evict"}}})
    owner = Owner("Trainer", "ml", "t", ("p",), group="example.com")
    assert [a.how for a in plan(snapshot([warned("p")], owners={"p": owner}), policy).actions] \
        == ["evict"]


def test_a_blocked_owner_is_never_a_queue_victim():
    snap = queue_snapshot([pending("want", 4, 1000, annotations={
        "gpusteward.io/card-types": "NVIDIA-H100*"})])
    owner = Owner("Trainer", "ml", "t", ("low",), group="example.com")
    p = plan(msgspec.structs.replace(snap, owners={"low": owner}), POLICY)
    assert [a for a in p.actions if a.kind == "reclaim"] == []
    assert reclaimed(plan(snap, POLICY)) == [("low", "queue")]  # unowned: reclaimed


def test_restore_list_says_stopping_until_a_ray_cluster_reports_it_suspended():
    from gpusteward.reclaimer.stopped import _marked, table

    record = {"annotations": {RECLAIM_REASON: "idle", RECLAIMED_AT: AT}}
    suspending = {"metadata": {**record, "namespace": "ml", "name": "a"},
                  "spec": {"suspend": True}}
    suspended = {"metadata": {**record, "namespace": "ml", "name": "b"},
                 "spec": {"suspend": True}, "status": {"conditions": [
                     {"type": "RayClusterSuspended", "status": "True"}]}}
    untouched = {"metadata": {"namespace": "ml", "name": "c"}}
    rows = _marked(kind("RayCluster"), "RayCluster", [suspending, suspended, untouched])
    assert [(r.name, r.state) for r in rows] == [("a", "stopping"), ("b", "stopped")]
    assert table(rows).splitlines()[1].split() == [
        AT, "RayCluster", "ml/a", "stopping", "idle", "gpusteward", "reclaimer", "restore",
        "ml/RayCluster/a"]


def test_the_policy_maps_one_unknown_kind_to_evict_and_leaves_others_blocked():
    policy = parse_policy({"reclaim": {"ownerActions": {"kinds": {
        "Trainer.example.com": "evict"}}}})
    mapped = Owner("Trainer", "ml", "t", ("a",), group="example.com")
    other = Owner("Trainer", "ml", "u", ("b",), group="other.io")
    p = plan(snapshot([warned("a"), warned("b")], owners={"a": mapped, "b": other}), policy)
    assert sorted((a.pod.name, a.how) for a in p.actions) == [("a", "evict"), ("b", "block")]


def test_a_kind_mapping_must_name_its_group():
    with pytest.raises(PolicyError, match=r"reclaim.ownerActions.kinds.Trainer: expected "
                                          r"Kind.group"):
        parse_policy({"reclaim": {"ownerActions": {"kinds": {"Trainer": "evict"}}}})


# --- switches the policy defines for kinds gpusteward does not know ----------------------------
SWITCHES = {"Pipeline.example.com": {"resource": "pipelines", "field": "spec.run.paused"},
            "Lab.example.com": {"resource": "labs", "annotation": "example.com/stopped"},
            "Model.serving.example.com": {"resource": "models", "scale": True},
            "Trainer.example.com": "evict"}


def policy_catalog() -> kinds.Catalog:
    policy = parse_policy({"reclaim": {"ownerActions": {"kinds": SWITCHES}}})
    return kinds.Catalog.of(policy.reclaim.owner_actions.kinds)


def test_the_policy_adds_a_field_an_annotation_and_a_scale_switch():
    catalog = policy_catalog()
    pipeline = catalog.known("example.com", "Pipeline")
    lab = catalog.known("example.com", "Lab")
    model = catalog.known("serving.example.com", "Model")
    assert pipeline is not None and lab is not None and model is not None
    assert (pipeline.plural, pipeline.how, pipeline.field) == (
        "pipelines", SUSPEND, ("spec", "run", "paused"))
    assert kinds.stop_patch(pipeline, "idle", AT)["spec"] == {"run": {"paused": True}}
    assert kinds.restore_patch(pipeline, AT)["spec"] == {"run": {"paused": False}}
    assert kinds.stop_patch(lab, "idle", AT)["metadata"]["annotations"][
        "example.com/stopped"] == "true"
    assert kinds.restore_patch(lab, AT)["metadata"]["annotations"][
        "example.com/stopped"] == "false"
    assert kinds.switched_off(lab, {"metadata": {"annotations": {"example.com/stopped": "true"}}})
    assert (model.plural, model.how) == ("models", SCALE)
    # evict stays a decision, not a switch; gpusteward's own table is untouched
    assert catalog.known("example.com", "Trainer") is None
    assert kinds.DEFAULT.known("example.com", "Pipeline") is None
    assert catalog.walkable("example.com", "Lab") and not catalog.unsupported("example.com", "Lab")
    assert [k.kind for k in catalog.by_kind("Lab")] == ["Lab"]


def test_an_owner_reached_through_a_policy_switch_is_stopped_whole():
    policy = parse_policy({"reclaim": {"ownerActions": {"kinds": SWITCHES}}})
    owner = Owner("Lab", "ml", "lab", ("a", "b"), group="example.com", how=STOP)
    p = plan(snapshot([warned("a"), warned("b")], owners={"a": owner, "b": owner}), policy)
    assert [(a.kind, a.how, a.owner.name) for a in p.actions] == [("reclaim", "stop", "lab")]
    only_one = plan(snapshot([warned("a"), gpu_pod("b")], owners={"a": owner, "b": owner}),
                    policy)
    assert [a for a in only_one.actions if a.kind == "reclaim"] == []  # not due as a whole


def test_a_policy_switch_the_walk_did_not_reach_blocks_instead_of_guessing():
    policy = parse_policy({"reclaim": {"ownerActions": {"kinds": SWITCHES}}})
    unread = Owner("Lab", "ml", "lab", ("a",), group="example.com")  # how unset
    p = plan(snapshot([warned("a")], owners={"a": unread}), policy)
    assert [(a.pod.name, a.how) for a in p.actions] == [("a", "block")]
    # the Event names the policy's switch, not "unsupported owner"
    assert p.actions[0].message == ("GPUs idle but not reclaimed: Lab.example.com has a switch "
                                    "in the policy but could not be read this cycle")


@pytest.mark.parametrize(
    ("switch", "error"),
    [
        pytest.param({"resource": "Labs", "scale": True},
                     r"Lab.example.com.resource: expected the plural", id="plural-lower-case"),
        pytest.param({"resource": "labs"}, r"Lab.example.com: set exactly one", id="none"),
        pytest.param({"resource": "labs", "scale": True, "field": "spec.x"},
                     r"Lab.example.com: set exactly one", id="two"),
        pytest.param({"resource": "labs", "field": "status.stopped"},
                     r"Lab.example.com.field: expected a boolean field under spec",
                     id="only-spec"),
        pytest.param({"resource": "labs", "field": "metadata.labels.x"},
                     r"Lab.example.com.field: expected a boolean field under spec",
                     id="not-metadata"),
        pytest.param({"resource": "labs", "annotation": "gpusteward.io/reclaim-reason"},
                     r"Lab.example.com.annotation: expected a qualified annotation key",
                     id="not-ours"),
        pytest.param({"resource": "labs", "annotation": "stopped"},
                     r"Lab.example.com.annotation: expected a qualified annotation key",
                     id="qualified"),
    ],
)
def test_a_policy_switch_is_checked_before_anything_runs(switch, error):
    with pytest.raises(PolicyError, match=error):
        parse_policy({"reclaim": {"ownerActions": {"kinds": {"Lab.example.com": switch}}}})


def test_a_kind_gpusteward_stops_its_own_way_cannot_get_a_policy_switch():
    with pytest.raises(PolicyError, match=r"JobSet.jobset.x-k8s.io: gpusteward already stops "
                                          r"JobSet its own way"):
        parse_policy({"reclaim": {"ownerActions": {"kinds": {
            "JobSet.jobset.x-k8s.io": {"resource": "jobsets", "scale": True}}}}})
    # block, evict or annotate stay allowed for any kind
    parse_policy({"reclaim": {"ownerActions": {"kinds": {"JobSet.jobset.x-k8s.io": "block"}}}})
