"""The reclaimer's ledger: the last hour's reclaims (the longest reclaimCooldown's, where that
is longer), kept in a ConfigMap so the per-hour limits and the cooldowns outlive the process
that counted them.

Without it a restarted or failed-over reclaimer starts from an empty count, and one that crash
loops could reclaim ``maxPerCycle`` pods on every start. The ConfigMap sits beside the Lease
(``<lease name>-reclaims`` in the Lease's namespace); only the Lease holder writes it, and each
write carries the resourceVersion of the last read or write: if anyone else wrote in between the
write fails with ``LedgerConflict`` (HTTP 409) instead of overwriting what they recorded.
"""

from __future__ import annotations

from kubernetes_asyncio import client

from gpusteward.adapters.records import ConfigMapRecords, RecordsConflict, RecordsError
from gpusteward.core.reclaim.model import PastAction

KEY = "reclaims"

__all__ = ["ConfigMapLedger", "LedgerConflict", "LedgerError"]


class LedgerError(RecordsError):
    """The ledger ConfigMap could not be read or written."""


class LedgerConflict(LedgerError, RecordsConflict):
    """Someone wrote the ledger since this replica last read it: re-read, re-decide."""


class ConfigMapLedger(ConfigMapRecords[PastAction]):
    error = LedgerError
    conflict = LedgerConflict

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        super().__init__(api, namespace, name, PastAction, key=KEY, holds="a list of reclaims")
