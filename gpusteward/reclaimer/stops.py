"""gpusteward's stop record: one entry per workload it stopped (``model.StopEntry``: which
object, its uid, how, the replicas before a scale to zero, why and when), in the ConfigMap
``<lease name>-stops`` beside the Lease. ``restore`` and self-service restore trust it, not the
object's annotations (core/reclaim/trust.py).

Written ahead (``ahead``): the entry is stored before the stop is attempted, so no stop is made
that restore could not vouch for; when it cannot be stored the stop is not attempted. An entry
without its stop (the stop failed, or found the pods changed) is harmless: restore also checks
that the object is stopped and carries gpusteward's reason; the loop forgets an entry whose stop
is known not to have happened, and a restore forgets the entry it restored.

Bounded: at most once per PRUNE_EVERY, and whenever the record is full, ``record`` drops the
entries whose object is gone or was created again (another uid), one GET each; a record still
holding MAX_ENTRIES refuses the new entry, so that stop is not attempted.

Writers: the leader, and ``gpusteward reclaimer restore`` wherever it runs. Each change reads
the record and writes it back with the resourceVersion it read (adapters/records.py); after a
conflict it reads again, up to RETRIES times.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeNotFound, KubeRefused
from gpusteward.adapters.kube import kube_errors
from gpusteward.adapters.records import ConfigMapRecords, RecordsConflict, RecordsError
from gpusteward.adapters.stopper import APPS, Switches, object_path
from gpusteward.core.owners import V1_GROUPS
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.model import Action, How, StopEntry

log = logging.getLogger("gpusteward.reclaimer")

KEY = "stops"
RETRIES = 3
MAX_ENTRIES = 1000  # a few hundred bytes each: well inside a ConfigMap's 1 MiB
PRUNE_EVERY = 3600.0  # seconds between looks for entries whose object is gone
VIA_PLURAL = {"ScaledObject": "scaledobjects", "Workload": "workloads"}
T = TypeVar("T")


class StopRecordError(RecordsError):
    """The record could not be reached, the object a stop is recorded for could not be read,
    or the record is full (ConfigMap refusals: RecordsError, RecordsConflict)."""


class StopBook:
    """The record, and the reads it needs: the object a stop is about to act on (its uid and
    replicas), and, when pruning, whether each recorded object still exists."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str,
                 catalog: kinds.Catalog = kinds.DEFAULT,
                 clock: Callable[[], float] = time.time) -> None:
        self.records = ConfigMapRecords(api, namespace, name, StopEntry, key=KEY,
                                        holds="a list of stops")
        self.switches = Switches(api, catalog)
        self.catalog, self.clock = catalog, clock
        self.pruned_at: float | None = None  # this process's last prune

    @property
    def where(self) -> str:
        return self.records.where

    async def ahead(self, action: Action) -> StopEntry | None:
        """Record the stop ``action`` is about to make, before it is made; None when there is
        nothing to restore afterwards (an eviction). Raises StopRecordError."""
        target = target_of(action, self.catalog)
        if target is None:
            return None
        group, version, kind, plural, name, how = target
        assert action.owner is not None
        path = object_path(group, version, action.owner.namespace, plural, name)
        obj = await self._read(path)
        replicas = None
        if how == How.SCALE:
            scale = obj if group in V1_GROUPS else await self._read(f"{path}/scale")
            replicas = int(scale.get("spec", {}).get("replicas") or 0)
        entry = StopEntry(action.owner.namespace, group, kind, plural, name,
                          obj.get("metadata", {}).get("uid", ""), how, replicas,
                          str(action.reason), self.clock())
        if how == How.PAUSE and await self._finishing(entry):
            return None
        await self.record(entry)
        return entry

    async def _finishing(self, entry: StopEntry) -> bool:
        """Whether this stop finishes one already recorded for the same object: a KEDA pause
        taken while its target still runs is stopped again (kinds.keda_pause). The first
        entry stands: replaced, and then forgotten when the finishing stop comes to nothing
        (stale), it left a stopped workload that restore refused as unrecorded."""
        earlier = await self.find(entry.namespace, entry.group, entry.kind, entry.name)
        return earlier is not None and earlier.uid == entry.uid and earlier.how == entry.how

    async def record(self, entry: StopEntry) -> None:
        """Add ``entry``, replacing one for the same object."""

        async def add(entries: list[StopEntry]) -> list[StopEntry]:
            kept = [e for e in entries if not same_object(e, entry)]
            now = self.clock()
            if len(kept) >= MAX_ENTRIES or self.pruned_at is None or (
                    now - self.pruned_at >= PRUNE_EVERY):
                kept = await self._prune(kept)
                self.pruned_at = now
            if len(kept) >= MAX_ENTRIES:
                raise StopRecordError(f"{self.where} holds {len(kept)} stops of existing "
                                      f"objects, its limit: restore some first")
            return [*kept, entry]

        await self._change(add)

    async def find(self, namespace: str, group: str, kind: str, name: str) -> StopEntry | None:
        wanted = (namespace, group, kind, name)
        return next((e for e in await self.entries()
                     if (e.namespace, e.group, e.kind, e.name) == wanted), None)

    async def entries(self) -> list[StopEntry]:
        return await self._guarded(self.records.load())

    async def forget(self, entry: StopEntry) -> None:
        """Remove ``entry`` (only this one: a newer stop of the same object stays)."""

        async def without(entries: list[StopEntry]) -> list[StopEntry]:
            return [e for e in entries if e != entry]

        await self._change(without)

    async def _change(self, change: Callable[[list[StopEntry]],
                                             Awaitable[list[StopEntry]]]) -> None:
        for attempt in range(RETRIES):
            entries = await self.entries()
            changed = await change(entries)
            if changed == entries:
                return
            try:
                await self._guarded(self.records.save(changed))
                return
            except RecordsConflict:
                if attempt == RETRIES - 1:
                    raise

    async def _prune(self, entries: list[StopEntry]) -> list[StopEntry]:
        """The entries whose object still exists with the recorded uid; kept when in doubt."""
        versions: dict[str, str | None] = {}
        kept = []
        for e in entries:
            try:
                with kube_errors():
                    uid = await self._uid_now(e, versions)
            except KubeNotFound:
                uid = None
            except (KubeRefused, aiohttp.ClientError, TimeoutError):
                kept.append(e)
                continue
            if uid == e.uid:
                kept.append(e)
            else:
                log.info("stop record: forgetting %s (uid %s): %s", e.key, e.uid,
                         "gone" if uid is None else f"now uid {uid}")
        return kept

    async def _uid_now(self, e: StopEntry, versions: dict[str, str | None]) -> str | None:
        """The uid the recorded object has now; None where its group is not served."""
        if e.group not in versions:
            versions[e.group] = ("v1" if e.group in V1_GROUPS else
                                 await self.switches.served(e.group))
        version = versions[e.group]
        if version is None:
            return None
        obj = await self.switches.get(object_path(e.group, version, e.namespace, e.plural,
                                                  e.name))
        uid: str | None = obj.get("metadata", {}).get("uid")
        return uid

    async def _read(self, path: str) -> dict[str, Any]:
        try:
            with kube_errors():
                return await self.switches.get(path)
        except KubeRefused as e:
            raise StopRecordError(f"reading {path} to record its stop: HTTP {e.status} "
                                  f"{e.reason}", e.status) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise StopRecordError(f"reading {path} to record its stop: {e!r}") from e

    async def _guarded(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except (aiohttp.ClientError, TimeoutError) as e:
            raise StopRecordError(f"{self.where}: {e!r}") from e


def target_of(action: Action,
              catalog: kinds.Catalog) -> tuple[str, str, str, str, str, How] | None:
    """(group, version, kind, plural, name, how) of the object restore acts on after this
    reclaim: the owner's Kueue Workload or KEDA ScaledObject, else the owner; None for an
    eviction or a demotion (nothing is left to restore)."""
    owner = action.owner
    if owner is None or action.how == How.DEMOTE:
        return None  # an eviction; a demotion stops nothing and goes by itself (demote.py)
    if owner.via is not None:
        v = owner.via
        assert owner.how is not None  # a switch object comes with its mechanism (adapters/owners)
        return v.group, v.version, v.kind, VIA_PLURAL[v.kind], v.name, owner.how
    if owner.how:
        k = catalog.known(owner.group, owner.kind)
        assert k is not None
        return owner.group, owner.version, owner.kind, k.plural, owner.name, owner.how
    if action.how == How.SUSPEND:
        return "batch", "v1", "Job", "jobs", owner.name, How.SUSPEND
    if action.how == How.SCALE:
        return "apps", "v1", owner.kind, APPS[owner.kind], owner.name, How.SCALE
    return None


def same_object(a: StopEntry, b: StopEntry) -> bool:
    return (a.namespace, a.group, a.kind, a.name) == (b.namespace, b.group, b.kind, b.name)
