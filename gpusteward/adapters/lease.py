"""Leader election on a coordination.k8s.io/v1 Lease, and the fence every reclaimer write passes.

client-go's elector (and kubernetes_asyncio's port of it) says of itself that it "does not
guarantee that only one client is acting as a leader (a.k.a. fencing)": a leader paused past its
Lease keeps acting until its next renewal notices. Here the holder instead asks the API server
before every write (``check``): the Lease must name this replica and its last renewal plus the
duration, less a margin, must still be ahead. Renewals run on their own task and give up after
``renew_deadline`` (half the duration), so a replica that cannot renew stops acting while the
Lease it holds is still valid; every Lease call has a bounded timeout.

Besides that round trip, ``may_write`` is a local deadline checked immediately before every
write request leaves (adapters.kube.GatedClient): none starts once ``renew_deadline - margin``
has passed since the start of the last successful renewal, so a replica resumed from a pause
(GC, SIGSTOP, a throttled node) writes nothing on the strength of a check made before it. What
was already in flight is fenced by the API server itself: every write carries the
resourceVersion it was derived from (reclaimer.actor).

Expiry of another holder's Lease is judged like client-go does: by the local time since its
record last changed, never by comparing clocks across machines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeConflict, KubeNotFound, KubeRefused, LeaseLost
from gpusteward.adapters.kube import kube_errors

log = logging.getLogger("gpusteward.reclaimer.lease")

FAILURES = (KubeRefused, aiohttp.ClientError, TimeoutError)


class LeaseGuard:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str,
                 duration: int, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration = duration
        self.renew_deadline = duration / 2
        self.retry_period = max(0.5, duration / 6)
        self.margin = duration / 4  # a check passes only this long before the Lease ends
        self.call_timeout = max(1.0, duration / 5)
        self.clock, self.monotonic = clock, monotonic
        self.leading = False
        self._renewed = float("-inf")  # monotonic time of our last successful acquire/renew
        self._seen: tuple[str | None, object] = (None, None)  # another holder's record...
        self._seen_at = 0.0  # ...and when (monotonic) it last changed
        self._own_lease = f"/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    async def acquire(self) -> None:
        """Until this replica holds the Lease."""
        while True:
            try:
                if await self._try_acquire_or_renew():
                    self.leading = True
                    return
            except FAILURES as e:
                log.warning("%s: acquiring failed: %s", self.where, _describe(e))
            await asyncio.sleep(self.retry_period)

    async def hold(self) -> str:
        """Renew every retry period; return why leadership ended (another holder, or no
        successful renewal for ``renew_deadline``). ``check`` fails from then on."""
        while True:
            await asyncio.sleep(self.retry_period)
            try:
                if not await self._try_acquire_or_renew():
                    return self._lose(f"{self.where} is now held by {self._seen[0]}")
            except FAILURES as e:
                log.warning("%s: renewal failed: %s", self.where, _describe(e))
            if self.monotonic() - self._renewed > self.renew_deadline:
                return self._lose(f"{self.where} not renewed for {self.renew_deadline:g}s")

    @property
    def write_deadline(self) -> float:
        """Seconds after a renewal started within which a write may start."""
        return self.renew_deadline - self.margin

    def may_write(self, url: str = "") -> None:
        """The local deadline (no API call): raise LeaseLost unless this replica leads and its
        last successful renewal started less than ``write_deadline`` ago. The Lease's own
        renewals pass (they are what keeps it)."""
        if self._own_lease in url:
            return
        if not self.leading:
            raise LeaseLost("not leading")
        since = self.monotonic() - self._renewed
        if since > self.write_deadline:
            raise LeaseLost(f"last renewal {since:.1f}s ago, past the {self.write_deadline:g}s "
                            f"write deadline")

    def _lose(self, why: str) -> str:
        self.leading = False
        return why

    async def check(self) -> None:
        """Return only while this replica may write to the cluster; else raise LeaseLost."""
        if not self.leading:
            raise LeaseLost("not leading")
        if self.monotonic() - self._renewed > self.renew_deadline:
            raise LeaseLost(f"no successful renewal for {self.renew_deadline:g}s")
        try:
            lease = await self._read()
        except KubeNotFound as e:
            raise LeaseLost(f"{self.where} is gone") from e
        except FAILURES as e:
            raise LeaseLost(f"{self.where} unreadable: {_describe(e)}") from e
        spec = lease.spec
        if spec.holder_identity != self.identity:
            raise LeaseLost(f"{self.where} is held by {spec.holder_identity or 'nobody'}")
        left = _at(spec.renew_time) + self.duration - self.margin - self.clock()
        if left <= 0:
            raise LeaseLost(f"{self.where} ends within its {self.margin:g}s margin")

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards. An update carries
        the resourceVersion read, so of two candidates only one can win (409 for the other)."""
        started = self.monotonic()
        try:
            lease = await self._read()
        except KubeNotFound:
            return await self._create(started)
        spec = lease.spec
        holder = spec.holder_identity
        if holder and holder != self.identity and not self._expired(holder, spec):
            return False
        now = self.clock()
        taking = holder != self.identity
        body = self._record(now if taking or spec.acquire_time is None
                            else spec.acquire_time.timestamp(), now,
                            (spec.lease_transitions or 0) + taking)
        body["metadata"]["resourceVersion"] = lease.metadata.resource_version
        try:
            await self._replace(body)
        except KubeConflict:
            return False  # another candidate wrote first
        self._renewed = started
        return True

    async def _read(self) -> client.V1Lease:
        with kube_errors():
            return await self.coordination.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.call_timeout)

    async def _replace(self, body: Any) -> None:
        with kube_errors():
            await self.coordination.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self.call_timeout)

    def _record(self, acquired: float, renewed: float, transitions: int,
                holder: str | None = None, duration: int | None = None) -> Any:
        """The Lease as a plain body (the client sends dicts as they are; its models would
        serialize a MicroTime without its fraction when that is zero, which the server rejects)."""
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity if holder is None else holder,
                         "acquireTime": _micro_time(acquired),
                         "renewTime": _micro_time(renewed),
                         "leaseDurationSeconds": duration or self.duration,
                         "leaseTransitions": transitions}}

    def _expired(self, holder: str, spec: client.V1LeaseSpec) -> bool:
        record = (holder, spec.renew_time)
        if record != self._seen:
            self._seen, self._seen_at = record, self.monotonic()
        duration = spec.lease_duration_seconds or self.duration
        return self.monotonic() - self._seen_at > duration

    async def _create(self, started: float) -> bool:
        now = self.clock()
        body = self._record(now, now, 0)
        try:
            with kube_errors():
                await self.coordination.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self.call_timeout)
        except KubeConflict:
            return False
        self._renewed = started
        return True

    async def release(self) -> None:
        """On shutdown: hand the Lease back so a standby need not wait for it to expire."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self._read()
            spec = lease.spec
            if spec.holder_identity == self.identity:
                body = self._record(self.clock(), self.clock(), spec.lease_transitions or 0,
                                    holder="", duration=1)
                body["metadata"]["resourceVersion"] = lease.metadata.resource_version
                await self._replace(body)
        except FAILURES as e:
            log.warning("%s not released (a standby waits for it to expire): %s", self.where,
                        _describe(e))


def _micro_time(t: float) -> str:
    """A MicroTime as the API server parses it: always six fraction digits (Python's isoformat
    drops them when they are all zero)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _at(t: datetime | None) -> float:
    return t.timestamp() if t is not None else float("-inf")


def _describe(e: BaseException) -> str:
    if isinstance(e, KubeRefused):
        return f"HTTP {e.status} {e.reason}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
