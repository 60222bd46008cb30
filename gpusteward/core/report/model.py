"""What the fleet report reads and what it says, as immutable values (pure; no I/O).

Counts are in physical GPUs: a pod's `nvidia.com/gpu` request divided by its node's GFD
`nvidia.com/gpu.replicas` (time-slicing), so shared GPUs are never counted twice. GPU-hours are
GPUs times hours. A state is `busy`, `idle`, `unknown` or `faulty` — missing telemetry is unknown,
never idle or busy; a pod on a GPU a health source calls faulty (core/health.py) is faulty, and
its hours are never idle waste.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import msgspec

from gpusteward.core.reclaim.model import Snapshot, VerdictState

DIMENSIONS = ("team", "card", "node", "namespace", "class")


class UsageState(StrEnum):
    """A pod's state over the report window: the reclaimer's idle rule (rules.judge) judged on
    the whole window, or gone."""

    BUSY = "busy"
    IDLE = "idle"
    UNKNOWN = "unknown"
    FAULTY = "faulty"  # on a faulty GPU now: neither idle nor the team's waste
    GONE = "gone"  # left the cluster inside the window: counts for GPU-hours only


class DecisionState(StrEnum):
    """The state column of the reclaimer's decision: its verdict on the pod (a VerdictState),
    or halted when the cycle stopped before judging any pod."""

    PROTECTED = VerdictState.PROTECTED.value
    FAULTY = VerdictState.FAULTY.value
    UNKNOWN = VerdictState.UNKNOWN.value
    BUSY = VerdictState.BUSY.value
    IDLE = VerdictState.IDLE.value
    HALTED = "halted"


class Step(StrEnum):
    """The decision's action column where the reclaimer takes no action on the pod; otherwise
    the column holds the action's kind, a reclaim as ``reclaim/<how>``."""

    NONE = "none"
    HELD = "held"  # an action was due, but a limit held it back this cycle
    SNOOZED = "snoozed"  # its owner snoozed reclaim (gpusteward.io/reclaim-snooze-until)


class Window(msgspec.Struct, frozen=True):
    """The report's window; the grid of slots ends at start+step, start+2*step, ..., end.

    Slot t covers (t - step, t]; its value is the peak utilization sampled in it.
    """

    start: float
    end: float
    step: float

    @property
    def slots(self) -> tuple[float, ...]:
        n = max(1, round((self.end - self.start) / self.step))
        return tuple(self.end - (n - 1 - i) * self.step for i in range(n))


class Series(msgspec.Struct, frozen=True):
    """One physical GPU's utilization as attributed to one pod: (slot end, percent) points."""

    pod: str  # namespace/name
    node: str
    gpu: str  # the GPU's identity on its node (UUID, else index; MIG instance appended)
    points: tuple[tuple[float, float], ...] = ()


class ReportInput(msgspec.Struct, frozen=True):
    """Everything one report is computed from, read at one moment."""

    snapshot: Snapshot  # the same snapshot the reclaimer decides from
    window: Window
    series: tuple[Series, ...] = ()
    range_ok: bool = True  # False: the range query failed; every pod's usage is unknown
    range_problem: str = ""


class PodUsage(msgspec.Struct, frozen=True):
    """One pod over the window: its current state and its GPU-hours."""

    namespace: str
    name: str
    team: str
    card: str  # GFD product of its node ("unknown" when not known)
    node: str
    cls: str
    owner: str  # Kind/name
    gpus: float  # physical GPUs
    state: UsageState
    why: str
    peak_percent: float | None
    coverage: float
    allocated_hours: float
    idle_hours: float
    unknown_hours: float
    util_seconds: float  # sum of mean utilization (0..1) x GPU-seconds, for the mean
    measured_seconds: float  # GPU-seconds with a sample
    idle_since: float | None
    idle_cost: float | None
    # slot end -> (allocated GPUs, used GPUs) for the timeline charts
    timeline: Mapping[float, tuple[float, float]] = msgspec.field(default_factory=dict)
    fault: str = ""  # state faulty: what the health source says

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class GroupRow(msgspec.Struct, frozen=True):
    name: str
    allocatable: float | None  # only for card and node groups (and the totals)
    allocated: float
    used: float
    idle: float
    unknown: float
    # held by pods on faulty GPUs, and faulty GPUs no pod holds (never counted as free)
    faulty: float
    free: float | None
    allocation_ratio: float | None  # allocated / allocatable
    active_ratio: float | None  # used / allocated
    mean_util_percent: float | None  # over the allocated GPU time that has samples
    allocated_gpu_hours: float
    idle_gpu_hours: float
    unknown_gpu_hours: float
    idle_cost: float | None


class Decision(msgspec.Struct, frozen=True):
    """What the reclaimer would do with a pod this cycle (observe mode), and why."""

    state: DecisionState
    action: str  # a Step, an ActionKind, or reclaim/<How>
    why: str


class IdlePod(msgspec.Struct, frozen=True):
    namespace: str
    pod: str
    owner: str
    team: str
    card: str
    gpus: float
    state: UsageState
    idle_since: float | None
    idle_gpu_hours: float
    idle_cost: float | None
    reclaimer: Decision
    # A gang's line (core/reclaim/gangs.py): it is judged and reclaimed as one, so it is
    # listed as one. ``pod`` is then its first pod by name, the figures its pods' sums.
    gang: str = ""  # "PodGroup ml/train"; empty for a pod on its own
    pods: int = 1
    idle_pods: tuple[str, ...] = ()  # a gang's pods idle over the window, by name


class FaultyPod(msgspec.Struct, frozen=True):
    """A pod holding a GPU a health source calls faulty, and what it says."""

    namespace: str
    pod: str
    team: str
    node: str
    gpus: float
    fault: str


class QueuedPod(msgspec.Struct, frozen=True):
    namespace: str
    pod: str
    team: str
    cls: str
    gpus: int
    priority: int
    wait_seconds: float
    unschedulable: bool
    # GPUs a queue reclaim freed for it and holds for it (core/reclaim/reserve.py); "": none
    reserved_node: str = ""
    reserved_until: str = ""  # RFC 3339
    # A waiting gang's first pod: why the reclaimer frees no idle GPUs for it (its note,
    # gpusteward.io/queue-blocked: freeing some would place only part of the gang).
    not_freed: str = ""


class QueueGroup(msgspec.Struct, frozen=True):
    team: str
    cls: str
    pods: int
    gpus: int
    longest_wait_seconds: float


class TeamQuota(msgspec.Struct, frozen=True):
    team: str
    quota: int | None
    used: float
    borrowed: float
    idle_within_quota: float
    idle_borrowed: float


class TimePoint(msgspec.Struct, frozen=True, array_like=True):
    at: float
    allocated: float
    used: float


class Report(msgspec.Struct, frozen=True):
    window: Window
    by: str
    telemetry_ok: bool
    telemetry_problem: str
    groups: tuple[GroupRow, ...]
    totals: GroupRow
    top_idle: tuple[IdlePod, ...]
    queue: tuple[QueuedPod, ...]
    queue_groups: tuple[QueueGroup, ...]
    quotas: tuple[TeamQuota, ...]
    # dimension (team, card) -> group -> allocated vs used per slot
    timelines: Mapping[str, Mapping[str, tuple[TimePoint, ...]]]
    faulty: tuple[FaultyPod, ...] = ()  # pods on faulty GPUs, most GPUs first
