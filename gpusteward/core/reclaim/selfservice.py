"""Self-service restore: the owner of a workload gpusteward stopped sets
``gpusteward.io/restore: "true"`` on it, and the next cycle brings it back through the same
path as ``gpusteward reclaimer restore`` — if its team's quota has room. Pure: which requests
go ahead, which are refused and why."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from gpusteward.core.kubewire import Meta, PodSpec, pod_request
from gpusteward.core.model import TEAM_LABEL, Pod
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import REPLICAS_BEFORE, RESTORE, RestoreAsk
from gpusteward.core.reclaim.quota import team as team_of
from gpusteward.core.reclaim.quota import usage


def restores(asks: Iterable[RestoreAsk], pods: Iterable[Pod], policy: Policy,
             namespace_labels: Mapping[str, Mapping[str, str]],
             shares: Mapping[str, float]) -> list[tuple[RestoreAsk, str]]:
    """(request, "" or why refused), in name order. Pending pods count against the quota too
    (a workload restored last cycle may still wait for its node), and so does each restore
    granted before the next. A pending pod holds no share yet: it counts its request whole."""
    pods = list(pods)
    teams = usage(pods, policy, namespace_labels, shares)
    for p in pods:
        if p.node is None and not p.deleting and team_of(p, namespace_labels) in teams:
            teams[team_of(p, namespace_labels)].used += p.gpus
    out: list[tuple[RestoreAsk, str]] = []
    for ask in sorted(asks, key=lambda a: a.key):
        team = teams.get(ask.team)
        if team is not None and team.quota is not None and not team.under_after(ask.gpus):
            out.append((ask, (
                f"not restored: team {ask.team} holds {team.used:g} of its {team.quota} GPUs and "
                f"{ask.kind} {ask.name} needs {ask.gpus} more; set {RESTORE}=true again once "
                "the team has room")))
            continue
        if team is not None:
            team.used += ask.gpus
        out.append((ask, ""))
    return out


#: The kinds whose owners restore them themselves (gpusteward.io/restore: "true").
SELF_SERVICE_KINDS = ("Deployment", "StatefulSet", "Job")
_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only: not "٣", "+3", " 3" or "3\n"


def plain_count(text: str | None) -> int | None:
    """A replica count gpusteward recorded, or None for anything else."""
    return int(text) if text is not None and _COUNT.fullmatch(text) else None


class Template(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


_template = msgspec.json.Decoder(Template).decode


def restore_asks(owned: Mapping[str, Sequence[Any]],
                 namespace_labels: Mapping[str, Mapping[str, str]],
                 resources: Sequence[str]) -> tuple[RestoreAsk, ...]:
    """The requests among the LISTed workloads (snapshot.Workload: metadata, spec)."""
    out = []
    for kind in SELF_SERVICE_KINDS:
        for w in owned.get(kind, ()):
            meta = w.metadata
            if (meta.annotations or {}).get(RESTORE) != "true":
                continue
            template = _template(w.spec.template) if w.spec.template else Template()
            per_pod = sum(pod_request(template.spec, resources).values())
            count = (w.spec.parallelism if w.spec.parallelism is not None else 1) \
                if kind == "Job" else plain_count((meta.annotations or {}).get(REPLICAS_BEFORE))
            labels = template.metadata.labels or {}
            team = labels.get(TEAM_LABEL) or namespace_labels.get(meta.namespace, {}).get(
                TEAM_LABEL) or meta.namespace
            out.append(RestoreAsk(kind, meta.namespace, meta.name, team, per_pod * (count or 0),
                                  meta.resource_version))
    return tuple(out)
