"""Pod UID -> namespace/name for the pods on this node, from the API server.

A GPU process's cgroup names its pod's UID; PodResources names pods but gives no UID. On a
shared GPU the agent joins the two through the API server (LIST pods with
``fieldSelector=spec.nodeName=<node>``), as dcgm-exporter does. It lists only when a UID is not
known yet, and at most once per ``min_interval``, so a steady node costs the API server nothing.
A static pod's processes carry its config hash as their UID; its mirror pod in the API carries
that hash in the ``kubernetes.io/config.mirror`` annotation, so both are indexed.

Without API access the agent falls back to ``HOSTNAME`` in the process's environment, which is
the pod name unless the pod sets ``spec.hostname`` (or its name is longer than 63 characters).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import aiohttp
import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.errors import AdapterError
from gpusteward.adapters.kube import list_raw
from gpusteward.core.kubewire import MIRROR_ANNOTATION, Meta

log = logging.getLogger("gpusteward.agent.pods")

PodName = tuple[str, str]  # (namespace, name)
Lister = Callable[[], Awaitable[dict[str, PodName]]]

__all__ = ["PodDirectory", "PodName", "api_lister"]


class _Item(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)


_items = msgspec.json.Decoder(_Item)


def index(metas: Iterable[Meta]) -> dict[str, PodName]:
    """UID (and, for a mirror pod, the static pod's config hash) -> (namespace, name)."""
    found: dict[str, PodName] = {}
    for meta in metas:
        name = (meta.namespace, meta.name)
        found[meta.uid] = name
        mirror = (meta.annotations or {}).get(MIRROR_ANNOTATION)
        if mirror:
            found[mirror] = name
    return found


def api_lister(api: client.ApiClient, node: str, timeout: float = 10.0) -> Lister:
    """LIST this node's pods, metadata decoded only."""
    selectors = [("fieldSelector", f"spec.nodeName={node}")]

    async def lister() -> dict[str, PodName]:
        items, _ = await asyncio.wait_for(
            list_raw(api, "/api/v1/pods", selectors=selectors), timeout)
        return index(_items.decode(raw).metadata for raw in items)

    return lister


class PodDirectory:
    def __init__(self, lister: Lister, min_interval: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lister = lister
        self.min_interval = min_interval
        self.clock = clock
        self.ok: bool | None = None  # None until the first LIST
        self._known: dict[str, PodName] = {}
        self._listed_at: float | None = None

    async def resolve(self, uids: Iterable[str]) -> dict[str, PodName]:
        """The names of the UIDs this node's pods have; a failed LIST keeps what was known."""
        wanted = set(uids)
        if wanted - self._known.keys() and self._may_list():
            await self._list()
        return {uid: self._known[uid] for uid in wanted if uid in self._known}

    def _may_list(self) -> bool:
        return self._listed_at is None or self.clock() - self._listed_at >= self.min_interval

    async def _list(self) -> None:
        self._listed_at = self.clock()
        try:
            self._known = await self.lister()
        except (AdapterError, aiohttp.ClientError, OSError, TimeoutError,
                msgspec.DecodeError) as e:
            if self.ok is not False:
                log.warning("listing this node's pods failed (pod names from HOSTNAME until "
                            "it works): %s", e)
            self.ok = False
            return
        if self.ok is False:
            log.info("listing this node's pods works again")
        self.ok = True
