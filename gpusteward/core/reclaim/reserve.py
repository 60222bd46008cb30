"""Reservations: GPUs a queue reclaim freed (queue.py) go to the pod they were freed for.

Just before the victims' reclaims, the waiting pod is nominated to the node (no scheduling
attempt in between finds the GPUs free; the reclaimer releases it at once if a victim is not
reclaimed after all): its
``status.nominatedNodeName``, which kube-scheduler's nominator honours whoever set it (KEP-5278,
beta and on by default from 1.35: pkg/scheduler/backend/queue/nominator.go adds a pod updated
with a nominated node, and filtering counts the nominated pods of equal or higher priority on
a node before placing another pod there). The reservation itself, written beside it in the
pod's ``gpusteward.io/reserved`` annotation, says for how long; it lives on the API object, so
every replica of the reclaimer and the extender sees it. The extender keeps the GPUs from every
other pod while it lasts (extender/view.py, extender/preempt.py).

The nomination may not last: a scheduling attempt of the pod that fails (its victims still
terminating) clears it (pkg/scheduler/schedule_one.go, clearNominatedNode), and from then on the
reservation alone, through the extender, keeps the GPUs. A reservation ends when its pod binds
(anywhere), when it expires, when the pod's priority or GPU demand changes, or when the
scheduler nominates it elsewhere; a deleted pod takes it along. One that ends further off than
``queue.reservationTtl`` is not one gpusteward made (a hand edit): it is released, so that no
annotation can keep a pod reserved, and out of the queue, for ever.
While it lasts the queue claims nothing more for that pod (queue.waiting skips it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import msgspec

from gpusteward.core.model import RESERVED, Pod, Reservation, reservation_of
from gpusteward.core.reclaim.model import Action, ActionKind, Reason
from gpusteward.core.times import parse_time, stamp


def read(pod: Pod) -> Reservation | None:
    """The pod's reservation; None when it has none or it is unreadable (a hand edit)."""
    found = reservation_of(pod)
    try:
        return found if found is not None and parse_time(found.until) is not None else None
    except ValueError:
        return None


def held(pod: Pod, now: float) -> Reservation | None:
    """The reservation a pending pod holds now: readable, not expired, on the node it is
    nominated to, for the GPUs it asks; None otherwise (it is the reclaimer's to release). The
    extender keeps these GPUs from every other pod (extender/view.py)."""
    r = read(pod)
    if r is None or pod.node is not None or pod.deleting or pod.nominated_node not in (
            None, r.node):
        return None
    until = parse_time(r.until) or 0.0
    return r if now < until and r.gpus == pod.gpus else None


def written(r: Reservation) -> str:
    return msgspec.json.encode(r).decode()


def reserve(pending: Pod, node: str, victims: Iterable[Pod], team: str, now: float,
            ttl: float) -> Action:
    """The reservation for the pod the victims' GPUs on ``node`` are to be freed for, for the
    policy's TTL; it never outlives the pod's wait (releases: bound or deleted, it ends)."""
    until = now + ttl
    freed = ", ".join(v.key for v in victims)
    return Action(ActionKind.RESERVE, pending, team, Reason.QUEUE,
                  f"{pending.gpus} GPU(s) on {node} reserved until {stamp(until)}, freed by "
                  f"reclaiming {freed}", node=node, until=until,
                  after=tuple(v.uid for v in victims))


def undone(action: Action, why: str) -> Action:
    """The release of a reservation just made whose victims were not all reclaimed."""
    return Action(ActionKind.RELEASE, action.pod, action.team, Reason.RELEASED,
                  f"reservation released: {why}", node=action.node)


def entry(action: Action) -> str:
    """What a reserve action writes in the pod's annotation."""
    assert action.until is not None
    return written(Reservation(action.node, action.pod.gpus, action.pod.priority,
                               stamp(action.until)))


def releases(pods: Iterable[Pod], now: float, ttl: float,
             team_of: Callable[[Pod], str]) -> Iterator[Action]:
    """A release for every reservation that is over, saying why; ``node`` is set where the
    pod's nomination is still the reservation's, for the release to clear it."""
    for pod in pods:
        if RESERVED not in pod.annotations:
            continue
        r = read(pod)
        why = _over(pod, r, now, ttl)
        if why is None:
            continue
        ours = r is not None and pod.node is None and pod.nominated_node == r.node
        yield Action(ActionKind.RELEASE, pod, team_of(pod), Reason.RELEASED,
                     f"reservation released: {why}", node=r.node if r and ours else "")


def _over(pod: Pod, r: Reservation | None, now: float, ttl: float) -> str | None:
    if r is None:
        return "its annotation is unreadable"
    if pod.node is not None:
        return f"bound to {pod.node}"
    if pod.deleting:
        return "the pod is being deleted"
    until = parse_time(r.until) or 0.0
    if until <= now:
        return f"expired at {r.until}"
    if until - now > ttl:
        return f"its end {r.until} lies beyond queue.reservationTtl from now"
    if pod.priority != r.priority or pod.gpus != r.gpus:
        return (f"the pod changed (priority {r.priority} -> {pod.priority}, "
                f"GPUs {r.gpus} -> {pod.gpus})")
    if pod.nominated_node not in (None, r.node):
        return f"the scheduler nominated it to {pod.nominated_node}"
    return None
