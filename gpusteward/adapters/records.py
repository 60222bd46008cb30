"""Records the reclaimer keeps beside its Lease, one ConfigMap key each: snooze sightings
(``<lease>-snoozes``) and notifications (``<lease>-notifications``). Like the per-hour ledger,
only the Lease holder writes, and every write carries the resourceVersion of the last read or
write, so a write after someone else's fails with ``RecordsConflict`` instead of undoing it.

Their Events (a Deployment's snooze, a Job's restore) are adapters/events' ``ObjectEvents``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeConflict, KubeError, KubeNotFound, KubeRefused
from gpusteward.adapters.kube import CALL_TIMEOUT, kube_errors

T = TypeVar("T")


class RecordsError(KubeError):
    """The ConfigMap could not be read or written, or holds something unreadable."""


class RecordsConflict(RecordsError):
    """Written by someone else since this replica's last read: read again."""


class ConfigMapRecords(Generic[T]):
    """A list of ``item`` under one key of one ConfigMap (``key``; ``holds`` names its contents
    in errors). Subclasses raise their own ``error``/``conflict`` (the per-hour ledger)."""

    error: type[RecordsError] = RecordsError
    conflict: type[RecordsError] = RecordsConflict

    def __init__(self, api: client.ApiClient, namespace: str, name: str, item: type[T],
                 key: str = "records", holds: str = "readable") -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.name = namespace, name
        self.key, self.holds = key, holds
        self.version: str | None = None  # resourceVersion of the last read or write
        self._decode = msgspec.json.Decoder(list[item]).decode  # type: ignore[valid-type]

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    async def load(self) -> list[T]:
        try:
            with kube_errors():
                cm = await self.core.read_namespaced_config_map(self.name, self.namespace,
                                                                _request_timeout=CALL_TIMEOUT)
        except KubeNotFound:
            self.version = None
            return []
        except KubeRefused as e:
            raise self.error(f"reading {self.where}: HTTP {e.status} {e.reason}",
                             e.status) from e
        self.version = cm.metadata.resource_version
        try:
            return list(self._decode((cm.data or {}).get(self.key) or "[]"))
        except msgspec.DecodeError as e:
            # A damaged record must not read as "nothing recorded".
            raise self.error(f"{self.where} key {self.key!r} is not {self.holds}: {e}") from e

    async def save(self, items: list[T]) -> None:
        """Replace the record, provided nobody wrote it since this replica's last load or save."""
        data = {self.key: msgspec.json.encode(items).decode()}
        try:
            with kube_errors():
                cm = await self._write(data)
        except (KubeConflict, KubeNotFound) as e:
            # 409 (changed or created meanwhile) and 404 (deleted meanwhile): read again.
            raise self.conflict(f"{self.where} changed by someone else (HTTP {e.status})",
                                e.status) from e
        except KubeRefused as e:
            raise self.error(f"writing {self.where}: HTTP {e.status} {e.reason}",
                             e.status) from e
        self.version = cm.metadata.resource_version

    async def _write(self, data: dict[str, str]) -> Any:
        """Create the ConfigMap (none was read), else patch it on the version last read."""
        if self.version is None:
            body: Any = {"metadata": {"name": self.name, "labels": {
                "app.kubernetes.io/name": "gpusteward",
                "app.kubernetes.io/component": "reclaimer"}}, "data": data}
            return await self.core.create_namespaced_config_map(self.namespace, body,
                                                                _request_timeout=CALL_TIMEOUT)
        return await self.core.patch_namespaced_config_map(
            self.name, self.namespace,
            {"metadata": {"resourceVersion": self.version}, "data": data},
            _request_timeout=CALL_TIMEOUT)
