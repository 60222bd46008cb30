"""The policy: one typed, validated YAML file shared by the extender, the reclaimer and the report.

Every field has a unit and a default chosen to be safe on a real fleet; `docs/policy.md` explains
each one. `load_policy` reports all problems at once, each with its field path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import StrEnum
from typing import Annotated, Any, Literal

import msgspec
import yaml

from gpusteward.core import policyyaml
from gpusteward.core.cards import CardPatternError, compile_patterns
from gpusteward.core.owners import has_switch
from gpusteward.core.times import DAY, HOUR, MINUTE
from gpusteward.core.typedconfig import Between, Duration, FieldError, decode, without
from gpusteward.core.vocabulary import CONCEPT_UNIT, Concept, Metric, Unit, Vocabulary, compatible

Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
Weight = Annotated[float, msgspec.Meta(ge=0, le=100)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Name = Annotated[str, msgspec.Meta(min_length=1)]

# Every duration is bounded (docs/policy.md shows each range): a clock of `.nan` or `1e308` would
# stop a loop or overflow the arithmetic that schedules it.
Period = Annotated[Duration, Between(1, HOUR)]  # how often a loop runs
Window = Annotated[Duration, Between(1, 7 * DAY)]  # how far back evidence or an XID reaches
Wait = Annotated[Duration, Between(1, DAY)]  # how long something waits before an action
Shelter = Annotated[Duration, Between(0, DAY)]  # how long work is protected from reclaim; 0: not
# Kueue's priority-boost is a signed int32 (kueue v0.17.0 pkg/util/priority PriorityBoost); a
# demotion lowers, so it is negative.
Boost = Annotated[int, msgspec.Meta(ge=-(2**31), le=-1)]
KueueAction = Literal["deactivate", "demote"]


class Config(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    """Base for policy sections: YAML keys are camelCase, like Kubernetes objects.

    Sections repeat ``frozen=True``: msgspec inherits it, type checkers do not."""


def _factory(cls: type) -> Any:
    return msgspec.field(default_factory=cls)


class MetricName(Config, frozen=True):
    """One name a concept is read under, and the unit its values are in."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")]
    unit: Unit


class TelemetryPolicy(Config, frozen=True):
    source: Literal["prometheus"] = "prometheus"
    # Overridden by --prometheus-url or PROMETHEUS_URL.
    prometheus_url: str | None = None
    # dcgm-exporter releases up to 4.5.x label the node `Hostname`; newer builds use `hostname`;
    # relabelled setups often use `kubernetes_node`. The first label present on a series wins.
    node_labels: list[Name] = msgspec.field(default_factory=lambda: ["Hostname", "hostname"])
    # dcgm-exporter samples every 30 s by default; refreshing faster buys nothing.
    refresh: Period = Duration(15)
    # A sample older than this is treated as missing (neutral score, no reclaim).
    stale_after: Annotated[Duration, Between(1, DAY)] = Duration(120)
    # How often Prometheus stores a sample per GPU: the reclaimer expects window / this many
    # samples and calls a pod's evidence unknown below reclaim.idle.minCoverage of that.
    # dcgm-exporter collects every 30 s; set this to your scrape interval if it is longer.
    scrape_interval: Period = Duration(30)
    query_timeout: Annotated[Duration, Between(1, 10 * MINUTE)] = Duration(10)
    # A pod bound this recently counts as busy on its GPUs whatever they read: a starting pod
    # reads idle while it pulls its image and loads, and a burst would pile onto its node.
    pod_warmup: Annotated[Duration, Between(0, HOUR)] = Duration(60)
    # Whether the scrape keeps the exporter's pod labels over the target's (the ServiceMonitor's
    # honorLabels); `auto` reads both shapes. See core/attribution.py and docs/policy.md.
    honor_labels: bool | Literal["auto"] = "auto"
    # Per concept, the names it is read under, replacing both dcgm-exporter generations' names
    # (core/vocabulary.py): for exporters with a custom counters file or recording rules.
    metrics: dict[str, list[MetricName]] = msgspec.field(default_factory=dict)

    def vocabulary(self) -> Vocabulary:
        return Vocabulary({Concept(c): [Metric(m.name, m.unit) for m in names]
                           for c, names in self.metrics.items() if c in CONCEPT_UNIT})


# NVIDIA NVSentinel: its platform-connector sets a node condition named after each fatal check
# (status True, reason `<check>IsNotHealthy`; False with `<check>IsHealthy` once healthy) of the
# gpu-health-monitor (DCGM health watches) and the syslog-health-monitor (its default checks);
# its fault-quarantine cordons the node and records the event in the `quarantineHealthEvent`
# annotation. Its taints are configured per rule set, none by default.
NVSENTINEL_CONDITIONS = (
    "GpuXidError", "GpuMemWatch", "GpuInforomWatch", "GpuPcieWatch", "GpuNvLinkWatch",
    "GpuThermalWatch", "GpuPowerWatch", "GpuNvswitchFatalWatch", "GpuThermalMarginWatch",
    "GpuPowerBrakeWatch", "SysLogsXIDError", "SysLogsSXIDError", "SysLogsGPUFallenOff")
NVSENTINEL_ANNOTATIONS = ("quarantineHealthEvent",)
# NVIDIA's DRA driver for GPUs (NVMLDeviceHealthCheck gate): `gpu.nvidia.com/xid=<code>` on a
# device after an XID (NoSchedule when critical, None when an application's), and
# `gpu.nvidia.com/gpu-lost` on one that fell off the bus.
NVIDIA_DRA_DEVICE_TAINTS = ("gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost")


class Health(Config, frozen=True):
    # Datacenter GPUs throttle from about 85-90 °C; a GPU this hot should not take new work.
    max_temperature_c: Annotated[float, msgspec.Meta(ge=0, le=150)] = 90.0
    # An XID seen within this window marks the GPU unhealthy.
    xid_window: Window = Duration(600)
    # XIDs 13, 31, 43 and 45 are raised by application faults, not broken hardware.
    ignored_xids: list[Count] = msgspec.field(default_factory=lambda: [13, 31, 43, 45])
    # What a health pipeline writes on a node whose GPU failed: its GPUs are then faulty
    # (core/health.py). Condition types count with status True. Defaults: NVIDIA NVSentinel's.
    node_taints: list[Name] = msgspec.field(default_factory=list)
    node_conditions: list[Name] = msgspec.field(
        default_factory=lambda: list(NVSENTINEL_CONDITIONS))
    node_annotations: list[Name] = msgspec.field(
        default_factory=lambda: list(NVSENTINEL_ANNOTATIONS))
    # DRA device taint keys (ResourceSlice devices[].taints, DeviceTaintRules) that mean the
    # device failed, when their effect is NoSchedule or NoExecute. Default: NVIDIA's driver's.
    device_taints: list[Name] = msgspec.field(
        default_factory=lambda: list(NVIDIA_DRA_DEVICE_TAINTS))


class CardTier(Config, frozen=True):
    name: Name
    # Glob patterns matched against the whole GFD `nvidia.com/gpu.product` label.
    products: list[Name]
    # Optional price used by the report to cost idle GPUs ($ per GPU-hour).
    cost_per_gpu_hour: Annotated[float, msgspec.Meta(ge=0)] | None = None


class Weights(Config, frozen=True):
    card: Weight = 3.0
    coolness: Weight = 2.0
    packing: Weight = 1.0
    health: Weight = 2.0


class IdleRule(Config, frozen=True):
    """When a pod's GPUs count as idle. Unset fields inherit from the level above."""

    threshold_percent: Percent | None = None
    window: Window | None = None
    min_coverage: Ratio | None = None
    grace: Wait | None = None


class Placement(StrEnum):
    """How a class's pods are packed: onto the fullest nodes that fit, or the emptiest."""

    BINPACK = "binpack"
    SPREAD = "spread"


class SnoozeCaps(Config, frozen=True):
    """How far a workload's owner may postpone reclaim (core/reclaim/snooze.py). Unset fields
    inherit: reclaim.snooze, then the pod's class, then its team (the last one set wins)."""

    # The longest snooze, counted from when the reclaimer first sees it; 0: no snoozing.
    max_duration: Annotated[Duration, Between(0, 7 * DAY)] | None = None
    # Snoozes one workload may start in any 7 days.
    max_per_week: Count | None = None


class WorkloadClass(Config, frozen=True):
    # Tiers in order of preference, used when a pod names no card types of its own.
    preferred_tiers: list[Name] = msgspec.field(default_factory=list)
    placement: Placement = Placement.BINPACK
    weights: Weights = _factory(Weights)
    idle: IdleRule = _factory(IdleRule)
    # Caps the eviction grace of this class's pods (else their own grace is the floor).
    eviction_grace_cap: Wait | None = None
    snooze: SnoozeCaps = _factory(SnoozeCaps)
    # Protection windows (core/reclaim/rules.shelters); unset: reclaim.minRuntime and
    # reclaim.reclaimCooldown.
    min_runtime: Shelter | None = None
    reclaim_cooldown: Shelter | None = None
    kueue_action: KueueAction | None = None  # unset: reclaim.kueue.action


def _default_classes() -> dict[str, WorkloadClass]:
    binpack, spread = Placement.BINPACK, Placement.SPREAD
    return {
        "training": WorkloadClass(preferred_tiers=["premium", "standard"], placement=binpack),
        "inference": WorkloadClass(preferred_tiers=["economy", "standard"], placement=spread),
        "batch": WorkloadClass(preferred_tiers=["standard", "economy"], placement=binpack),
        "experiment": WorkloadClass(preferred_tiers=["economy", "standard"], placement=binpack),
    }


def _default_tiers() -> list[CardTier]:
    return [
        CardTier(name="premium", products=["NVIDIA-H100*", "NVIDIA-H200*", "NVIDIA-B200*"]),
        CardTier(name="standard", products=["NVIDIA-A100*", "A100-*", "NVIDIA-L40S*"]),
        CardTier(name="economy", products=["NVIDIA-L4", "NVIDIA-A10", "NVIDIA-T4", "Tesla-T4"]),
    ]


class OwnerSwitch(Config, frozen=True):
    """How the owner of a kind gpusteward has no switch for is stopped, and brought back: one
    of a spec field set to true (false to restore), an annotation set to "true" ("false"), or
    the scale subresource set to zero (the count kept for restore). Only the whole owner is
    stopped, and only when every one of its GPU pods is idle."""

    resource: str  # the plural the API server serves it as, as in RBAC: "pipelines"
    field: str = ""  # "spec.suspend"
    annotation: str = ""  # "example.com/stopped"
    scale: bool = False


class OwnerActions(Config, frozen=True):
    pod: Literal["evict", "annotate"] = "evict"
    job: Literal["suspend", "evict", "annotate"] = "suspend"
    deployment: Literal["scale", "annotate"] = "scale"
    stateful_set: Literal["scale", "annotate"] = "scale"
    # ReplicaSets without a Deployment, custom controllers, ...: block sends an Event and stops
    # nothing (an evicted pod would be recreated by its controller at once).
    unknown: Literal["block", "evict", "annotate"] = "block"
    # Per kind ("Kind.group", e.g. "Trainer.example.com"), overriding unknown: evict where the
    # owner's controller does not recreate an evicted pod, or the owner's own switch.
    kinds: dict[str, Literal["block", "evict", "annotate"] | OwnerSwitch] = msgspec.field(
        default_factory=dict)


class KueueReclaim(Config, frozen=True):
    """What the reclaim of an idle Kueue Workload at its idle deadline does: deactivate it
    (spec.active false: Kueue evicts it at once), or demote it (Kueue's priority-boost set to
    priorityBoost: it runs on, and Kueue preempts it only when a Workload that now outranks it
    needs the quota). Claims for a Workload waiting for quota always deactivate: it needs the
    quota now."""

    action: KueueAction = "deactivate"
    priority_boost: Boost = -1_000_000_000  # below every user PriorityClass (at most 1e9)


class PriorityOverride(Config, frozen=True):
    idle: IdleRule = _factory(IdleRule)
    protected: bool = False


class Limits(Config, frozen=True):
    max_per_cycle: Count = 5
    max_per_hour: Count = 30
    max_per_team_per_hour: Count = 10


class ReclaimMode(StrEnum):
    """How far the reclaimer goes: decide and log only; also annotate and send Events; also act."""

    OBSERVE = "observe"
    WARN = "warn"
    ENFORCE = "enforce"


class Reclaim(Config, frozen=True):
    mode: ReclaimMode = ReclaimMode.OBSERVE
    interval: Period = Duration(60)
    idle: IdleRule = msgspec.field(
        default_factory=lambda: IdleRule(
            threshold_percent=5.0, window=Duration(1800), min_coverage=0.8, grace=Duration(900)
        )
    )
    # Idle GPUs inside a team's quota are only reclaimed after this longer window.
    within_quota_window: Window = Duration(4 * HOUR)
    min_pod_age: Wait = Duration(1800)
    # No reclaim, and no preempt-verb victim, before a pod has run this long (from its
    # status.startTime), whatever its GPUs read: fairness, not telemetry warm-up.
    min_runtime: Shelter = Duration(0)
    # A workload reclaimed is not reclaimed again within this long of that reclaim (the ledger
    # remembers reclaims this long).
    reclaim_cooldown: Shelter = Duration(0)
    # Pods at or above this priority are never touched (system-*-critical are 2e9).
    protected_priority: int = 1_000_000
    priority_classes: dict[str, PriorityOverride] = msgspec.field(default_factory=dict)
    owner_actions: OwnerActions = _factory(OwnerActions)
    kueue: KueueReclaim = _factory(KueueReclaim)
    limits: Limits = _factory(Limits)
    exclude_namespaces: list[Name] = msgspec.field(default_factory=lambda: ["kube-system"])
    exclude_pod_labels: dict[str, str] = msgspec.field(default_factory=dict)
    allow_opt_out: bool = True
    # Eviction grace period handed to the pod; never zero.
    eviction_grace: Wait = Duration(30)
    snooze: SnoozeCaps = msgspec.field(
        default_factory=lambda: SnoozeCaps(max_duration=Duration(8 * HOUR), max_per_week=3))


class Team(Config, frozen=True):
    quota_gpus: Count | None = None
    quota_by_tier: dict[str, Count] = msgspec.field(default_factory=dict)
    snooze: SnoozeCaps = _factory(SnoozeCaps)


class Queue(Config, frozen=True):
    enabled: bool = True
    # A pending pod must wait this long before it may trigger early reclaim.
    min_wait: Wait = Duration(120)
    # GPUs a queue reclaim freed stay reserved for its pod this long, or until it stops waiting:
    # its nomination keeps lower and equal priorities off them meanwhile.
    reservation_ttl: Wait = Duration(120)


class Preemption(Config, frozen=True):
    # Answer the scheduler's preempt verb by keeping only its candidate nodes whose victims are
    # the most idle (all idle, else partly idle, else busy). Off: only protectBusy applies.
    prefer_idle: bool = True
    # Victim class -> preemptor classes that may never preempt a busy pod of it ("*": every
    # class). Unknown evidence counts as busy; with no candidate left the preemptor waits.
    protect_busy: dict[Name, list[Name]] = msgspec.field(default_factory=dict)


NoticeEvent = Literal["warned", "reclaimed", "blocked", "restored"]


class Sink(Config, frozen=True):
    """Where notifications go (gpusteward/reclaimer/notify.py)."""

    name: Name
    # json: gpusteward's own payload; slack: a Slack-compatible incoming-webhook payload.
    format: Literal["json", "slack"] = "json"
    # A file holding the webhook URL, such as a key of a mounted Secret: the URL is a
    # credential and never stands in the policy ConfigMap.
    url_file: Name = "/var/run/secrets/gpusteward/notifications/url"
    events: list[NoticeEvent] = msgspec.field(
        default_factory=lambda: ["warned", "reclaimed", "blocked", "restored"])


class Notifications(Config, frozen=True):
    sinks: list[Sink] = msgspec.field(default_factory=list)
    # Per delivery attempt: a hanging receiver never holds a message longer.
    timeout: Annotated[Duration, Between(1, MINUTE)] = Duration(10)
    # Retried with backoff (1 s doubling to 5 min) for this long, then given up and counted.
    retry_for: Annotated[Duration, Between(1, DAY)] = Duration(HOUR)
    # Messages waiting for delivery; beyond it new ones are dropped and counted. Bounded so the
    # record of them (a ConfigMap, at most 1 MiB) always fits.
    queue_size: Annotated[int, msgspec.Meta(ge=1, le=500)] = 200


class Policy(Config, frozen=True):
    api_version: Literal["gpusteward.io/v1alpha1"] = "gpusteward.io/v1alpha1"
    kind: Literal["Policy"] = "Policy"
    resources: list[Name] = msgspec.field(default_factory=lambda: ["nvidia.com/gpu"])
    telemetry: TelemetryPolicy = _factory(TelemetryPolicy)
    health: Health = _factory(Health)
    card_tiers: list[CardTier] = msgspec.field(default_factory=_default_tiers)
    default_class: Name = "batch"
    classes: dict[str, WorkloadClass] = msgspec.field(default_factory=_default_classes)
    reclaim: Reclaim = _factory(Reclaim)
    teams: dict[str, Team] = msgspec.field(default_factory=dict)
    queue: Queue = _factory(Queue)
    preemption: Preemption = _factory(Preemption)
    notifications: Notifications = _factory(Notifications)


class PolicyError(Exception):
    def __init__(self, source: str, errors: list[FieldError]):
        self.source = source
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"invalid policy {source}:\n{lines}")


_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*\.[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_PLURAL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_SPEC_FIELD = re.compile(r"^spec(\.[A-Za-z][A-Za-z0-9]*)+$")
_ANNOTATION = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*"
                         r"[A-Za-z0-9])?$")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def parse_policy(data: Any, source: str = "<policy>") -> Policy:
    policy, errors = decode(data, Policy)
    if errors:
        # Check the meaning of what did decode too, so every problem is reported at once.
        repaired, still = decode(without(data, [e.keys for e in errors]), Policy)
        if not still:
            reported = {e.keys for e in errors}
            errors += [e for e in _semantic_errors(repaired) if e.keys not in reported]
        raise PolicyError(source, errors)
    errors = list(_semantic_errors(policy))
    if errors:
        raise PolicyError(source, errors)
    return policy


def read_policy(raw: bytes, source: str) -> Policy:
    """A policy from a file's bytes (adapters.policyfile reads them): UTF-8, with or without a
    BOM, no larger than policyyaml.MAX_BYTES (it reads one byte more, to tell)."""
    if len(raw) > policyyaml.MAX_BYTES:
        raise PolicyError(source, [FieldError((), f"larger than {policyyaml.MAX_BYTES} bytes")])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise PolicyError(source, [FieldError((), f"not UTF-8: byte {raw[e.start]:#04x} "
                                                  f"on line {line}")]) from e
    try:
        data = policyyaml.load(text, source)
    except yaml.YAMLError as e:
        raise PolicyError(source, [FieldError((), f"not valid YAML: {e}")]) from e
    return parse_policy(data, source)


def _semantic_errors(p: Policy) -> Iterator[FieldError]:
    tiers = [t.name for t in p.card_tiers]
    for i, name in enumerate(p.resources):
        if not _RESOURCE.match(name):
            yield FieldError(("resources", i), f"{name!r} is not an extended resource name")
    if not p.resources:
        yield FieldError(("resources",), "name at least one GPU resource, e.g. nvidia.com/gpu")
    for i, tier in enumerate(p.card_tiers):
        if tiers.index(tier.name) != i:
            yield FieldError(("cardTiers", i, "name"), f"tier {tier.name!r} is defined twice")
        try:
            compile_patterns(tier.products)
        except CardPatternError as e:
            yield FieldError(("cardTiers", i, "products"), str(e))
    if p.default_class not in p.classes:
        yield FieldError(("defaultClass",), f"{p.default_class!r} is not one of classes")
    for name, cls in p.classes.items():
        yield from _class_errors(("classes", name), cls, tiers)
    for name, team in p.teams.items():
        for tier_name in team.quota_by_tier:
            if tier_name not in tiers:
                yield FieldError(("teams", name, "quotaByTier", tier_name), "unknown card tier")
    for victim, preemptors in p.preemption.protect_busy.items():
        if victim != "*" and victim not in p.classes:
            yield FieldError(("preemption", "protectBusy", victim), "unknown workload class")
        for i, name in enumerate(preemptors):
            if name != "*" and name not in p.classes:
                yield FieldError(("preemption", "protectBusy", victim, i),
                                 f"unknown workload class {name!r}")
    for f in msgspec.structs.fields(IdleRule):
        if getattr(p.reclaim.idle, f.name) is None:
            yield FieldError(("reclaim", "idle", f.encode_name),
                             "must be set: classes and PriorityClasses inherit it from here")
    names = [s.name for s in p.notifications.sinks]
    for i, sink in enumerate(p.notifications.sinks):
        if names.index(sink.name) != i:
            yield FieldError(("notifications", "sinks", i, "name"),
                             f"sink {sink.name!r} is defined twice")
        if not sink.url_file.startswith("/"):
            yield FieldError(("notifications", "sinks", i, "urlFile"),
                             "must be an absolute path to a file holding the URL (a mounted "
                             "Secret), not the URL itself")
    for f in msgspec.structs.fields(SnoozeCaps):
        if getattr(p.reclaim.snooze, f.name) is None:
            yield FieldError(("reclaim", "snooze", f.encode_name),
                             "must be set: classes and teams inherit it from here")
    yield from _metrics_errors(p.telemetry.metrics)
    if p.telemetry.stale_after < p.telemetry.refresh:
        yield FieldError(("telemetry", "staleAfter"), "must be at least telemetry.refresh")
    for kind, action in p.reclaim.owner_actions.kinds.items():
        where = ("reclaim", "ownerActions", "kinds", kind)
        if not _KIND.match(kind):
            yield FieldError(where, "expected Kind.group, e.g. Trainer.example.com")
        if isinstance(action, OwnerSwitch):
            yield from _switch_errors(where, action)


def _metrics_errors(metrics: dict[str, list[MetricName]]) -> Iterator[FieldError]:
    for concept, named in metrics.items():
        where = ("telemetry", "metrics", concept)
        if concept not in CONCEPT_UNIT:
            yield FieldError(where, f"unknown concept; one of {', '.join(CONCEPT_UNIT)}")
            continue
        if not named:
            yield FieldError(where, "name at least one metric")
        for i, m in enumerate(named):
            if not compatible(m.unit, CONCEPT_UNIT[Concept(concept)]):
                yield FieldError((*where, i, "unit"), f"{concept} is not measured in {m.unit}")


def _switch_errors(where: tuple[str, ...], s: OwnerSwitch) -> Iterator[FieldError]:
    kind, _, group = where[-1].partition(".")
    if has_switch(group, kind):
        yield FieldError(where, f"gpusteward already stops {kind} its own way "
                                "(docs/operations.md); map it to block, evict or annotate, or "
                                "leave it out")
    if not _PLURAL.match(s.resource):
        yield FieldError((*where, "resource"), "expected the plural resource name, lower case "
                                               "(e.g. pipelines)")
    if (bool(s.field) + bool(s.annotation) + s.scale) != 1:
        yield FieldError(where, "set exactly one of field, annotation or scale: true")
    if s.field and not _SPEC_FIELD.match(s.field):
        yield FieldError((*where, "field"), "expected a boolean field under spec, e.g. "
                                            "spec.suspend (status and metadata are not ours "
                                            "to write)")
    if s.annotation and (not _ANNOTATION.match(s.annotation) or
                         s.annotation.startswith("gpusteward.io/")):
        yield FieldError((*where, "annotation"), "expected a qualified annotation key "
                                                 "(prefix/name) outside gpusteward.io/")


def _class_errors(
    path: tuple[str, str], cls: WorkloadClass, tiers: list[str]
) -> Iterator[FieldError]:
    for i, tier in enumerate(cls.preferred_tiers):
        if tier not in tiers:
            yield FieldError((*path, "preferredTiers", i), f"unknown card tier {tier!r}")
    w = cls.weights
    if w.card + w.coolness + w.packing + w.health <= 0:
        yield FieldError((*path, "weights"), "at least one weight must be above zero")
