"""Self-service restore: the owner of a workload gpusteward stopped sets
``gpusteward.io/restore: "true"`` on it, and the next cycle brings it back through the same
path as ``gpusteward reclaimer restore`` — if its team's quota has room. Pure: which requests
go ahead, which are refused and why."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpusteward.core.model import Pod
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import RESTORE, RestoreAsk
from gpusteward.core.reclaim.quota import team as team_of
from gpusteward.core.reclaim.quota import usage


def restores(asks: Iterable[RestoreAsk], pods: Iterable[Pod], policy: Policy,
             namespace_labels: Mapping[str, Mapping[str, str]]) -> list[tuple[RestoreAsk, str]]:
    """(request, "" or why refused), in name order. Pending pods count against the quota too
    (a workload restored last cycle may still wait for its node), and so does each restore
    granted before the next."""
    pods = list(pods)
    teams = usage(pods, policy, namespace_labels)
    for p in pods:
        if p.node is None and not p.deleting and team_of(p, namespace_labels) in teams:
            teams[team_of(p, namespace_labels)].used += p.gpus
    out: list[tuple[RestoreAsk, str]] = []
    for ask in sorted(asks, key=lambda a: a.key):
        team = teams.get(ask.team)
        if team is not None and team.quota is not None and not team.under_after(ask.gpus):
            out.append((ask, (
                f"not restored: team {ask.team} holds {team.used} of its {team.quota} GPUs and "
                f"{ask.kind} {ask.name} needs {ask.gpus} more; set {RESTORE}=true again once "
                "the team has room")))
            continue
        if team is not None:
            team.used += ask.gpus
        out.append((ask, ""))
    return out
