"""Which cycles of a replay can change anything, and which pods a cycle must show plan().

A week at a 60 s step is 10,080 cycles; deciding each over every pod costs minutes. Two facts
make most of that work provably idle:

* plan() only acts on a change: a pod turning idle or busy, a mark, a deadline, a pod coming,
  going or coming of age, a pending pod starting to count, telemetry coming or going, or the
  previous cycle's own actions (the next builds on them). A cycle with none of these, after a
  cycle that did nothing, does nothing; it is skipped.
* A pod that is unmarked and judged busy or unknown over every window it may be judged on
  gets no action and changes no other pod's decision, unless team quotas are in force (it
  counts toward its team's use), a pending pod that outranks a running one waits for the
  queue (its GPUs are not free), or another pod of its gang is shown (a gang is judged on all
  its pods: replay._with_gangs). Otherwise such pods are left out of the snapshot.

``replay(..., every_step=True)`` decides every cycle over every pod; the tests hold both to the
same outcome.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import VerdictState
from gpusteward.core.reclaim.rules import judge, rule_for, shelter_for, windows
from gpusteward.core.whatif.evidence import PodEvidence
from gpusteward.core.whatif.history import History, PodRecord, Span

_IDLE = VerdictState.IDLE  # a module name: read at every flip of every pod in a replay


class PodWatch:
    """A running pod's evidence per window it may be judged on, and whether any judges it idle
    (kept current at each of its flips)."""

    def __init__(self, r: PodRecord, policy: Policy, history: History):
        self.rule = rule_for(r.pod, policy)
        self.gpus = r.pod.gpus
        self.evidence = {w: PodEvidence(r.gpus, w, history.grid.step, history.scrape_interval,
                                        r.offset) for w in windows(policy, (r.pod,))}
        self.idle = False

    def flips(self) -> set[int]:
        out: set[int] = set()
        for ev in self.evidence.values():
            out |= ev.flips(self.rule.threshold_percent, self.rule.min_coverage)
        return out

    def update(self, i: int) -> None:
        self.idle = any(
            judge(ev.at(i), msgspec.structs.replace(self.rule, window=w), self.gpus)[0] == _IDLE
            for w, ev in self.evidence.items())


def step_at(history: History, t: float) -> int:
    """The first cycle at or after ``t``."""
    return max(0, math.ceil((t - history.grid.start) / history.grid.step - 1e-9))


def started_at(r: PodRecord, history: History) -> float | None:
    """When the record's pod began to run: its startTime (kube_pod_start_time), else the first
    step it was recorded running."""
    if r.running is None:
        return None
    return r.pod.started_at or history.grid.time(r.running.first)


def boundaries(history: History, policy: Policy) -> set[int]:
    """Cycles at which the record itself changes what plan() sees."""
    out: set[int] = set()
    age = float(policy.reclaim.min_pod_age)
    wait = float(policy.queue.min_wait)
    for r in history.pods:
        for span in (r.running, r.pending):
            if span is not None:
                out |= {span.first, span.last + 1, span.last + 2}
        out.add(step_at(history, r.pod.created_at + age))
        runtime, start = shelter_for(r.pod, policy).min_runtime, started_at(r, history)
        if runtime and start is not None:  # its minRuntime ends
            out.add(step_at(history, start + runtime))
        if r.pending is not None:
            out.add(step_at(history, history.grid.time(r.pending.first) + wait))
    telemetry = history.telemetry
    out |= {i for i in range(1, len(telemetry)) if telemetry[i] != telemetry[i - 1]}
    return {i for i in out if 0 <= i < history.grid.steps}


class Times(NamedTuple):
    """A record's spans as plain numbers (-1 where none), looked up every decided cycle."""

    run_first: int
    run_last: int
    pending_first: int
    pending_last: int
    last: int
    owner: str | None  # the key of the workload the reclaimer would act on

    @classmethod
    def of(cls, r: PodRecord, history: History) -> Times:
        run, pend = r.running or Span(-1, -2), r.pending or Span(-1, -2)
        owner = history.owners.get(r.pod.uid)
        return cls(run.first, run.last, pend.first, pend.last, r.last,
                   owner.key if owner else None)


def needs_everyone(policy: Policy, present: Iterable[PodRecord], i: int, history: History,
                   times: dict[str, Times]) -> bool:
    """Whether this cycle must show plan() every pod: team quotas count all of a team's GPUs,
    and the queue, acting for a pending pod that outranks some running pod, needs every
    node's free GPUs. (Without quotas, a pending pod may only displace lower priorities.)"""
    if policy.teams:
        return True
    if not policy.queue.enabled:
        return False
    wait, now, at = float(policy.queue.min_wait), history.grid.time(i), history.grid.time
    running, waiting = [], []
    for r in present:
        t = times[r.pod.uid]
        if t.run_first <= i <= t.run_last:
            running.append(r.pod.priority)
        elif t.pending_first <= i <= t.pending_last and now - at(t.pending_first) >= wait:
            waiting.append(r.pod.priority)
    return bool(waiting and running) and max(waiting) > min(running)
