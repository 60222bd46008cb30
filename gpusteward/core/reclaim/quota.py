"""Team quotas: which of a team's GPUs are borrowed beyond its quota.

A team's running pods are counted oldest first; the GPUs past the quota (in total, or on a tier
with its own quota) are borrowed, and idle borrowed GPUs are reclaimed before anything else. A
running pod counts the physical GPUs it holds (core/sharing.pod_shares: a time-slice or MPS
replica 1/R, a MIG instance its slices, a HAMi slice its cores), so a quota is in GPUs whatever
shares them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import msgspec

from gpusteward.core.model import Pod, team_of
from gpusteward.core.policy import Policy

# A share's float sum (three 1/3 replicas) must not read as over a quota it exactly fills.
_EPSILON = 1e-9


class TeamUsage(msgspec.Struct):
    team: str
    used: float = 0.0
    quota: int | None = None

    @property
    def over(self) -> bool:
        return self.quota is not None and self.used > self.quota + _EPSILON

    def under_after(self, gpus: float) -> bool:
        return self.quota is not None and self.used + gpus <= self.quota + _EPSILON


def team(pod: Pod, namespace_labels: Mapping[str, Mapping[str, str]]) -> str:
    return team_of(pod, namespace_labels.get(pod.namespace))


def usage(pods: Iterable[Pod], policy: Policy,
          namespace_labels: Mapping[str, Mapping[str, str]],
          shares: Mapping[str, float]) -> dict[str, TeamUsage]:
    """Each team's physical GPUs held by its running pods (``shares``: by pod uid, from
    core/sharing.pod_shares)."""
    out = {name: TeamUsage(name, quota=t.quota_gpus) for name, t in policy.teams.items()}
    for p in pods:
        if p.node is None:
            continue
        name = team(p, namespace_labels)
        entry = out.setdefault(name, TeamUsage(name, quota=_quota(policy, name)))
        entry.used += shares[p.uid]
    return out


def _quota(policy: Policy, team_name: str) -> int | None:
    t = policy.teams.get(team_name)
    return None if t is None else t.quota_gpus


def borrowed(pods: Iterable[Pod], policy: Policy,
             namespace_labels: Mapping[str, Mapping[str, str]],
             tiers: Mapping[str, str | None], shares: Mapping[str, float]) -> set[str]:
    """Uids of running pods whose GPUs lie beyond their team's quota (total or per tier)."""
    by_team: dict[str, list[Pod]] = defaultdict(list)
    for p in pods:
        if p.node is not None:
            by_team[team(p, namespace_labels)].append(p)
    out: set[str] = set()
    for name, members in by_team.items():
        spec = policy.teams.get(name)
        if spec is None:
            continue
        members.sort(key=lambda p: (p.created_at, p.uid))
        out |= _past(members, spec.quota_gpus, shares)
        for tier, limit in spec.quota_by_tier.items():
            out |= _past([p for p in members if tiers.get(p.node or "") == tier], limit, shares)
    return out


def _past(pods: list[Pod], limit: int | None, shares: Mapping[str, float]) -> set[str]:
    if limit is None:
        return set()
    total, out = 0.0, set()
    for p in pods:
        total += shares[p.uid]
        if total > limit + _EPSILON:
            out.add(p.uid)
    return out
