"""Which idle rule applies to a pod, what its evidence says, and why a pod may not be touched."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gpusteward.core.model import Pod, class_of
from gpusteward.core.policy import IdleRule, Policy
from gpusteward.core.reclaim.model import OPT_OUT, Evidence, Owner, Rule, VerdictState

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


def protections(pod: Pod, owner: Owner | None, policy: Policy, now: float) -> Iterator[str]:
    """Every reason this pod may not be touched (none: it may be)."""
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
    if pod.phase != "Running":
        yield f"phase {pod.phase}"
