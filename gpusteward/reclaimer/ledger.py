"""The reclaimer's ledger: the last hour's reclaims, kept in a ConfigMap so the per-hour limits
outlive the process that counted them.

Without it a restarted or failed-over reclaimer starts from an empty count, and one that crash
loops could reclaim ``maxPerCycle`` pods on every start. The ConfigMap sits beside the Lease
(``<lease name>-reclaims`` in the Lease's namespace); only the Lease holder writes it, and each
write carries the resourceVersion of the last read or write: if anyone else wrote in between the
write fails with ``LedgerConflict`` (HTTP 409) instead of overwriting what they recorded.
"""

from __future__ import annotations

import logging

import msgspec
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpusteward.adapters.errors import KubeError
from gpusteward.core.reclaim.model import PastAction

log = logging.getLogger("gpusteward.reclaimer.ledger")

KEY = "reclaims"
CALL_TIMEOUT = 30.0

__all__ = ["ConfigMapLedger", "LedgerConflict", "LedgerError"]


class LedgerError(KubeError):
    """The ledger ConfigMap could not be read or written."""


class LedgerConflict(LedgerError):
    """Someone wrote the ledger since this replica last read it: re-read, re-decide."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(list[PastAction]).decode


class ConfigMapLedger:
    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self.version: str | None = None  # resourceVersion last read or written; None: absent

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    async def load(self) -> list[PastAction]:
        """The recorded reclaims; none when the ConfigMap does not exist yet."""
        try:
            cm = await self.core.read_namespaced_config_map(
                self.name, self.namespace, _request_timeout=CALL_TIMEOUT)
        except ApiException as e:
            if e.status == 404:
                self.version = None
                return []
            raise LedgerError(f"reading {self.where}: HTTP {e.status} {e.reason}", e.status) from e
        self.version = cm.metadata.resource_version
        try:
            return _decode((cm.data or {}).get(KEY) or "[]")
        except msgspec.DecodeError as e:
            # A damaged record must not read as "nothing reclaimed lately".
            raise LedgerError(f"{self.where} key {KEY!r} is not a list of reclaims: {e}") from e

    async def save(self, actions: list[PastAction]) -> None:
        """Replace the record, provided nobody wrote it since this replica's last load or save."""
        data = {KEY: _encode(actions).decode()}
        if self.version is None:
            await self._create(data)
            return
        try:
            cm = await self.core.patch_namespaced_config_map(
                self.name, self.namespace,
                {"metadata": {"resourceVersion": self.version}, "data": data},
                _request_timeout=CALL_TIMEOUT)
        except ApiException as e:
            raise _error(e, f"writing {self.where}") from e
        self.version = cm.metadata.resource_version

    async def _create(self, data: dict[str, str]) -> None:
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace, labels={
                "app.kubernetes.io/name": "gpusteward",
                "app.kubernetes.io/component": "reclaimer"}),
            data=data)
        try:
            cm = await self.core.create_namespaced_config_map(self.namespace, body,
                                                              _request_timeout=CALL_TIMEOUT)
        except ApiException as e:
            raise _error(e, f"creating {self.where}") from e
        self.version = cm.metadata.resource_version
        log.info("created %s for the per-hour reclaim limits", self.where)


def _error(e: ApiException, what: str) -> LedgerError:
    """409 (changed or created meanwhile) and 404 (deleted meanwhile) both mean: read again."""
    if e.status in (404, 409):
        return LedgerConflict(f"{what}: changed by someone else (HTTP {e.status})", e.status)
    return LedgerError(f"{what}: HTTP {e.status} {e.reason}", e.status)
