"""Self-service restore at the edges: find the workloads whose owner set
``gpusteward.io/restore: "true"`` (from the snapshot's LISTs), and carry out the pure decision
(core/reclaim/selfservice.py) through the same Restorer as ``gpusteward reclaimer restore``,
which trusts gpusteward's own stop record (reclaimer/stops.py), not the annotations.

Each request is taken away (the annotation removed, only while it still says "true") before
anything else, so it is answered once: restored, or refused with an Event saying why. Only
"true" asks; any other value is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from kubernetes_asyncio import client

from gpusteward.adapters.errors import AdapterError, KubeRefused
from gpusteward.adapters.kube import CALL_TIMEOUT, kube_errors
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.model import RESTORE, RestoreAsk, RestoreResult
from gpusteward.reclaimer.restore import Restorer, RestoreRefused
from gpusteward.reclaimer.stops import StopBook

log = logging.getLogger("gpusteward.reclaimer")

RESTORED, REFUSED = "GPURestored", "GPURestoreRefused"


class Events(Protocol):
    async def emit(self, workload: str, reason: str, message: str,
                   warning: bool = False) -> None: ...


class SelfService:
    def __init__(self, api: client.ApiClient, events: Events, stops: StopBook,
                 catalog: kinds.Catalog = kinds.DEFAULT) -> None:
        self.restorer = Restorer(api, stops, catalog=catalog)
        self.events = events
        apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
        self.patch = {"Deployment": apps.patch_namespaced_deployment,
                      "StatefulSet": apps.patch_namespaced_stateful_set,
                      "Job": batch.patch_namespaced_job}

    async def answer(self, decided: Iterable[tuple[RestoreAsk, str]], writes: bool,
                     fenced: Callable[[], Awaitable[None]]
                     ) -> list[tuple[RestoreAsk, RestoreResult, str]]:
        """(request, result, message) for each request."""
        out = []
        for ask, why in decided:
            if not writes:
                result, message = RestoreResult.SKIPPED, why or f"would restore {ask.key}"
            else:
                await fenced()
                result, message = await self._answer(ask, why)
            log.log(logging.DEBUG if result == RestoreResult.SKIPPED else logging.INFO,
                    "restore workload=%s team=%s gpus=%d result=%s msg=%r", ask.key, ask.team,
                    ask.gpus, result, message, extra={"team": ask.team, "pod": ask.key})
            out.append((ask, result, message))
        return out

    async def _answer(self, ask: RestoreAsk, why: str) -> tuple[RestoreResult, str]:
        # A JSON patch that removes the request only while it still says "true": the
        # controllers' own status writes in between do not stop it, a withdrawn request does.
        where = "/metadata/annotations/" + RESTORE.replace("~", "~0").replace("/", "~1")
        try:
            with kube_errors():
                await self.patch[ask.kind](ask.name, ask.namespace, [
                    {"op": "test", "path": where, "value": "true"},
                    {"op": "remove", "path": where}], _request_timeout=CALL_TIMEOUT)
        except KubeRefused as e:  # withdrawn or gone since the LIST: the next cycle looks again
            return RestoreResult.STALE, f"{ask.key} changed since it was read (HTTP {e.status})"
        if why:
            await self.events.emit(ask.key, REFUSED, why, warning=True)
            return RestoreResult.REFUSED, why
        try:
            with kube_errors():
                done = await self.restorer.restore(ask.namespace, ask.kind, ask.name)
        except RestoreRefused as e:
            await self.events.emit(ask.key, REFUSED, str(e), warning=True)
            return RestoreResult.REFUSED, str(e)
        except AdapterError as e:
            failed = f"HTTP {e.status} {e.reason}" if isinstance(e, KubeRefused) else str(e)
            message = f"{ask.key} not restored: {failed}; set {RESTORE}=true again to retry"
            await self.events.emit(ask.key, REFUSED, message, warning=True)
            return RestoreResult.ERROR, message
        message = f"{done} at its owner's request ({RESTORE}=true)"
        await self.events.emit(ask.key, RESTORED, message)
        return RestoreResult.RESTORED, message
