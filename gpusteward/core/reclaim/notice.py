"""What a notification says, built from what a cycle did (pure): a workload was warned,
reclaimed, blocked by a PodDisruptionBudget, or restored at its owner's request — with the
evidence, the deadline and the exact commands to snooze it or get it back.

Each notice has an id that names the transition, not the cycle, so a replica that takes over
after a failover computes the same id for the same transition and the outbox sends it once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import (
    RESTORE,
    SNOOZE_UNTIL,
    Action,
    ActionKind,
    ActResult,
    How,
    Owner,
    Plan,
    RestoreAsk,
    RestoreResult,
    Verdict,
)
from gpusteward.core.reclaim.selfservice import SELF_SERVICE_KINDS
from gpusteward.core.reclaim.snooze import caps_for
from gpusteward.core.times import stamp
from gpusteward.core.typedconfig import duration_text


class Notice(msgspec.Struct, frozen=True, rename="camel"):
    id: str
    event: str  # warned | reclaimed | blocked | restored
    at: float
    namespace: str
    kind: str  # of the workload: Pod, Deployment, StatefulSet, Job, ...
    name: str
    team: str
    message: str
    pod: str = ""  # namespace/name of the pod the transition concerns, when one does
    gpus: int = 0
    peak_percent: float | None = None
    coverage: float | None = None
    window_seconds: float | None = None
    deadline: float | None = None  # warned: when it is reclaimed unless it gets busy
    snooze: str = ""  # the exact command that snoozes it
    restore: str = ""  # the exact command that gets it back (or why none does)

    @property
    def workload(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


# (action kind, result) -> event
EVENTS = {(ActionKind.WARN, ActResult.DONE): "warned",
          (ActionKind.RECLAIM, ActResult.DONE): "reclaimed",
          (ActionKind.RECLAIM, ActResult.BLOCKED): "blocked"}


def from_cycle(decided: Plan, results: Iterable[ActResult], owners: Mapping[str, Owner],
               policy: Policy, now: float) -> list[Notice]:
    """Notices for the actions carried out (results: one word per action, in order)."""
    verdicts = {v.pod: v for v in decided.verdicts}
    out = []
    for action, result in zip(decided.actions, results, strict=True):
        event = EVENTS.get((action.kind, result))
        if event is None:
            continue
        owner = action.owner or owners.get(action.pod.uid) or Owner(
            "Pod", action.pod.namespace, action.pod.name)
        out.append(_notice(event, action, owner, verdicts.get(action.pod.key), policy, now))
    return out


def _notice(event: str, action: Action, owner: Owner, verdict: Verdict | None, policy: Policy,
            now: float) -> Notice:
    pod = action.pod
    ev = None if verdict is None else verdict.evidence
    # Ids name the transition: a pod is warned once per deadline, reclaimed once, reported
    # blocked once however many cycles the PodDisruptionBudget holds it.
    ident = {"warned": f"warned/{pod.uid}/{stamp(action.reclaim_at or now)}",
             "reclaimed": f"reclaimed/{pod.uid}", "blocked": f"blocked/{pod.uid}"}[event]
    longest = caps_for(pod, action.team, policy).longest
    return Notice(
        id=ident, event=event, at=now, namespace=owner.namespace, kind=owner.kind,
        name=owner.name, team=action.team, message=action.message, pod=pod.key, gpus=pod.gpus,
        peak_percent=None if ev is None else ev.peak_percent,
        coverage=None if ev is None else ev.coverage,
        window_seconds=None if verdict is None or verdict.rule is None else verdict.rule.window,
        deadline=action.reclaim_at,
        snooze=(_annotate(owner, f"{SNOOZE_UNTIL}={duration_text(longest)}") if longest > 0
                else "the policy allows no snooze for this workload"),
        restore=restore_hint(owner, action.how, policy))


def restore_hint(owner: Owner, how: How | None, policy: Policy) -> str:
    """How the owner gets the workload back once it is reclaimed."""
    a = policy.reclaim.owner_actions
    how = how or How({"Job": a.job, "Deployment": a.deployment,
                      "StatefulSet": a.stateful_set}.get(owner.kind, How.EVICT))
    if how in (How.EVICT, How.ANNOTATE, How.BLOCK):
        return ("an evicted pod is gone: start it again from its manifest (its controller, if "
                "any, recreates it)")
    if owner.kind in SELF_SERVICE_KINDS and not owner.how:
        return _annotate(owner, f"{RESTORE}=true")
    return (f"ask an operator to run: gpusteward reclaimer restore "
            f"{owner.namespace}/{owner.kind}/{owner.name}")


def restored(answered: Iterable[tuple[RestoreAsk, RestoreResult, str]],
             now: float) -> list[Notice]:
    """Notices for self-service restores carried out (selfservice answers)."""
    return [Notice(id=f"restored/{ask.key}/{ask.version}", event="restored", at=now,
                   namespace=ask.namespace, kind=ask.kind, name=ask.name, team=ask.team,
                   message=message, gpus=ask.gpus)
            for ask, result, message in answered if result == RestoreResult.RESTORED]


def _annotate(owner: Owner, assignment: str) -> str:
    return (f"kubectl annotate --overwrite -n {owner.namespace} {owner.kind.lower()}/"
            f"{owner.name} {assignment}")
