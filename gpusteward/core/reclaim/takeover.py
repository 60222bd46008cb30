"""What a replica that has just taken the Lease fences before anything else: the owners of
reclaims another leader may still have in flight.

A reclaim through an owner writes the reason on the pod (fenced on the pod's resourceVersion),
then stops the owner, fenced on the owner's resourceVersion. A leader that stalled between the
two, with its owner write already sent, is not stopped by the pod's marks changing: the owner
did not change. So the new leader changes it: every pod carrying a reclaim reason whose owner is
not stopped yet (a reclaim begun, not finished) gets its owner touched once, which moves the
owner's resourceVersion and makes such a write fail with 409. Pure: the loop carries it out.
"""

from __future__ import annotations

from gpusteward.core.reclaim.model import (
    RECLAIM_REASON,
    Action,
    ActionKind,
    Reason,
    Snapshot,
)
from gpusteward.core.reclaim.quota import team

# Kinds whose stop is a write on an object other than the pod (an eviction is fenced on the pod).
_POD_ONLY = {"Pod", "ReplicaSet", "DaemonSet"}


def fences(snap: Snapshot) -> tuple[Action, ...]:
    """One FENCE per owner with a reclaim begun on one of its pods and not finished."""
    seen: set[str] = set()
    out = []
    for pod in snap.pods:
        owner = snap.owners.get(pod.uid)
        if (RECLAIM_REASON not in pod.annotations or pod.deleting or owner is None
                or owner.in_progress or (owner.kind in _POD_ONLY and not owner.how)
                or owner.key in seen):
            continue
        seen.add(owner.key)
        out.append(Action(ActionKind.FENCE, pod, team(pod, snap.namespace_labels), Reason.IDLE,
                          f"a reclaim of {owner.key} was begun by another leader "
                          f"({pod.annotations[RECLAIM_REASON]}); its owner is touched so that "
                          f"a stop still on its way is refused", owner=owner))
    return tuple(out)
