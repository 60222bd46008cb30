"""Step the reclaimer's own decision (core.reclaim.decide.plan) through recorded history.

Each step builds the Snapshot the live reclaimer would have read at that time: the pods then
recorded, bound or pending, carrying the marks this replay wrote (idle-since, reclaim-at), the
evidence over each window the policy needs, the reclaims of the last hour (for the limits). Then
``plan()`` decides, and its actions are carried out on the replay's state as enforce mode would:
marks are written, reclaimed pods (and the rest of a suspended or scaled-down workload, later
pods included) leave the record from then on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

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
from gpusteward.core.times import HOUR, stamp
from gpusteward.core.whatif.history import History, PodRecord
from gpusteward.core.whatif.outcome import Comeback, Outcome, Reclaimed, Warned
from gpusteward.core.whatif.pace import PodWatch, Times, boundaries, needs_everyone, step_at
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
        self.wakeups: list[float] = []  # times a decision falls due: deadlines, limits easing


def replay(history: History, policy: Policy, name: str = "policy",
           every_step: bool = False) -> Outcome:
    """What ``policy`` would have done over ``history``. ``every_step``: decide every cycle
    over every pod, skipping nothing (pace.py; the result is the same, only slower)."""
    grid = history.grid
    state = _State()
    watches: dict[str, PodWatch] = {}  # running pods' evidence and idle flag, by uid
    cache: dict[str, Pod] = {}  # uid -> the snapshot's pod as last built
    due = boundaries(history, policy)
    flips: dict[int, list[str]] = {}  # cycle -> pods whose judged state may change there
    by_start, by_end = _by_start(history), _by_end(history)
    times = {r.pod.uid: Times.of(r, history) for r in history.pods}
    active: dict[str, PodRecord] = {}
    halted, carry = 0, True
    for i in range(grid.steps):
        for r in by_start.get(i, []):
            _watch(r, policy, history, watches, flips)
            active[r.pod.uid] = r
        for r in by_end.get(i, []):  # past its record and the one step it may be kept
            active.pop(r.pod.uid, None)
            watches.pop(r.pod.uid, None)
        flipped = flips.pop(i, [])
        for uid in flipped:
            if uid in watches:
                watches[uid].update(i)
        ok = not history.telemetry or bool(history.telemetry[i])
        if not (every_step or carry or flipped or i in due):
            halted += not ok
            continue
        present = list(_present(active.values(), i, state, history, times))
        if not (every_step or needs_everyone(policy, present, i, history, times)):
            present = [r for r in present if _shown(r, i, state, watches, times)]
        decided = plan(_snapshot(present, i, ok, state, cache, watches, history, policy), policy)
        halted += bool(decided.halted)
        carry = bool(decided.actions or decided.held_back)
        _carry_out(decided, grid.time(i), state, history, i)
        due |= {step_at(history, t) for t in state.wakeups}
        state.wakeups.clear()
    return Outcome(
        policy=name, start=grid.start, end=grid.end, step=grid.step,
        warned=tuple(state.warned), reclaimed=tuple(state.reclaimed),
        comebacks=tuple(sorted(state.comebacks, key=lambda c: (-c.gpus * c.peak_percent,
                                                               c.pod))),
        earlier=tuple(started_earlier(history, state.reclaimed)),
        halted_steps=halted, gaps=history.gaps + _extension_note(state))


def _watch(r: PodRecord, policy: Policy, history: History, watches: dict[str, PodWatch],
           flips: dict[int, list[str]]) -> None:
    if r.running is None:
        return
    w = watches[r.pod.uid] = PodWatch(r, policy, history)
    first, last = max(0, r.running.first), min(history.grid.steps - 1, r.running.last)
    for i in {first} | {f for f in w.flips() if first < f <= last}:
        flips.setdefault(i, []).append(r.pod.uid)


def _shown(r: PodRecord, i: int, state: _State, watches: dict[str, PodWatch],
           times: dict[str, Times]) -> bool:
    """Whether plan() must see this pod (pace.py): it is marked, pending, or judged idle."""
    uid = r.pod.uid
    watch = watches.get(uid)
    t = times[uid]
    return (uid in state.marks or watch is None or watch.idle
            or not t.run_first <= i <= t.run_last)


def _snapshot(present: list[PodRecord], i: int, ok: bool, state: _State,
              cache: dict[str, Pod], watches: dict[str, PodWatch], history: History,
              policy: Policy) -> Snapshot:
    now = history.grid.time(i)
    pods = tuple(_pod_at(r, i, state, cache, history) for r in present)
    running = [(r, p) for r, p in zip(present, pods, strict=True) if p.node]
    needed = {w for r, _ in running for w in watches[r.pod.uid].evidence}
    return Snapshot(
        now=now, pods=pods, nodes=history.nodes, owners=history.owners, namespace_labels={},
        tiers=history.tiers,
        evidence={w: dict(_window(running, w, i, watches)) for w in needed},
        telemetry_ok=ok, telemetry_problem="" if ok else "no GPU sample within staleAfter",
        recent_actions=tuple(a for a in state.recent if now - a.at < HOUR))


def _by_end(history: History) -> dict[int, list[PodRecord]]:
    out: dict[int, list[PodRecord]] = {}
    for r in history.pods:
        out.setdefault(r.last + 2, []).append(r)
    return out


def _by_start(history: History) -> dict[int, list[PodRecord]]:
    out: dict[int, list[PodRecord]] = {}
    for r in history.pods:
        spans = [s.first for s in (r.running, r.pending) if s is not None]
        if spans:
            out.setdefault(max(0, min(spans)), []).append(r)
    return out


def _present(active: Iterable[PodRecord], i: int, state: _State, history: History,
             times: dict[str, Times]) -> Iterator[PodRecord]:
    """The records of step ``i`` the replay has not reclaimed. A warned pod whose record ends
    before its deadline, within one cycle of it, stays one step longer: the record (one sample
    per cycle) cannot tell it from a pod that a reclaimer acting live took at that deadline."""
    for r in active:
        uid = r.pod.uid
        if uid in state.gone:
            continue
        t = times[uid]
        if t.owner is not None and t.owner in state.stopped:
            _kept_down(r, history.owners[uid], state, history)
            continue
        if t.run_first <= i <= t.run_last or t.pending_first <= i <= t.pending_last:
            yield r
        elif t.last < i and t.run_last == i - 1 and uid in state.deadline:
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
            watches: dict[str, PodWatch]) -> Iterator[tuple[str, Evidence]]:
    for r, pod in running:
        ev = watches[pod.uid].evidence.get(window)
        # A pod kept past its record (see _present) is judged on its last recorded step.
        found = ev.at(min(i, r.last)) if ev is not None else None
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
            state.wakeups.append(a.reclaim_at)
            state.warned.append(Warned(a.pod.key, a.team, a.pod.gpus, now, a.reclaim_at))
        elif a.kind == "clear":
            _cleared(a, decided, now, state)
        elif a.kind == "reclaim":
            _reclaim(a, now, state, history, i)


def _cleared(a: Action, decided: Plan, now: float, state: _State) -> None:
    uid = a.pod.uid
    state.marks.pop(uid, None)
    deadline = state.deadline.pop(uid, None)
    since = state.idle_at.pop(uid, None)
    if a.reason != "active" or since is None or (deadline is not None and now > deadline):
        return  # a comeback after the deadline was held back (limits, unknown evidence)
    verdict = next((v for v in decided.verdicts if v.pod == a.pod.key), None)
    peak = verdict.evidence.peak_percent if verdict and verdict.evidence else None
    state.comebacks.append(Comeback(a.pod.key, a.team, a.pod.gpus, since, now,
                                    peak or 0.0, reclaimed=False))


def _reclaim(a: Action, now: float, state: _State, history: History, i: int) -> None:
    assert a.owner is not None
    state.recent.append(PastAction(now, a.team, a.pod.key))
    state.wakeups.append(now + HOUR)  # the per-hour limits ease
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
    out = []
    if state.extended:
        out.append(f"{len(state.extended)} warned pod(s) left the record within a cycle before "
                   "their deadline; they are counted as reclaimed at the deadline (a reclaimer "
                   "acting live may have taken them)")
    taken = sum(r.to_window_end for r in state.reclaimed)
    if taken:
        out.append(f"{taken} pod(s) left the record, running, within a cycle and an eviction "
                   "grace of their replayed reclaim, as a reclaimer acting live makes them do: "
                   "their GPUs count as freed until the window's end (a pod that happened to "
                   "end on its own just then is counted the same)")
    return tuple(out)
