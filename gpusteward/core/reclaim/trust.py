"""What a restore may rely on: gpusteward's own stop record (``model.StopEntry``), never the
object's annotations alone.

Anyone who can edit a Deployment can write ``replicas-before-reclaim: 100000`` and a reason to
match, or give a Job that a queue controller suspended a reclaim-reason of its own; the record
lies in a ConfigMap in gpusteward's namespace, which they cannot write. The annotations stay,
as what the owner sees, and where they say something else than the record restore refuses
and names both. Pure: each check returns why not ("" when restore may go ahead).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpusteward.core.reclaim.model import RECLAIM_REASON, REPLICAS_BEFORE, StopEntry
from gpusteward.core.reclaim.selfservice import plain_count

_SCALED = re.compile(r"scaled from ([0-9]{1,9}) to 0")  # actor.scaled_reason


def unvouched(entry: StopEntry | None, uid: str, what: str, where: str) -> str:
    """Why the record does not vouch for this object (``uid``: the one read now); ``where``
    names the record."""
    if entry is None:
        return (f"{what} is not in gpusteward's stop record ({where}): gpusteward did not stop "
                "it, or stopped it before it kept that record; not restored")
    if entry.uid != uid:
        return (f"{what} is uid {uid or '?'}, but gpusteward stopped uid {entry.uid} "
                "(deleted and created again since): not restored")
    return ""


def replicas_back(entry: StopEntry, annotations: Mapping[str, str],
                  what: str) -> tuple[int, str]:
    """(the count to scale back to: the recorded one, why not). An annotation that claims
    another count, in either place the actor writes one, is a disagreement, not a correction."""
    recorded = entry.replicas
    if not recorded:
        return 0, (f"{what}: gpusteward's stop record holds no replica count for it (stopped "
                   f"by {entry.how}): not restored")
    claimed = annotations.get(REPLICAS_BEFORE)
    if claimed is not None and plain_count(claimed) != recorded:
        return 0, (f"{what}: {REPLICAS_BEFORE}={claimed!r} disagrees with gpusteward's stop "
                   f"record ({recorded} replicas): not restored")
    reason = annotations.get(RECLAIM_REASON, "")
    said = _SCALED.search(reason)
    if said is not None and int(said.group(1)) != recorded:
        return 0, (f"{what}: {RECLAIM_REASON}={reason!r} disagrees with gpusteward's stop "
                   f"record ({recorded} replicas): not restored")
    return recorded, ""
