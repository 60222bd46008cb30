"""Step the reclaimer's own decision (core.reclaim.decide.plan) through recorded history.

Each step builds the Snapshot the live reclaimer would have read at that time: the pods then
recorded, bound or pending, carrying the marks this replay wrote (idle-since, reclaim-at), the
evidence over each window the policy needs, the reclaims of the last hour (for the limits). Then
``plan()`` decides, and its actions are carried out on the replay's state as enforce mode would:
marks are written, reclaimed pods (and the rest of a suspended or scaled-down workload, later
pods included) leave the record from then on.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from gpusteward.core.model import Pod
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.decide import GROUP_ACTIONS, plan
from gpusteward.core.reclaim.model import (
    IDLE_SINCE,
    RECLAIM_AT,
    Action,
    Evidence,
    Owner,
    PastAction,
    Plan,
    Snapshot,
)
from gpusteward.core.reclaim.quota import team
from gpusteward.core.reclaim.rules import windows
from gpusteward.core.times import HOUR, stamp
from gpusteward.core.whatif.evidence import PodEvidence
from gpusteward.core.whatif.history import History, PodRecord
from gpusteward.core.whatif.outcome import Comeback, Outcome, Reclaimed, Warned
from gpusteward.core.whatif.waiting import started_earlier


class _State:
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


def replay(history: History, policy: Policy, name: str = "policy") -> Outcome:
    grid = history.grid
    state = _State()
    evidence: dict[str, dict[float, PodEvidence]] = {}  # pod uid -> window -> its evidence
    pods: dict[str, Pod] = {}  # uid -> the snapshot's pod as last built
    halted = 0
    by_start = _by_start(history)
    active: list[PodRecord] = []
    for i in range(grid.steps):
        now = grid.time(i)
        active = _still(active, i, evidence) + by_start.get(i, [])
        present = list(_present(active, i, state, history))
        snap_pods = tuple(_pod_at(r, i, state, pods, history) for r in present)
        running = [(r, p) for r, p in zip(present, snap_pods, strict=True) if p.node]
        needed = sorted(windows(policy, tuple(p for _, p in running)))
        ok = not history.telemetry or history.telemetry[i]
        snap = Snapshot(
            now=now, pods=snap_pods, nodes=history.nodes, owners=history.owners,
            namespace_labels={}, tiers=history.tiers,
            evidence={w: dict(_window(running, w, i, evidence, history)) for w in needed},
            telemetry_ok=ok, telemetry_problem="" if ok else "no GPU sample within staleAfter",
            recent_actions=tuple(a for a in state.recent if now - a.at < HOUR))
        decided = plan(snap, policy)
        halted += bool(decided.halted)
        _carry_out(decided, now, state, history, i)
    return Outcome(
        policy=name, start=grid.start, end=grid.end, step=grid.step,
        warned=tuple(state.warned), reclaimed=tuple(state.reclaimed),
        comebacks=tuple(sorted(state.comebacks, key=lambda c: (-c.gpus * c.peak_percent,
                                                               c.pod))),
        earlier=tuple(started_earlier(history, state.reclaimed)),
        halted_steps=halted, gaps=history.gaps + _extension_note(state))


def _still(active: list[PodRecord], i: int,
           evidence: dict[str, dict[float, PodEvidence]]) -> list[PodRecord]:
    """The records that may still be present at step ``i``; the others' evidence is dropped
    (a week of a pod's figures is ~1 MB per window)."""
    kept = []
    for r in active:
        if r.last >= i - 1:
            kept.append(r)
        else:
            evidence.pop(r.pod.uid, None)
    return kept


def _by_start(history: History) -> dict[int, list[PodRecord]]:
    out: dict[int, list[PodRecord]] = {}
    for r in history.pods:
        spans = [s.first for s in (r.running, r.pending) if s is not None]
        if spans:
            out.setdefault(max(0, min(spans)), []).append(r)
    return out


def _present(active: list[PodRecord], i: int, state: _State,
             history: History) -> Iterator[PodRecord]:
    """The records of step ``i`` the replay has not reclaimed. A warned pod whose record ends
    before its deadline, within one cycle of it, stays one step longer: the record (one sample
    per cycle) cannot tell it from a pod that a reclaimer acting live took at that deadline."""
    for r in active:
        uid = r.pod.uid
        if uid in state.gone:
            continue
        owner = history.owners.get(uid)
        if owner is not None and owner.key in state.stopped:
            _kept_down(r, owner, state, history)
            continue
        if r.last >= i:
            if (r.running and r.running.holds(i)) or (r.pending and r.pending.holds(i)):
                yield r
        elif r.running and r.running.last == i - 1 and uid in state.deadline:
            state.extended.add(uid)
            yield r


def _pod_at(r: PodRecord, i: int, state: _State, cache: dict[str, Pod],
            history: History) -> Pod:
    running = r.running is not None and (r.running.holds(i) or r.pod.uid in state.extended)
    marks = state.marks.get(r.pod.uid, {})
    pending_since = history.grid.time(r.pending.first) if r.pending else None
    want = (running, tuple(sorted(marks.items())))
    cached = cache.get(r.pod.uid)
    if cached is not None and (cached.node is not None, tuple(sorted(
            cached.annotations.items()))) == want:
        return cached
    pod = msgspec.structs.replace(
        r.pod, phase="Running" if running else "Pending", node=r.pod.node if running else None,
        annotations={**r.pod.annotations, **marks},
        unschedulable_since=None if running else pending_since)
    cache[r.pod.uid] = pod
    return pod


def _window(running: list[tuple[PodRecord, Pod]], window: float, i: int,
            cache: dict[str, dict[float, PodEvidence]],
            history: History) -> Iterator[tuple[str, Evidence]]:
    for r, pod in running:
        ev = cache.setdefault(pod.uid, {}).get(window)
        if ev is None:
            ev = cache[pod.uid][window] = PodEvidence(
                r.gpus, window, history.grid.step, history.scrape_interval)
        # A pod kept past its record (see _present) is judged on its last recorded step.
        found = ev.at(min(i, r.last)) if r.last >= 0 else None
        if found is not None:
            yield pod.key, found


def _carry_out(decided: Plan, now: float, state: _State, history: History, i: int) -> None:
    for a in decided.actions:
        uid = a.pod.uid
        if a.kind == "mark":
            state.marks.setdefault(uid, {})[IDLE_SINCE] = stamp(now)
            state.idle_at[uid] = now
        elif a.kind == "warn" and a.reclaim_at is not None:
            state.marks.setdefault(uid, {})[RECLAIM_AT] = stamp(a.reclaim_at)
            state.deadline[uid] = a.reclaim_at
            state.warned.append(Warned(a.pod.key, a.team, a.pod.gpus, now, a.reclaim_at))
        elif a.kind == "clear":
            _cleared(a, decided, now, state)
        elif a.kind == "reclaim":
            _reclaim(a, now, state, history, i)


def _cleared(a: Action, decided: Plan, now: float, state: _State) -> None:
    uid = a.pod.uid
    state.marks.pop(uid, None)
    state.deadline.pop(uid, None)
    since = state.idle_at.pop(uid, None)
    if a.reason != "active" or since is None:
        return
    verdict = next((v for v in decided.verdicts if v.pod == a.pod.key), None)
    peak = verdict.evidence.peak_percent if verdict and verdict.evidence else None
    state.comebacks.append(Comeback(a.pod.key, a.team, a.pod.gpus, since, now,
                                    peak or 0.0, reclaimed=False))


def _reclaim(a: Action, now: float, state: _State, history: History, i: int) -> None:
    assert a.owner is not None
    state.recent.append(PastAction(now, a.team, a.pod.key))
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


def _freed(r: PodRecord, a: Action, first: bool, now: float, history: History,
           i: int) -> Reclaimed:
    grid = history.grid
    last = r.running.last if r.running else i
    cut_short = last <= i and last < grid.steps - 1
    until = grid.end if cut_short or last >= grid.steps - 1 else grid.time(last)
    assert a.owner is not None
    return Reclaimed(r.pod.key, team(r.pod, {}), r.card, r.pod.node or "", r.pod.gpus,
                     a.owner.key,
                     a.how if first else f"{a.how} (with its workload)", a.reason, now, until,
                     to_window_end=cut_short)


def _kept_down(r: PodRecord, owner: Owner, state: _State, history: History) -> None:
    """A later pod of a workload the replay suspended or scaled down would not have existed."""
    state.gone.add(r.pod.uid)
    if r.running is None:
        return
    grid = history.grid
    until = grid.end if r.running.last >= grid.steps - 1 else grid.time(r.running.last)
    state.reclaimed.append(Reclaimed(
        r.pod.key, team(r.pod, {}), r.card, r.pod.node or "", r.pod.gpus, owner.key,
        "kept down", "idle", grid.time(r.running.first), until))


def _extension_note(state: _State) -> tuple[str, ...]:
    if not state.extended:
        return ()
    return (f"{len(state.extended)} warned pod(s) left the record within a cycle before their "
            "deadline; they are counted as reclaimed at the deadline (a reclaimer acting live "
            "may have taken them), and their GPUs as freed until the window's end",)


