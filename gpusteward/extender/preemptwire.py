"""The preempt verb's wire format (`k8s.io/kube-scheduler/extender/v1`, no JSON tags, so Go
field names): ExtenderPreemptionArgs {Pod, NodeNameToVictims, NodeNameToMetaVictims} in, one of
the two maps set (full pods without nodeCacheCapable, UIDs with it); ExtenderPreemptionResult
{NodeNameToMetaVictims} out. Decoded as extender/wire.py decodes filter and prioritize."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gpusteward.core.kubewire import WirePod
from gpusteward.extender.wire import BadRequest


# Checked while decoding (a candidate always has victims, a victim its UID), so that a request
# with thousands of candidates is validated at C speed.
class MetaPod(msgspec.Struct, gc=False):
    UID: Annotated[str, msgspec.Meta(min_length=1)]


class MetaVictims(msgspec.Struct, gc=False):
    Pods: Annotated[list[MetaPod], msgspec.Meta(min_length=1)]
    NumPDBViolations: int = 0


class Victims(msgspec.Struct):
    Pods: Annotated[list[WirePod], msgspec.Meta(min_length=1)]
    NumPDBViolations: int = 0


class PreemptionArgs(msgspec.Struct, forbid_unknown_fields=True):
    Pod: WirePod | None = None
    NodeNameToVictims: dict[str, Victims] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None


class PreemptionResult(msgspec.Struct):
    NodeNameToMetaVictims: dict[str, MetaVictims]


_decoder = msgspec.json.Decoder(PreemptionArgs)


def decode_preemption_args(body: bytes) -> PreemptionArgs:
    if not body:
        raise BadRequest("empty body: expected ExtenderPreemptionArgs JSON")
    try:
        args = _decoder.decode(body)
    except msgspec.ValidationError as e:
        hint = (" (keys are PascalCase: Pod, NodeNameToVictims, NodeNameToMetaVictims)"
                if "unknown field" in str(e) else "")
        raise BadRequest(f"invalid ExtenderPreemptionArgs: {e}{hint}") from e
    except msgspec.DecodeError as e:
        raise BadRequest(f"malformed JSON: {e}") from e
    if args.Pod is None:
        raise BadRequest("ExtenderPreemptionArgs has no Pod")
    if args.NodeNameToVictims is None and args.NodeNameToMetaVictims is None:
        raise BadRequest("ExtenderPreemptionArgs has neither NodeNameToVictims nor "
                         "NodeNameToMetaVictims")
    return args
