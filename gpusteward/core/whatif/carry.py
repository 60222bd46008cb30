"""The replay's state, and carrying out plan()'s actions on it as enforce mode would: marks
written and cleared, reclaimed pods (and the rest of a suspended or scaled-down workload) gone
from then on, what each reclaim frees, and the comebacks within the grace."""

from __future__ import annotations

import math

from gpusteward.core.model import RESERVED
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import reserve
from gpusteward.core.reclaim.decide import GROUP_ACTIONS
from gpusteward.core.reclaim.model import (
    COOLDOWN_UNTIL,
    FAULTY_GPU,
    IDLE_SINCE,
    RECLAIM_AT,
    Action,
    ActionKind,
    Owner,
    PastAction,
    Plan,
    Reason,
    noted_fault,
)
from gpusteward.core.reclaim.quota import team
from gpusteward.core.reclaim.rules import shelter_for
from gpusteward.core.times import HOUR, stamp
from gpusteward.core.whatif.history import History, PodRecord
from gpusteward.core.whatif.outcome import Comeback, Reclaimed, Warned


class ReplayState:
    """What the replayed reclaimer has done so far."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, str]] = {}  # pod uid -> the replay's annotations
        self.idle_at: dict[str, float] = {}  # pod uid -> when it was marked idle
        self.deadline: dict[str, float] = {}  # pod uid -> reclaim-at
        self.gone: set[str] = set()  # reclaimed pod uids
        self.stopped: set[str] = set()  # owner keys suspended or scaled down
        self.recent: list[PastAction] = []
        self.warned: list[Warned] = []
        self.reclaimed: list[Reclaimed] = []
        self.comebacks: list[Comeback] = []
        self.extended: set[str] = set()  # pods kept one step past their record (see _present)
        self.extended_keys: set[str] = set()  # the same pods' namespace/name, for the notes
        self.wakeups: list[float] = []  # times a decision falls due: deadlines, limits easing
        self.nominated: dict[str, str] = {}  # pending pod uid -> the node reserved for it


def carry_out(decided: Plan, now: float, state: ReplayState, history: History, i: int,
              policy: Policy) -> None:
    for a in decided.actions:
        uid = a.pod.uid
        if a.kind == ActionKind.MARK:
            state.marks.setdefault(uid, {})[IDLE_SINCE] = stamp(now)
            state.idle_at[uid] = now
        elif a.kind == ActionKind.WARN and a.reclaim_at is not None:
            state.marks.setdefault(uid, {})[RECLAIM_AT] = stamp(a.reclaim_at)
            state.deadline[uid] = a.reclaim_at
            state.wakeups.append(a.reclaim_at)
            state.warned.append(Warned(a.pod.key, a.team, a.pod.gpus, now, a.reclaim_at))
        elif a.kind == ActionKind.CLEAR:
            _cleared(a, decided, now, state)
        elif a.kind == ActionKind.FAULT:  # the idle marks go, the fault is noted
            state.marks[uid] = {FAULTY_GPU: noted_fault(a)}
            state.deadline.pop(uid, None)
            state.idle_at.pop(uid, None)
        elif a.kind == ActionKind.RECLAIM:
            _reclaim(a, now, state, history, i, shelter_for(a.pod, policy).cooldown)
        elif a.kind == ActionKind.RESERVE and a.until is not None:  # as the live actor does
            state.marks.setdefault(uid, {})[RESERVED] = reserve.entry(a)
            state.nominated[uid] = a.node
            state.wakeups.append(a.until)
        elif a.kind == ActionKind.COOL:  # noted on the pod, as the live actor does
            if a.until is None:
                state.marks.get(uid, {}).pop(COOLDOWN_UNTIL, None)
            else:
                state.marks.setdefault(uid, {})[COOLDOWN_UNTIL] = stamp(a.until)
        elif a.kind == ActionKind.RELEASE:
            state.marks.get(uid, {}).pop(RESERVED, None)
            state.nominated.pop(uid, None)


def _cleared(a: Action, decided: Plan, now: float, state: ReplayState) -> None:
    uid = a.pod.uid
    state.marks.pop(uid, None)
    deadline = state.deadline.pop(uid, None)
    since = state.idle_at.pop(uid, None)
    if a.reason != Reason.ACTIVE or since is None or (deadline is not None and now > deadline):
        return  # a comeback after the deadline was held back (limits, unknown evidence)
    verdict = next((v for v in decided.verdicts if v.pod == a.pod.key), None)
    peak = verdict.evidence.peak_percent if verdict and verdict.evidence else None
    state.comebacks.append(Comeback(a.pod.key, a.team, a.pod.gpus, since, now,
                                    peak or 0.0, reclaimed=False))


def _reclaim(a: Action, now: float, state: ReplayState, history: History, i: int,
             cooldown: float) -> None:
    assert a.owner is not None
    state.recent.append(PastAction(now, a.team, a.pod.key, owner=a.owner.key))
    state.wakeups.append(now + HOUR)  # the per-hour limits ease
    if cooldown:
        state.wakeups.append(now + cooldown)  # a recreated workload's cooldown ends
    if a.how in GROUP_ACTIONS:
        state.stopped.add(a.owner.key)
    records = {r.pod.uid: r for r in history.pods}
    for pod in (a.pod, *a.peers):
        state.gone.add(pod.uid)
        state.marks.pop(pod.uid, None)
        state.deadline.pop(pod.uid, None)
        r = records.get(pod.uid)
        if r is not None:
            state.reclaimed.append(_freed(r, a, pod.uid == a.pod.uid, now, history, i))


def state_allowance(history: History) -> int:
    """Cycles after a reclaim within which a pod that leaves the record while running is taken
    to have been reclaimed by a reclaimer acting live (one cycle, and the longest eviction
    grace the pod may have had: the policy's or Kubernetes' default 30 s)."""
    return math.ceil((history.grid.step + history.eviction_grace) / history.grid.step)


def _freed(r: PodRecord, a: Action, first: bool, now: float, history: History,
           i: int) -> Reclaimed:
    grid = history.grid
    last = r.running.last if r.running else i
    cut_short = last <= i + state_allowance(history) and last < grid.steps - 1
    until = grid.end if cut_short or last >= grid.steps - 1 else grid.time(last)
    assert a.owner is not None and a.how is not None
    return Reclaimed(r.pod.key, team(r.pod, {}), r.card, r.pod.node or "", r.pod.gpus,
                     a.owner.key,
                     a.how if first else f"{a.how} (with its workload)", a.reason, now, until,
                     to_window_end=cut_short)


def kept_down(r: PodRecord, owner: Owner, state: ReplayState, history: History) -> None:
    """A later pod of a workload the replay suspended or scaled down would not have existed."""
    state.gone.add(r.pod.uid)
    if r.running is None:
        return
    grid = history.grid
    until = grid.end if r.running.last >= grid.steps - 1 else grid.time(r.running.last)
    state.reclaimed.append(Reclaimed(
        r.pod.key, team(r.pod, {}), r.card, r.pod.node or "", r.pod.gpus, owner.key,
        "kept down", "idle", grid.time(r.running.first), until))


def notes(state: ReplayState, policy: str) -> tuple[str, ...]:
    """What this policy's replay assumed where the record could not tell, named for it."""
    out = []
    kept = sum(1 for r in state.reclaimed if r.pod in state.extended_keys)
    if kept:
        out.append(f"{policy}: {kept} warned pod(s) left the record within a "
                   "cycle before their deadline; they are counted as reclaimed at the deadline "
                   "(a reclaimer acting live may have taken them)")
    taken = sum(r.to_window_end for r in state.reclaimed)
    if taken:
        out.append(f"{policy}: {taken} pod(s) left the record, running, within a cycle and an "
                   "eviction grace of their replayed reclaim, as a reclaimer acting live does: "
                   "their GPUs count as freed until the window's end (a pod that happened to "
                   "end on its own just then is counted the same)")
    return tuple(out)
