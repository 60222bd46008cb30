"""Demoting an idle Kueue Workload through Kueue's own priority boost instead of deactivating it
(policy ``reclaim.kueue.action`` or ``classes.*.kueueAction`` ``demote``), and ending that.

Demoted, the Workload keeps running with its effective priority lowered by
``reclaim.kueue.priorityBoost`` (core.owners KUEUE_PRIORITY_BOOST): Kueue preempts it only when a
Workload that now outranks it needs the quota, as its ClusterQueue's preemption settings allow
(withinClusterQueue, reclaimWithinCohort). Kueue reads the annotation only with its PriorityBoost
feature gate on (alpha in v0.17).

The boost goes (UNDEMOTE) when a pod of the Workload is busy again, or when one was created after
the demotion: Kueue preempted the Workload and has admitted it again, so it runs at its own
priority and is judged afresh. While it waits for readmission the boost stays: lifted then, the
Workload would outrank the one that took its quota and have Kueue preempt that one back.
Pure: the owner walk reads the Workload (adapters/owners.py), the actor writes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpusteward.core.model import Pod, class_of
from gpusteward.core.owners import KUEUE_PRIORITY_BOOST
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import (
    RECLAIM_REASON,
    RECLAIMED_AT,
    Action,
    ActionKind,
    How,
    Owner,
    Reason,
    VerdictState,
)
from gpusteward.core.times import parse_time


def how_for(pod: Pod, policy: Policy) -> How:
    """DEMOTE or DEACTIVATE for an idle Kueue Workload at its idle deadline, by the pod's class."""
    cls = policy.classes.get(class_of(pod.labels, pod.annotations, policy.default_class))
    action = (cls.kueue_action if cls is not None else None) or policy.reclaim.kueue.action
    return How.DEMOTE if action == "demote" else How.DEACTIVATE


def patch(boost: int, reason: str, at: str) -> dict[str, Any]:
    """The merge patch that demotes a Workload, recording why and when."""
    return {"metadata": {"annotations": {KUEUE_PRIORITY_BOOST: str(boost),
                                         RECLAIM_REASON: reason, RECLAIMED_AT: at}}}


UNDO: dict[str, Any] = {"metadata": {"annotations": dict.fromkeys(
    (KUEUE_PRIORITY_BOOST, RECLAIM_REASON, RECLAIMED_AT))}}


def demoted_at(workload: Mapping[str, Any]) -> float | None:
    """When gpusteward demoted this Workload; None when it is not demoted by gpusteward (no
    boost, no record of gpusteward's beside it, or a boost that is no demotion)."""
    annotations = workload.get("metadata", {}).get("annotations") or {}
    boost = annotations.get(KUEUE_PRIORITY_BOOST, "")
    if RECLAIM_REASON not in annotations or not boost.lstrip("-").isdigit() or int(boost) >= 0:
        return None
    try:
        return parse_time(annotations.get(RECLAIMED_AT))
    except ValueError:
        return None


def undemotions(pods: Iterable[Pod], owner_of: Callable[[Pod], Owner],
                states: Mapping[str, VerdictState],
                team_of: Callable[[Pod], str]) -> list[Action]:
    """One UNDEMOTE per demoted Workload with a pod busy again, or one created since (it was
    preempted and is admitted again). states: each judged pod's verdict, by uid."""
    out: dict[str, Action] = {}
    for pod in pods:
        owner = owner_of(pod)
        since = owner.demoted_at
        if since is None or owner.key in out:
            continue
        if states.get(pod.uid) == VerdictState.BUSY:
            reason, why = Reason.ACTIVE, f"pod {pod.key} is busy again"
        elif pod.created_at > since:
            reason, why = Reason.READMITTED, (f"Kueue admitted it again (pod {pod.key} created "
                                              "since its demotion)")
        else:
            continue
        out[owner.key] = Action(ActionKind.UNDEMOTE, pod, team_of(pod), reason,
                                f"priority boost removed: {why}", owner, How.DEMOTE)
    return list(out.values())
