"""What the reclaimer decides from, and what it decides: evidence, owners, stages, actions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Self

import msgspec

from gpusteward.core.health import Fault
from gpusteward.core.model import Node, Pod
from gpusteward.core.owners import How

# Annotations the reclaimer writes; restarts lose nothing because the stage lives on the pod.
IDLE_SINCE = "gpusteward.io/idle-since"
RECLAIM_AT = "gpusteward.io/reclaim-at"
RECLAIM_REASON = "gpusteward.io/reclaim-reason"
RECLAIMED_AT = "gpusteward.io/reclaimed-at"  # on an owner stopped through its own switch
FENCED_AT = "gpusteward.io/fenced-at"  # on an owner a new leader fenced (core/reclaim/takeover)
RECLAIM_BLOCKED = "gpusteward.io/reclaim-blocked"  # on a due pod: why nothing was stopped
# On a waiting gang's first pod: why no idle GPUs are freed for it (queue.gang_claim).
QUEUE_BLOCKED = "gpusteward.io/queue-blocked"
FAULTY_GPU = "gpusteward.io/faulty-gpu"  # on a pod whose GPU is faulty: why (core/health.py)
REPLICAS_BEFORE = "gpusteward.io/replicas-before-reclaim"
OPT_OUT = "gpusteward.io/reclaim"  # value "never"
# Set by a workload's owner (core/reclaim/snooze.py): an RFC 3339 time or a duration.
SNOOZE_UNTIL = "gpusteward.io/reclaim-snooze-until"
# Set to "true" by a workload's owner on a workload gpusteward stopped: restore it next cycle.
RESTORE = "gpusteward.io/restore"
# On a pod whose workload is inside its reclaimCooldown (core/reclaim/rules.py): until when, so
# that the extender's preempt verb, which reads no ledger, keeps off it too.
COOLDOWN_UNTIL = "gpusteward.io/reclaim-cooldown-until"


class ActionKind(StrEnum):
    """The stages of a reclaim (module docstring of decide.py), and undoing them."""

    MARK = "mark"  # idle: write idle-since
    WARN = "warn"  # still idle: write reclaim-at
    CLEAR = "clear"  # busy again, or protected: remove the marks
    RECLAIM = "reclaim"  # due, or claimed by the queue: act on the owner
    BLOCK = "block"  # due, but no safe way to stop the owner: an Event says why
    FENCE = "fence"  # a new leader touches the owner of a reclaim begun by another (takeover.py)
    FAULT = "fault"  # its GPU is faulty: write faulty-gpu, remove the idle marks
    RESERVE = "reserve"  # GPUs freed for a waiting pod: nominate it there (reserve.py)
    RELEASE = "release"  # that reservation is over: its annotation and nomination go
    UNDEMOTE = "undemote"  # a demoted Kueue Workload busy or admitted again: its boost goes
    COOL = "cool"  # its workload's reclaimCooldown: write (or remove) COOLDOWN_UNTIL
    UNBLOCK = "unblock"  # a queue note (QUEUE_BLOCKED) no longer holds: it goes


class Reason(StrEnum):
    """Why an action is taken; reclaims are ordered queue, over-quota, idle."""

    IDLE = "idle"
    OVER_QUOTA = "over-quota"  # idle GPUs a team borrows beyond its quota
    QUEUE = "queue"  # idle GPUs a waiting higher-priority pod needs
    ACTIVE = "active"  # busy again: marks cleared
    PROTECTED = "protected"  # protected since it was marked: marks cleared
    SNOOZED = "snoozed"  # its owner snoozed reclaim: marks cleared until the snooze ends
    FAULTY = "faulty"  # on a faulty GPU: not idle, whatever it reads (core/health.py)
    HEALTHY = "healthy"  # its GPU is no longer faulty: the fault note goes, judged afresh
    RELEASED = "released"  # a reservation ended: bound, expired, or its pod changed
    READMITTED = "readmitted"  # a demoted Workload Kueue preempted is admitted again


class VerdictState(StrEnum):
    PROTECTED = "protected"  # a rule forbids touching the pod
    FAULTY = "faulty"  # on a faulty GPU: never idle, never reclaimed as idle
    UNKNOWN = "unknown"  # the evidence says neither idle nor busy
    BUSY = "busy"
    IDLE = "idle"


class ActResult(StrEnum):
    """What became of one action (the `result` label of gpusteward_reclaimer_actions_total)."""

    DONE = "done"
    SKIPPED = "skipped"  # the mode does not let this kind through
    BLOCKED = "blocked"  # a PodDisruptionBudget said not now (HTTP 429)
    GONE = "gone"  # deleted meanwhile
    STALE = "stale"  # the cluster changed since the decision, or the decision is too old
    # This replica no longer holds the Lease or is past its write deadline, or the API server
    # refused the write on its resourceVersion (HTTP 409: the object changed since it was read)
    FENCED = "fenced"
    DEFERRED = "deferred"  # a reclaim in a new leader's first cycle: it re-derives marks first
    FORBIDDEN = "forbidden"  # RBAC
    CONFLICT = "conflict"  # the per-hour ledger was written by someone else meanwhile
    ERROR = "error"


class RestoreResult(StrEnum):
    """How a self-service restore request was answered (the `result` label of
    gpusteward_reclaimer_restores_total)."""

    RESTORED = "restored"
    REFUSED = "refused"  # the rules or the stop record say no: an Event says why
    STALE = "stale"  # withdrawn or changed since it was read: the next cycle looks again
    SKIPPED = "skipped"  # the mode writes nothing
    ERROR = "error"  # the API server refused the restore: an Event says how to retry


class Evidence(msgspec.Struct, frozen=True):
    """A pod's GPU utilization over one window, from telemetry.

    peak_percent: the highest utilization of any of the pod's GPUs in the window.
    coverage: samples present / samples expected, for the worst-covered GPU (0..1).
    gpus_seen: how many of the pod's GPUs have any series at all.
    age: seconds since the newest sample of its stalest GPU (inf: one has no recent sample);
    0 where the source does not say (a replayed history is judged at its own steps).
    """

    window: float
    peak_percent: float | None = None
    coverage: float = 0.0
    gpus_seen: int = 0
    age: float = 0.0


class Rule(msgspec.Struct, frozen=True):
    """The idle rule in force for one pod (policy levels already merged)."""

    threshold_percent: float
    window: float
    min_coverage: float
    grace: float
    # Evidence whose stalest GPU was last sampled longer ago than this is unknown, whatever its
    # coverage: it must reach the present (rules.rule_for: 3 scrape intervals, at most
    # telemetry.staleAfter).
    fresh_within: float = math.inf


class Switch(msgspec.Struct, frozen=True):
    """The object whose switch stops an owner when it is not the owner itself: a Kueue
    Workload, a KEDA ScaledObject."""

    kind: str
    group: str
    version: str
    name: str


class Owner(msgspec.Struct, frozen=True):
    """The workload a pod belongs to, resolved to the object the reclaimer acts on."""

    kind: str  # Pod, Job, Deployment, StatefulSet, ReplicaSet, DaemonSet, or another kind
    namespace: str
    name: str
    # The owner's GPU pods (uids); a Deployment is only scaled when all of them are idle.
    pods: tuple[str, ...] = ()
    # Work already under way on the owner (suspended Job, scaled-down Deployment).
    in_progress: bool = False
    group: str = ""  # API group ("" core, apps, batch, or a CRD's) and version
    version: str = ""
    # Its own stop mechanism (core.reclaim.kinds); None: the policy's ownerActions decide.
    how: How | None = None
    blocked: str = ""  # why it must not be stopped at all (an HPA, an unsupported kind)
    via: Switch | None = None
    snooze: str | None = None  # the owner's SNOOZE_UNTIL annotation
    # When gpusteward demoted its Kueue Workload (core/reclaim/demote.py); None: not demoted.
    demoted_at: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


class StoredWord(StrEnum):
    """A word the reclaimer keeps in a ConfigMap. One this version does not know (a newer
    reclaimer wrote it, or a hand edit) is no error: it reads as itself, a stand-in that is no
    member and equals none, and is written back unchanged."""

    @classmethod
    def _missing_(cls, value: object) -> Self | None:
        if not isinstance(value, str):
            return None
        unknown = str.__new__(cls, value)  # a stand-in that is no member
        unknown._name_ = None  # type: ignore[assignment]  # no member name
        unknown._value_ = value
        return unknown


class PastState(StoredWord):
    """Where a recorded reclaim stands (the ledger ConfigMap's ``state`` words). Both count
    against the limits alike, and so does a word this version does not know."""

    INTENT = "intent"  # recorded before acting, not yet known to be done
    DONE = "done"


class PastAction(msgspec.Struct, frozen=True):
    """A reclaim the ledger remembers: of the last hour (the limits), or of the longest
    reclaimCooldown. An intent counts against the limits like a done one (the actor may have
    died mid-way)."""

    at: float
    team: str
    pod: str = ""  # namespace/name
    state: PastState = PastState.DONE
    owner: str = ""  # the workload reclaimed, Owner.key; empty in entries of older versions


class SnoozeOutcome(StoredWord):
    """What became of a snooze when the reclaimer first saw it (core/reclaim/snooze.py)."""

    SNOOZED = "snoozed"
    CAPPED = "capped"  # cut to the policy's longest snooze
    REFUSED = "refused"  # the caps allow none
    EXPIRED = "expired"  # already past
    MALFORMED = "malformed"
    PROTECTED = "protected"  # nothing to snooze: the pod is never reclaimed anyway


# Outcomes that hold until their time, and count against the weekly cap.
HONOURED = frozenset({SnoozeOutcome.SNOOZED, SnoozeOutcome.CAPPED})


class Closed(StoredWord):
    """Whether a snooze record still applies; a closed one only counts against the weekly cap.
    A word this version does not know reads as closed."""

    OPEN = ""  # it still applies
    ENDED = "ended"  # its time passed
    WITHDRAWN = "withdrawn"  # the annotation changed or went away


class SnoozeRecord(msgspec.Struct, frozen=True):
    """One snooze as the reclaimer first saw it, kept (``reclaimer/snoozes.py``) so that a
    duration counts from a fixed moment and the weekly cap outlives restarts and failovers."""

    workload: str  # where the annotation sits: namespace/Kind/name
    value: str
    team: str
    seen: float
    until: float
    outcome: SnoozeOutcome
    message: str
    closed: Closed = Closed.OPEN

    @property
    def holding(self) -> bool:
        return not self.closed and self.outcome in HONOURED


class StopEntry(msgspec.Struct, frozen=True):
    """One workload gpusteward stopped, as its own stop record (``reclaimer/stops.py``) keeps
    it: written before the stop, removed after a restore. Restore trusts this, not the
    object's annotations, which anyone who can edit the object can write."""

    namespace: str
    group: str  # the object restore acts on: the owner, or its Kueue Workload / ScaledObject
    kind: str
    plural: str
    name: str
    uid: str  # a namesake created after a delete is another object
    how: str  # How word: scale, suspend, stop, pause, deactivate
    replicas: int | None = None  # before a scale to zero: the most restore brings back
    reason: str = ""
    at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


class RestoreAsk(msgspec.Struct, frozen=True):
    """A stopped workload whose owner asked for it back (``RESTORE: "true"``)."""

    kind: str  # Deployment | StatefulSet | Job
    namespace: str
    name: str
    team: str
    gpus: int  # what it holds once back: replicas (or parallelism) x GPUs per pod
    version: str = ""  # resourceVersion read: with the key, names this request

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


class Waiting(msgspec.Struct, frozen=True):
    """A Workload waiting for quota: ``pod`` stands for its demand (namespace, labels, priority,
    all its GPUs, waiting since), so queue.py's rules and the team of it read as for a pod."""

    pod: Pod
    cluster_queue: str


class Holding(msgspec.Struct, frozen=True):
    """An admitted Workload: the quota it holds, and whether Kueue is already evicting it."""

    cluster_queue: str
    gpus: int
    leaving: bool = False


class KueueDemand(msgspec.Struct, frozen=True):
    """Kueue's side of a snapshot (core.reclaim.kueue reads it from the Workloads)."""

    waiting: tuple[Waiting, ...] = ()
    holding: Mapping[str, Holding] = msgspec.field(default_factory=dict)  # namespace/name
    free: Mapping[str, int] = msgspec.field(default_factory=dict)  # ClusterQueue -> GPUs


class Snapshot(msgspec.Struct, frozen=True):
    """Everything one reclaim cycle decides from, read at one moment."""

    now: float
    pods: tuple[Pod, ...]  # GPU pods, bound or pending
    nodes: Mapping[str, Node]
    owners: Mapping[str, Owner]  # pod uid -> owner
    namespace_labels: Mapping[str, Mapping[str, str]]
    # window seconds -> pod key -> evidence over that window
    evidence: Mapping[float, Mapping[str, Evidence]]
    telemetry_ok: bool
    telemetry_problem: str = ""
    recent_actions: tuple[PastAction, ...] = ()
    tiers: Mapping[str, str | None] = msgspec.field(default_factory=dict)  # node -> tier
    snoozes: tuple[SnoozeRecord, ...] = ()  # as recorded so far
    restore_asks: tuple[RestoreAsk, ...] = ()
    kueue: KueueDemand | None = None  # Workloads waiting for quota, where Kueue is installed
    # Utilization series named as percent that read as ratios (adapters/unitaudit.py)
    doubted_series: int = 0
    # Bound pod key -> the fault its GPUs are under (core/health.pod_faults)
    faults: Mapping[str, Fault] = msgspec.field(default_factory=dict)
    # Workload API PodGroups: the gang (gangs.gang_of: "PodGroup ns/name") -> its gang
    # policy's minCount; read only where a waiting pod names one, absent where not served.
    min_counts: Mapping[str, int] = msgspec.field(default_factory=dict)


class Action(msgspec.Struct, frozen=True):
    """One change the reclaimer wants; the act layer carries it out (or, by mode, only logs it)."""

    kind: ActionKind
    pod: Pod
    team: str
    reason: Reason
    message: str
    owner: Owner | None = None
    how: How | None = None  # reclaim only
    reclaim_at: float | None = None  # warn only
    # Reclaim of a whole workload: its other GPU pods as decided on, re-checked before acting.
    peers: tuple[Pod, ...] = ()
    # Reserve: the node and until when; release: the node whose nomination is ours to clear.
    node: str = ""
    until: float | None = None
    # Reserve: the victims (uids) it frees; one not reclaimed this cycle undoes it at once.
    after: tuple[str, ...] = ()
    # A queue reclaim for a waiting gang (gangs.py): the gang's victims pass the limits together
    # or not at all.
    for_gang: str = ""


FAULT_NOTE = "on a faulty GPU, not judged idle: "  # a FAULT action's message, then the fault


def noted_fault(action: Action) -> str:
    """What a FAULT action writes in the pod's FAULTY_GPU annotation: the fault alone."""
    return action.message.removeprefix(FAULT_NOTE)


class Verdict(msgspec.Struct, frozen=True):
    """The audit record of one pod in one cycle."""

    pod: str
    team: str
    gpus: int
    state: VerdictState
    reasons: tuple[str, ...] = ()
    evidence: Evidence | None = None
    rule: Rule | None = None
    borrowed: bool = False
    snoozed_until: float | None = None


class Plan(msgspec.Struct, frozen=True):
    verdicts: tuple[Verdict, ...]
    actions: tuple[Action, ...]
    held_back: tuple[tuple[Action, str], ...] = ()  # reclaim actions a limit stopped, and why
    halted: str = ""  # non-empty: nothing at all was done this cycle, and why
    snoozes: tuple[SnoozeRecord, ...] = ()  # records new or changed this cycle
    # Self-service restores: (request, "" to restore it, else why it is refused).
    restores: tuple[tuple[RestoreAsk, str], ...] = ()
