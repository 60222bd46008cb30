"""How each kind of owner is stopped and brought back through its own, reversible mechanism:
the catalog of kinds (core.owners' table and the policy's own) and the patches that flip their
switches. Pure: the snapshot reader walks the chain and reads the objects; this module says what
to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from gpusteward.core.owners import (
    BUILT_IN,
    DEACTIVATE,
    KEDA_PAUSED_REPLICAS,
    KINDS,
    NO_SWITCH,
    NOTEBOOK_LAST_ACTIVITY,
    NOTEBOOK_STOPPED,
    SCALE,
    STOP,
    SUSPEND,
    Kind,
)
from gpusteward.core.policy import OwnerSwitch
from gpusteward.core.reclaim.model import RECLAIM_REASON, RECLAIMED_AT


class Catalog:
    """The kinds the reclaimer stops through a switch: KINDS, and the policy's own
    (`reclaim.ownerActions.kinds` entries that name a field, an annotation or the scale
    subresource) for kinds gpusteward does not know."""

    def __init__(self, extra: tuple[Kind, ...] = ()) -> None:
        self.kinds = (*KINDS, *extra)

    @classmethod
    def of(cls, owner_kinds: Mapping[str, str | OwnerSwitch]) -> Catalog:
        """From the policy's ownerActions.kinds: its switches (block/evict/annotate are
        decisions, not switches)."""
        return cls(tuple(_from_policy(name, s) for name, s in owner_kinds.items()
                         if isinstance(s, OwnerSwitch)))

    def known(self, group: str, kind: str) -> Kind | None:
        return next((k for k in self.kinds if k.group == group and k.kind == kind), None)

    def by_kind(self, name: str) -> list[Kind]:
        """Kinds a user may name as KIND or KIND.GROUP (the restore command)."""
        kind, _, group = name.partition(".")
        return [k for k in self.kinds if k.kind == kind and (not group or k.group == group)]

    def walkable(self, group: str, kind: str) -> bool:
        """Whether the chain may be followed through an object of this kind (gpusteward can
        read it and knows what its controller does)."""
        return BUILT_IN.get(kind) == group or self.known(group, kind) is not None

    def unsupported(self, group: str, kind: str) -> str:
        """Why an owner of this kind cannot be stopped; empty when it can (or is built in)."""
        if (group, kind) in NO_SWITCH:
            return NO_SWITCH[(group, kind)]
        if self.walkable(group, kind):
            return ""
        return f"unsupported owner {kind}" + (f".{group}" if group else "")


def _from_policy(name: str, switch: OwnerSwitch) -> Kind:
    kind, _, group = name.partition(".")
    source = "the policy's reclaim.ownerActions.kinds"
    if switch.scale:
        return Kind(group, kind, switch.resource, SCALE, source=source)
    if switch.field:
        return Kind(group, kind, switch.resource, SUSPEND, tuple(switch.field.split(".")),
                    source=source)
    return Kind(group, kind, switch.resource, STOP, annotation=switch.annotation, source=source)


DEFAULT = Catalog()


def known_kinds(catalog: Catalog = DEFAULT) -> list[str]:
    """The kinds ``gpusteward reclaimer restore`` brings back, as its usage names them."""
    return ["Job", "Deployment", "StatefulSet", "ScaledObject", *(k.kind for k in catalog.kinds)]


def stop_patch(k: Kind, reason: str, stamp: str) -> dict[str, Any]:
    """The merge patch that stops an owner of kind k, recording why and when."""
    body: dict[str, Any] = {"metadata": {"annotations": reclaim_record(reason, stamp)}}
    if k.field:
        _set(body, k.field, k.how != DEACTIVATE)  # Workload.active=false; suspend=true
    if k.annotation:
        body["metadata"]["annotations"][k.annotation] = (
            stamp if k.annotation == NOTEBOOK_STOPPED else "true")
    return body


def restore_patch(k: Kind, stamp: str) -> dict[str, Any]:
    """The merge patch that undoes stop_patch: the switch back, gpusteward's record removed; a
    Notebook's last activity refreshed so its culler does not stop it again at once."""
    body: dict[str, Any] = {"metadata": {"annotations": dict.fromkeys(RECORD)}}
    if k.field:
        _set(body, k.field, k.how == DEACTIVATE)
    if k.annotation == NOTEBOOK_STOPPED:
        body["metadata"]["annotations"] |= {NOTEBOOK_STOPPED: None, NOTEBOOK_LAST_ACTIVITY: stamp}
    elif k.annotation:
        body["metadata"]["annotations"][k.annotation] = "false"
    return body


RECORD = (RECLAIM_REASON, RECLAIMED_AT)


def reclaim_record(reason: str, stamp: str) -> dict[str, str | None]:
    return {RECLAIM_REASON: reason, RECLAIMED_AT: stamp}


def switched_off(k: Kind, obj: Mapping[str, Any]) -> bool:
    """Whether the owner's switch is in the stopped position (the stop was asked for)."""
    if k.field:
        value = _get(obj, k.field)
        return value is False if k.how == DEACTIVATE else value is True
    if k.annotation:
        value = (obj.get("metadata", {}).get("annotations") or {}).get(k.annotation)
        return value is not None and (k.annotation == NOTEBOOK_STOPPED or value == "true")
    return False


def refused(k: Kind, obj: Mapping[str, Any]) -> str:
    """Why this owner's controller would refuse its switch for this object; empty when it would
    not. KubeRay v1.5.0 validates every RayJob it reconciles and fails one that is suspended with
    shutdownAfterJobFinishes false (controllers/ray/utils/validation.go ValidateRayJobSpec:
    status ValidationFailed), so suspending it would kill the job rather than pause it."""
    if (k.group, k.kind) == ("ray.io", "RayJob") and not switched_off(k, obj) and _get(
            obj, ("spec", "shutdownAfterJobFinishes")) is not True:
        return ("RayJob has shutdownAfterJobFinishes false, and KubeRay fails such a RayJob "
                "when it is suspended")
    return ""


class KedaPause(StrEnum):
    """How far gpusteward's pause of a KEDA ScaledObject has got (``keda_pause``)."""

    NONE = ""  # not paused by gpusteward
    ASKED = "asked"  # our paused-replicas: "0" is set, KEDA has not taken it yet
    # KEDA reports its Paused condition: its HPA and scale loop are stopped, so nothing scales
    # the target back
    TAKEN = "taken"


def keda_pause(scaled_object: Mapping[str, Any]) -> KedaPause:
    """How far gpusteward's pause of a KEDA ScaledObject has got (KedaPause; false: none).

    KEDA v2.18 scales the target to the paused count only in a second reconcile, which can miss
    (kedacore/keda issues 7446 and 7663); a target still running once the pause is taken is left
    for gpusteward to scale to zero, as KEDA was asked to."""
    meta = scaled_object.get("metadata", {})
    annotations = meta.get("annotations") or {}
    if annotations.get(KEDA_PAUSED_REPLICAS) != "0" or RECLAIM_REASON not in annotations:
        return KedaPause.NONE
    conditions = scaled_object.get("status", {}).get("conditions") or []
    taken = any(c.get("type") == "Paused" and c.get("status") == "True" for c in conditions)
    return KedaPause.TAKEN if taken else KedaPause.ASKED


def let_go(k: Kind, obj: Mapping[str, Any]) -> bool:
    """Whether the owner reports its pods gone (RayCluster: the RayClusterSuspended condition;
    RayJob: jobDeploymentStatus Suspended). Kinds without such a status: the switch suffices."""
    if not switched_off(k, obj):
        return False
    if k.stopped is None:
        return True
    where, want = k.stopped
    if where == "condition":
        conditions = obj.get("status", {}).get("conditions") or []
        return any(c.get("type") == want and c.get("status") == "True" for c in conditions)
    return _get(obj, ("status", *where.split(".")[1:])) == want


def _set(body: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    node = body
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value


def _get(obj: Mapping[str, Any], path: tuple[str, ...]) -> object:
    node: Any = obj
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node
