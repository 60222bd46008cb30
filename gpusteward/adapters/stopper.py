"""Stop an owner through its own switch (core.reclaim.kinds) and bring it back: merge patches on
the owner (or on the object that holds its switch: a Kueue Workload, a KEDA ScaledObject), and the
scale subresource for owners that serve one. A refusal is raised as adapters/errors.py's
``KubeRefused`` (by status: ``KubeConflict``, ``KubeNotFound``...), as the typed clients' are
inside ``kube_errors``, so the actor reports them the same way.

Every stop is fenced on the object it writes: it is read, checked, and written with the
resourceVersion of that read (or of this stop's own write just before), so a change by anyone in
between fails the write with 409 Conflict instead of landing on top of it (reclaimer.actor)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeNotFound, kube_error
from gpusteward.adapters.kube import CALL_TIMEOUT, raw_get
from gpusteward.core.owners import (
    BUILT_IN,
    BUILT_IN_RESOURCES,
    KEDA_PAUSED_REPLICAS,
    PAUSE,
    SCALE,
)
from gpusteward.core.reclaim import demote, kinds
from gpusteward.core.reclaim.model import FENCED_AT, REPLICAS_BEFORE, Owner

MERGE = "application/merge-patch+json"


class Stale(Exception):
    """The object read just before a stop is no longer what the decision saw (already
    stopped by someone else): nothing is written."""


def on_version(read: Mapping[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The merge patch ``body``, fenced on the resourceVersion of ``read``."""
    meta = {**body.get("metadata", {}), "resourceVersion": read["metadata"]["resourceVersion"]}
    return {**body, "metadata": meta}


def object_path(group: str, version: str, namespace: str, plural: str, name: str) -> str:
    return f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"


def switch_path(owner: Owner, catalog: kinds.Catalog) -> str:
    """Where the owner's switch lives: its Workload or ScaledObject, else the owner."""
    if owner.via is not None:
        plural = "scaledobjects" if owner.via.kind == "ScaledObject" else "workloads"
        return object_path(owner.via.group, owner.via.version, owner.namespace, plural,
                           owner.via.name)
    k = catalog.known(owner.group, owner.kind)
    if k is None:
        raise ValueError(f"no switch known for {owner.kind}.{owner.group}")
    return object_path(owner.group, owner.version, owner.namespace, k.plural, owner.name)


# The built-in owners a stop writes by path (core.owners BUILT_IN_RESOURCES): kind -> plural.
APPS = {k: BUILT_IN_RESOURCES[k][1] for k in ("Deployment", "StatefulSet")}
BUILT_IN_PLURALS = {**APPS, "Job": BUILT_IN_RESOURCES["Job"][1]}


def replicas_path(owner: Owner, catalog: kinds.Catalog) -> str:
    """Where a KEDA target's spec.replicas is written with the verbs the reclaimer holds: a
    Deployment or StatefulSet itself (patch, as the built-in scale-down writes it), a scalable
    kind of the catalog through its scale subresource (patch <plural>/scale)."""
    if owner.group == "apps" and owner.kind in APPS:
        return object_path("apps", owner.version, owner.namespace, APPS[owner.kind], owner.name)
    k = catalog.known(owner.group, owner.kind)
    if k is None or k.how != SCALE:
        raise ValueError(f"no way known to scale {owner.kind}.{owner.group}")
    return f"{object_path(owner.group, owner.version, owner.namespace, k.plural, owner.name)}/scale"


class Switches:
    def __init__(self, api: client.ApiClient, catalog: kinds.Catalog = kinds.DEFAULT) -> None:
        self.api = api
        self.catalog = catalog

    async def stop(self, owner: Owner, reason: str, at: str) -> None:
        path = switch_path(owner, self.catalog)
        record = kinds.reclaim_record(reason, at)
        if owner.how == PAUSE:
            scaled_object = await self.patch(path, on_version(await self.get(path), {
                "metadata": {"annotations": {KEDA_PAUSED_REPLICAS: "0", **record}}}))
            if kinds.keda_pause(scaled_object) == kinds.KedaPause.TAKEN:
                # KEDA took the pause but left the target running (kinds.keda_pause): finish
                # it; paused, KEDA will not scale it back until restore removes the pause
                target = replicas_path(owner, self.catalog)
                await self.patch(target, on_version(await self.get(target),
                                                    {"spec": {"replicas": 0}}))
        elif owner.how == SCALE:
            await self.scale_to_zero(path, reason, at)
        else:
            k = (self.catalog.known(owner.via.group, owner.via.kind) if owner.via else
                 self.catalog.known(owner.group, owner.kind))
            assert k is not None
            obj = await self.get(path)
            if kinds.switched_off(k, obj):
                raise Stale(f"{owner.key} was switched off by someone else since the decision")
            await self.patch(path, on_version(obj, kinds.stop_patch(k, reason, at)))

    async def demote(self, owner: Owner, boost: int, reason: str, at: str) -> None:
        """Lower the owner's Kueue Workload's priority by ``boost`` (core/reclaim/demote.py),
        fenced on the read; one demoted meanwhile is left as it is."""
        path = switch_path(owner, self.catalog)
        wl = await self.get(path)
        if demote.demoted_at(wl) is not None:
            raise Stale(f"{owner.key}: its Workload was demoted since the decision")
        await self.patch(path, on_version(wl, demote.patch(boost, reason, at)))

    async def undemote(self, owner: Owner) -> None:
        """Remove gpusteward's priority boost from the owner's Workload, fenced on the read:
        a boost not gpusteward's (changed by hand meanwhile) stays."""
        path = switch_path(owner, self.catalog)
        wl = await self.get(path)
        if demote.demoted_at(wl) is None:
            raise Stale(f"{owner.key}: its Workload is no longer demoted by gpusteward")
        await self.patch(path, on_version(wl, demote.UNDO))

    async def touch(self, owner: Owner, at: str) -> None:
        """Move the resourceVersion of the object a stop of ``owner`` writes first (its switch,
        else the owner), so a stop derived from an older read is refused (core.reclaim.takeover).
        Deliberately unfenced: changing the version is the point."""
        path = (switch_path(owner, self.catalog) if owner.how else
                object_path(BUILT_IN[owner.kind], "v1", owner.namespace,
                            BUILT_IN_PLURALS[owner.kind], owner.name))
        await self.patch(path, {"metadata": {"annotations": {FENCED_AT: at}}})

    async def scale_to_zero(self, path: str, reason: str, at: str) -> None:
        """The count is recorded on the owner first, then the scale subresource set to zero,
        fenced on that record: a failure in between leaves a record restore refuses (replicas
        not 0), never a lost count."""
        scale = await self.get(f"{path}/scale")
        before = int(scale.get("spec", {}).get("replicas") or 0)
        if before == 0:
            raise Stale(f"{path} is already at 0 replicas")
        recorded = await self.patch(path, on_version(scale, {"metadata": {"annotations": {
            REPLICAS_BEFORE: str(before),
            **kinds.reclaim_record(f"{reason}: scaled from {before} to 0", at)}}}))
        await self.patch(f"{path}/scale", on_version(recorded, {"spec": {"replicas": 0}}))

    async def served(self, group: str) -> str | None:
        """The group's preferred version; None where the API server does not serve it."""
        resp = await raw_get(self.api, f"/apis/{group}", [], timeout=CALL_TIMEOUT)
        async with resp:
            body = await resp.read()
        try:
            _raise_for(resp.status, body)
        except KubeNotFound:
            return None
        version: str | None = msgspec.json.decode(body).get("preferredVersion", {}).get(
            "version")
        return version

    async def get(self, path: str) -> dict[str, Any]:
        resp = await raw_get(self.api, path, [], timeout=CALL_TIMEOUT)
        async with resp:
            body = await resp.read()
            _raise_for(resp.status, body)
        found: dict[str, Any] = msgspec.json.decode(body)
        return found

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self.api.call_api(
            path, "PATCH", body=body, auth_settings=["BearerToken"], _preload_content=False,
            _request_timeout=CALL_TIMEOUT,
            header_params={"Content-Type": MERGE, "Accept": "application/json"})
        async with resp:
            data = await resp.read()
            _raise_for(resp.status, data)
        found: dict[str, Any] = msgspec.json.decode(data)
        return found


def _raise_for(status: int, body: bytes) -> None:
    if status >= 300:
        try:
            message = msgspec.json.decode(body).get("message", "")
        except (msgspec.DecodeError, AttributeError):
            message = body[:200].decode(errors="replace")
        raise kube_error(status, message, detail=message)
