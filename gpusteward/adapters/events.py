"""Kubernetes Events (core/v1) the reclaimer writes: about a pod it acts on (reclaimer.actor)
and about a workload whose snooze or restore request it answers (``ObjectEvents``).

One body for both. Its timestamps are core.times ``stamp`` (whole seconds, ``Z``): metav1.Time
keeps whole seconds, so this is the form the API server stores and shows back.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeRefused
from gpusteward.adapters.kube import CALL_TIMEOUT, kube_errors, raw_get
from gpusteward.core.kubewire import Meta
from gpusteward.core.owners import BUILT_IN_RESOURCES
from gpusteward.core.times import stamp

# ObjectEvents came from adapters/records: its lines keep the logger name they are selected by.
log = logging.getLogger("gpusteward.reclaimer.records")

COMPONENT = "gpusteward-reclaimer"


class EventWriter:
    """Creates Events; a refusal (KubeRefused, LeaseLost) is the caller's to report."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.instance = socket.gethostname()

    async def write(self, involved: dict[str, str], reason: str, message: str, warning: bool,
                    at: float) -> None:
        """One Event at Unix time ``at`` on ``involved`` (an ObjectReference: kind,
        namespace, name, apiVersion, uid)."""
        namespace, now = involved["namespace"], stamp(at)
        body: Any = {
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason, "message": message[:1000],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT, "reportingInstance": self.instance,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        with kube_errors():
            await self.core.create_namespaced_event(namespace, body,
                                                    _request_timeout=CALL_TIMEOUT)


class _Object(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)


_uid_of = msgspec.json.Decoder(_Object).decode


def resource(kind: str) -> tuple[str, str]:
    """(apiVersion, plural) of a built-in kind. Any other kind is named as core v1 with a
    guessed plural: a core kind (ReplicationController) is then found; any other's read
    fails, and its Event goes without a uid."""
    return BUILT_IN_RESOURCES.get(kind, ("v1", f"{kind.lower()}s"))


class ObjectEvents:
    """Events on any namespaced object, named ``namespace/Kind/name`` (an Owner key)."""

    def __init__(self, api: client.ApiClient, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.writer = EventWriter(api)
        self.clock = clock

    async def emit(self, workload: str, reason: str, message: str, warning: bool = False) -> None:
        """Best effort: a refused Event is logged, never raised."""
        namespace, kind, name = workload.split("/", 2)
        at = self.clock()  # when it was asked for, not when the uid read returned
        involved = {"kind": kind, "namespace": namespace, "name": name,
                    "apiVersion": resource(kind)[0],
                    "uid": await self._uid(namespace, kind, name)}
        try:
            await self.writer.write(involved, reason, message, warning, at)
        except KubeRefused as e:
            log.error("Event %s on %s not created: HTTP %s %s (grant 'create events')", reason,
                      workload, e.status, e.reason)

    async def _uid(self, namespace: str, kind: str, name: str) -> str:
        """The object's uid, so `kubectl describe` lists the Event; "" when it cannot be read."""
        api_version, plural = resource(kind)
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        path = f"{prefix}/namespaces/{namespace}/{plural}/{name}"
        try:
            resp = await raw_get(self.api, path, [], timeout=CALL_TIMEOUT)
            async with resp:
                body = await resp.read() if resp.status == 200 else b"{}"
        except (aiohttp.ClientError, TimeoutError):
            return ""
        return _uid_of(body).metadata.uid or ""
