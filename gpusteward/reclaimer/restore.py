"""`gpusteward reclaimer restore`: undo a scale-down or a Job suspension that gpusteward made,
and nothing else.

The annotations are editable by anyone who can edit the object, so none is trusted blindly: the
object must carry gpusteward's reclaim-reason annotation and still be at zero replicas (or
suspended); the replica count must be a plain ASCII integer no larger than the count recorded
with the reclaim (in the reason: "idle: scaled from 2 to 0"). Otherwise ``RestoreRefused``.
Every patch carries the resourceVersion read, so a concurrent change makes it fail (409).
"""

from __future__ import annotations

import re

from kubernetes_asyncio import client

from gpusteward.core.reclaim.model import RECLAIM_REASON, REPLICAS_BEFORE
from gpusteward.reclaimer.actor import CALL_TIMEOUT, workload_api

_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only: not "٣", "+3", " 3" or "3\n"
_RECORDED = re.compile(r"scaled from ([0-9]{1,9}) to 0")


class RestoreRefused(ValueError):
    """The object is not one gpusteward stopped, or its record is not believable."""


def plain_count(text: str | None) -> int | None:
    return int(text) if text is not None and _COUNT.fullmatch(text) else None


class Restorer:
    def __init__(self, api: client.ApiClient) -> None:
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)

    async def restore(self, namespace: str, kind: str, name: str) -> str:
        """Returns what was done; raises RestoreRefused when nothing may be done."""
        what = f"{kind} {namespace}/{name}"
        if kind == "Job":
            return await self._resume(namespace, name, what)
        read, patch = workload_api(self.apps, kind)
        obj = await read(name, namespace, _request_timeout=CALL_TIMEOUT)
        ann = obj.metadata.annotations or {}
        reason = _reason(ann, what)
        if obj.spec.replicas != 0:
            raise RestoreRefused(f"{what} runs {obj.spec.replicas} replicas, not 0: not "
                                 f"restored (someone scaled it since gpusteward did)")
        before = plain_count(ann.get(REPLICAS_BEFORE))
        if before is None:
            raise RestoreRefused(f"{what}: {REPLICAS_BEFORE}={ann.get(REPLICAS_BEFORE)!r} is not "
                                 f"a plain integer: not restored")
        recorded = _RECORDED.search(reason)
        if recorded is None or before > int(recorded.group(1)) or before == 0:
            raise RestoreRefused(
                f"{what}: {REPLICAS_BEFORE}={before} does not match the count recorded with the "
                f"reclaim ({RECLAIM_REASON}={reason!r}): not restored")
        await patch(name, namespace, {
            "metadata": {"resourceVersion": obj.metadata.resource_version,
                         "annotations": {REPLICAS_BEFORE: None, RECLAIM_REASON: None}},
            "spec": {"replicas": before}}, _request_timeout=CALL_TIMEOUT)
        return f"{what} scaled back to {before}"

    async def _resume(self, namespace: str, name: str, what: str) -> str:
        job = await self.batch.read_namespaced_job(name, namespace, _request_timeout=CALL_TIMEOUT)
        _reason(job.metadata.annotations or {}, what)
        if not job.spec.suspend:
            raise RestoreRefused(f"{what} is not suspended: nothing to resume")
        await self.batch.patch_namespaced_job(name, namespace, {
            "metadata": {"resourceVersion": job.metadata.resource_version,
                         "annotations": {RECLAIM_REASON: None}},
            "spec": {"suspend": False}}, _request_timeout=CALL_TIMEOUT)
        return f"{what} resumed"


def _reason(annotations: dict[str, str], what: str) -> str:
    reason = annotations.get(RECLAIM_REASON)
    if reason is None:
        raise RestoreRefused(f"{what} was not stopped by gpusteward (no {RECLAIM_REASON} "
                             f"annotation): not restored")
    return reason
