"""Step the reclaimer's own decision (core.reclaim.decide.plan) through recorded history.

Each step builds the Snapshot the live reclaimer would have read at that time: the pods then
recorded, bound or pending, carrying the marks this replay wrote (idle-since, reclaim-at), the
evidence over each window the policy needs, the reclaims of the last hour (for the limits). Then
``plan()`` decides, and its actions are carried out on the replay's state as enforce mode would:
marks are written, reclaimed pods (and the rest of a suspended or scaled-down workload, later
pods included) leave the record from then on. A pod whose GPU's XID count rose within
``health.xidWindow`` is on a faulty GPU at that step (core/health.py), as the live reclaimer's
fault queries would find it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import msgspec

from gpusteward.core.health import Fault, Source
from gpusteward.core.model import Pod
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import gangs
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import Evidence, Snapshot
from gpusteward.core.reclaim.rules import remembered
from gpusteward.core.whatif.carry import ReplayState, carry_out, kept_down, notes
from gpusteward.core.whatif.history import History, PodRecord, xid_steps
from gpusteward.core.whatif.outcome import Outcome
from gpusteward.core.whatif.pace import (
    PodWatch,
    Times,
    boundaries,
    needs_everyone,
    started_at,
    step_at,
)
from gpusteward.core.whatif.waiting import started_earlier


def replay(history: History, policy: Policy, name: str = "policy",
           every_step: bool = False) -> Outcome:
    """What ``policy`` would have done over ``history``. ``every_step``: decide every cycle
    over every pod, skipping nothing (pace.py; the result is the same, only slower)."""
    grid = history.grid
    state = ReplayState()
    watches: dict[str, PodWatch] = {}  # running pods' evidence and idle flag, by uid
    cache: dict[str, Pod] = {}  # uid -> the snapshot's pod as last built
    due = boundaries(history, policy)
    flips: dict[int, list[str]] = {}  # cycle -> pods whose judged state may change there
    by_start, by_end = _by_start(history), _by_end(history)
    times = {r.pod.uid: Times.of(r, history) for r in history.pods}
    gang = {r.pod.uid: g for r in history.pods if (g := gangs.gang_of(r.pod)) is not None}
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
            present = _with_gangs(present, {r.pod.uid for r in present
                                            if _shown(r, i, state, watches, times)}, gang)
        decided = plan(_snapshot(present, i, ok, state, cache, watches, history, policy), policy)
        halted += bool(decided.halted)
        carry = bool(decided.actions or decided.held_back)
        carry_out(decided, grid.time(i), state, history, i, policy)
        due |= {step_at(history, t) for t in state.wakeups}
        state.wakeups.clear()
    return Outcome(
        policy=name, start=grid.start, end=grid.end, step=grid.step,
        warned=tuple(state.warned), reclaimed=tuple(state.reclaimed),
        comebacks=tuple(sorted(state.comebacks, key=lambda c: (-c.gpus * c.peak_percent,
                                                               c.pod))),
        earlier=tuple(started_earlier(history, state.reclaimed)),
        halted_steps=halted, gaps=history.gaps + notes(state, name))


def _watch(r: PodRecord, policy: Policy, history: History, watches: dict[str, PodWatch],
           flips: dict[int, list[str]]) -> None:
    if r.running is None:
        return
    w = watches[r.pod.uid] = PodWatch(r, policy, history)
    first, last = max(0, r.running.first), min(history.grid.steps - 1, r.running.last)
    held = xid_steps(policy, history.grid.step)
    faults = {edge for f, _ in r.faults for edge in (f, f + held)}
    for i in {first} | {f for f in (*w.flips(), *faults) if first < f <= last}:
        flips.setdefault(i, []).append(r.pod.uid)


def _fault_at(r: PodRecord, i: int, held: int) -> Fault | None:
    found = [why for f, why in r.faults if f <= i < f + held]
    return Fault(Source.XID, found[-1]) if found else None


def _shown(r: PodRecord, i: int, state: ReplayState, watches: dict[str, PodWatch],
           times: dict[str, Times]) -> bool:
    """Whether plan() must see this pod (pace.py): it is marked, pending, or judged idle."""
    uid = r.pod.uid
    watch = watches.get(uid)
    t = times[uid]
    return (uid in state.marks or watch is None or watch.idle
            or not t.run_first <= i <= t.run_last)


def _with_gangs(present: list[PodRecord], shown: set[str],
                gang: dict[str, str]) -> list[PodRecord]:
    """The shown pods and every pod of a gang one of them is in (``gang``: uid -> its gang): a
    gang is judged on all its pods (core/reclaim/gangs.py), so a busy rank hidden from plan()
    would let an idle one look like its whole gang."""
    wanted = {gang[u] for u in shown if u in gang}
    return [r for r in present if r.pod.uid in shown or gang.get(r.pod.uid) in wanted]


def _snapshot(present: list[PodRecord], i: int, ok: bool, state: ReplayState,
              cache: dict[str, Pod], watches: dict[str, PodWatch], history: History,
              policy: Policy) -> Snapshot:
    now, kept = history.grid.time(i), remembered(policy)
    pods = tuple(_pod_at(r, i, state, cache, history) for r in present)
    running = [(r, p) for r, p in zip(present, pods, strict=True) if p.node]
    needed = {w for r, _ in running for w in watches[r.pod.uid].evidence}
    held = xid_steps(policy, history.grid.step)
    faults = {p.key: f for r, p in running
              if r.faults and (f := _fault_at(r, i, held)) is not None}
    return Snapshot(
        now=now, pods=pods, nodes=history.nodes, owners=history.owners, namespace_labels={},
        tiers=history.tiers,
        evidence={w: dict(_window(running, w, i, watches)) for w in needed},
        telemetry_ok=ok, telemetry_problem="" if ok else "no GPU sample within staleAfter",
        recent_actions=tuple(a for a in state.recent if now - a.at < kept),
        faults=faults)


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


def _present(active: Iterable[PodRecord], i: int, state: ReplayState, history: History,
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
            kept_down(r, history.owners[uid], state, history)
            continue
        if t.run_first <= i <= t.run_last or t.pending_first <= i <= t.pending_last:
            yield r
        elif (t.last < i and t.run_last == i - 1
              and state.deadline.get(uid, math.inf) <= history.grid.time(i)):
            state.extended.add(uid)
            state.extended_keys.add(r.pod.key)
            yield r


def _pod_at(r: PodRecord, i: int, state: ReplayState, cache: dict[str, Pod],
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
        unschedulable_since=None if running else pending_since,
        started_at=started_at(r, history) if running else None,
        nominated_node=None if running else state.nominated.get(r.pod.uid))
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


