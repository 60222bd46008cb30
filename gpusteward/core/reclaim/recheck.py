"""What must still hold in the cluster's fresh state for a decided action to be carried out, and
the grace period an eviction hands the pod."""

from __future__ import annotations

from collections.abc import Mapping

from gpusteward.core.model import Pod, class_of
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import FAULTY_GPU, IDLE_SINCE, RECLAIM_AT

MARKS = (IDLE_SINCE, RECLAIM_AT, FAULTY_GPU)  # a fault noted meanwhile stops a reclaim
DEFAULT_POD_GRACE = 30  # the API server's default terminationGracePeriodSeconds


def changed(decided: Pod, uid: str, annotations: Mapping[str, str],
            deleting: bool) -> str | None:
    """Why the pod as it is now no longer matches the pod the decision was made on; None when
    it still does: same object (UID), not terminating, the same reclaim marks."""
    if uid != decided.uid:
        return f"pod {decided.key} was replaced (uid {uid}, decided on {decided.uid})"
    if deleting:
        return f"pod {decided.key} is terminating"
    for mark in MARKS:
        now, then = annotations.get(mark), decided.annotations.get(mark)
        if now != then:
            return f"pod {decided.key} {mark} is {now!r}, the decision saw {then!r}"
    return None


def eviction_grace(pod: Pod, own: int | None, policy: Policy) -> int:
    """The longer of the policy's evictionGrace and the pod's own terminationGracePeriodSeconds
    (a checkpointing trainer asks for the time it needs), unless the pod's class sets an
    evictionGraceCap; never below one second."""
    grace = max(float(policy.reclaim.eviction_grace),
                float(DEFAULT_POD_GRACE if own is None else own))
    cls = policy.classes.get(class_of(pod.labels, pod.annotations, policy.default_class))
    if cls is not None and cls.eviction_grace_cap is not None:
        grace = min(grace, float(cls.eviction_grace_cap))
    return max(1, int(grace))
