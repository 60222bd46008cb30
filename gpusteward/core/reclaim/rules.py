"""Which idle rule applies to a pod, what its evidence says, and why a pod may not be touched."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from gpusteward.core.model import Pod, class_of
from gpusteward.core.policy import IdleRule, Policy
from gpusteward.core.reclaim.model import (
    COOLDOWN_UNTIL,
    OPT_OUT,
    Evidence,
    Owner,
    PastAction,
    Rule,
    VerdictState,
)
from gpusteward.core.times import HOUR, parse_time, stamp

# judge runs twice per pod: Python 3.11 looks every `Enum.MEMBER` up through
# EnumType.__getattr__ (~0.1 µs, twenty times a global), so it reads them from module names.
_UNKNOWN, _BUSY, _IDLE = VerdictState.UNKNOWN, VerdictState.BUSY, VerdictState.IDLE


def rule_for(pod: Pod, policy: Policy) -> Rule:
    """Policy default, overridden by the pod's class, then by its PriorityClass."""
    levels = [policy.reclaim.idle]
    cls = policy.classes.get(class_of(pod.labels, pod.annotations, policy.default_class))
    if cls is not None:
        levels.append(cls.idle)
    override = policy.reclaim.priority_classes.get(pod.priority_class)
    if override is not None:
        levels.append(override.idle)
    merged = IdleRule()
    for level in levels:
        merged = IdleRule(
            threshold_percent=_pick(level.threshold_percent, merged.threshold_percent),
            window=_pick(level.window, merged.window),
            min_coverage=_pick(level.min_coverage, merged.min_coverage),
            grace=_pick(level.grace, merged.grace),
        )
    assert merged.threshold_percent is not None and merged.window is not None
    assert merged.min_coverage is not None and merged.grace is not None
    return Rule(merged.threshold_percent, float(merged.window), merged.min_coverage,
                float(merged.grace), fresh_within(policy))


# A GPU is fresh while its newest sample is at most this many scrape intervals old: one missed
# scrape is noise, three in a row are an exporter or a scrape that stopped.
FRESH_SCRAPES = 3


def fresh_within(policy: Policy) -> float:
    """How old a GPU's newest sample may be for its evidence to count: FRESH_SCRAPES scrape
    intervals, never more than telemetry.staleAfter."""
    t = policy.telemetry
    return min(FRESH_SCRAPES * float(t.scrape_interval), float(t.stale_after))


def _pick(value, fallback):  # type: ignore[no-untyped-def]
    return fallback if value is None else value


def windows(policy: Policy, pods: tuple[Pod, ...]) -> set[float]:
    """Every window a cycle needs evidence for: a fixed set, whatever the number of pods."""
    found = {rule_for(p, policy).window for p in pods}
    if policy.teams:
        found |= {max(w, float(policy.reclaim.within_quota_window)) for w in found}
    return found


def is_reading(percent: float) -> bool:
    """Whether a utilization value is one a GPU can report. NaN, ±Inf and values outside 0-100
    come from a broken exporter or query; they are no evidence, and never make a pod idle (NaN
    fails every comparison, so `peak >= threshold` alone would call it idle)."""
    return 0.0 <= percent <= 100.0


def peak_of(values: Iterable[float]) -> float:
    """The highest reading; a value that is no reading wins, so the fold keeps it visible
    (max() keeps or drops a NaN depending on where it stands)."""
    values = list(values)
    broken = [v for v in values if not is_reading(v)]
    return broken[0] if broken else max(values)


def judge(evidence: Evidence | None, rule: Rule, gpus: int) -> tuple[VerdictState, str]:
    """(idle | busy | unknown, why). Missing samples mean unknown, never idle."""
    if evidence is None or evidence.gpus_seen == 0 or evidence.peak_percent is None:
        return _UNKNOWN, "no GPU telemetry for the pod in the window"
    if not is_reading(evidence.peak_percent):
        return _UNKNOWN, (f"GPU utilization reads {evidence.peak_percent:g}, not a value "
                          "in 0-100%: the exporter or its query is broken")
    if evidence.gpus_seen < gpus:
        return _UNKNOWN, f"telemetry covers {evidence.gpus_seen} of its {gpus} GPUs"
    if evidence.age > rule.fresh_within:
        old = "missing" if evidence.age == float("inf") else f"{evidence.age:.0f}s old"
        return _UNKNOWN, (f"the newest sample of one of its GPUs is {old} (fresh within "
                          f"{rule.fresh_within:.0f}s): its exporter or scrape stopped, so the "
                          f"window does not reach the present")
    if evidence.coverage < rule.min_coverage:
        return _UNKNOWN, (f"sample coverage {evidence.coverage:.0%} below "
                          f"{rule.min_coverage:.0%}")
    if evidence.peak_percent >= rule.threshold_percent:
        return _BUSY, (f"peak {evidence.peak_percent:.0f}% >= "
                       f"{rule.threshold_percent:.0f}% in {rule.window:.0f}s")
    return _IDLE, (f"peak {evidence.peak_percent:.0f}% < "
                   f"{rule.threshold_percent:.0f}% over {rule.window:.0f}s "
                   f"(coverage {evidence.coverage:.0%})")


class Shelter(NamedTuple):
    """A class's protection windows in seconds (0: none): the pod's own run, and its workload's
    time since its last reclaim."""

    min_runtime: float
    cooldown: float


def shelter_of(class_name: str, policy: Policy) -> Shelter:
    r, cls = policy.reclaim, policy.classes.get(class_name)
    runtime = cls.min_runtime if cls is not None else None
    cooldown = cls.reclaim_cooldown if cls is not None else None
    return Shelter(float(r.min_runtime if runtime is None else runtime),
                   float(r.reclaim_cooldown if cooldown is None else cooldown))


def shelter_for(pod: Pod, policy: Policy) -> Shelter:
    return shelter_of(class_of(pod.labels, pod.annotations, policy.default_class), policy)


def counts_runtime(policy: Policy) -> bool:
    """Whether any class has a minRuntime (the what-if history then reads start times)."""
    return bool(policy.reclaim.min_runtime) or any(
        c.min_runtime for c in policy.classes.values())


def remembered(policy: Policy) -> float:
    """How long the ledger keeps a reclaim: the per-hour limits' hour, or the longest cooldown."""
    cooldowns = [c.reclaim_cooldown for c in policy.classes.values()
                 if c.reclaim_cooldown is not None]
    return max([float(HOUR), float(policy.reclaim.reclaim_cooldown), *map(float, cooldowns)])


def last_reclaims(recent: Iterable[PastAction]) -> dict[str, float]:
    """Workload (owner key) -> its latest reclaim, from the ledger."""
    out: dict[str, float] = {}
    for a in recent:
        if a.owner and a.at > out.get(a.owner, float("-inf")):
            out[a.owner] = a.at
    return out


def cooldown_end(pod: Pod, policy: Policy, now: float,
                 reclaimed_at: float | None) -> float | None:
    """When the pod's workload, last reclaimed at ``reclaimed_at``, leaves its class's
    reclaimCooldown; None when it is not inside one."""
    cooldown = shelter_for(pod, policy).cooldown
    if cooldown and reclaimed_at is not None and now - reclaimed_at < cooldown:
        return reclaimed_at + cooldown
    return None


def cooling_until(pod: Pod) -> float | None:
    """The end of the reclaimCooldown the reclaimer wrote on the pod (COOLDOWN_UNTIL); None
    when none, or unreadable."""
    try:
        return parse_time(pod.annotations.get(COOLDOWN_UNTIL))
    except ValueError:
        return None


def protections(pod: Pod, owner: Owner | None, policy: Policy, now: float,
                reclaimed_at: float | None = None) -> Iterator[str]:
    """Every reason this pod may not be touched (none: it may be). reclaimed_at: its
    workload's last reclaim, where the ledger remembers one."""
    r = policy.reclaim
    override = r.priority_classes.get(pod.priority_class)
    if pod.priority >= r.protected_priority:
        yield f"priority {pod.priority} >= protected {r.protected_priority}"
    if override is not None and override.protected:
        yield f"PriorityClass {pod.priority_class} is protected by policy"
    if owner is not None and owner.kind == "DaemonSet":
        yield "DaemonSet pod"
    if pod.mirror:
        yield "static (mirror) pod"
    if pod.deleting:
        yield "already terminating"
    if pod.preempted:
        yield "being preempted by the scheduler"
    if pod.namespace in r.exclude_namespaces:
        yield f"namespace {pod.namespace} is excluded"
    if r.exclude_pod_labels and all(pod.labels.get(k) == v
                                    for k, v in r.exclude_pod_labels.items()):
        yield "pod labels match reclaim.excludePodLabels"
    if pod.annotations.get(OPT_OUT) == "never" and r.allow_opt_out:
        yield f"opted out ({OPT_OUT}: never)"
    if now - pod.created_at < r.min_pod_age:
        yield f"younger than {float(r.min_pod_age):.0f}s"
    shelter = shelter_for(pod, policy)
    if shelter.min_runtime and now - pod.run_start < shelter.min_runtime:
        yield (f"inside minRuntime: running {max(0.0, now - pod.run_start):.0f}s of "
               f"{shelter.min_runtime:.0f}s, until {stamp(pod.run_start + shelter.min_runtime)}")
    if (cooled := cooldown_end(pod, policy, now, reclaimed_at)) is not None:
        what = f"{owner.kind} {owner.name}" if owner is not None else "its workload"
        yield (f"inside reclaimCooldown: {what} was reclaimed at {stamp(reclaimed_at or 0)}, "
               f"not again until {stamp(cooled)}")
    if pod.phase != "Running":
        yield f"phase {pod.phase}"
