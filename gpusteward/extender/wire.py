"""The kube-scheduler extender wire format (`k8s.io/kube-scheduler/extender/v1`).

The upstream structs carry no JSON tags, so keys are Go field names in PascalCase and every
member is always present (`null` when unused). Requests are decoded into typed structs holding
only what we read; full Node objects are kept as raw bytes so a filter reply can echo them
unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from gpusteward.core.kubewire import WireNode, WirePod


class RawNodeList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


class ExtenderArgs(msgspec.Struct, forbid_unknown_fields=True):
    Pod: WirePod | None = None
    Nodes: RawNodeList | None = None
    NodeNames: list[str] | None = None


class BadRequest(ValueError):
    """The request cannot be answered; the message says why (sent back with HTTP 400)."""


class _Name(msgspec.Struct):
    name: str = ""


class _NamedObject(msgspec.Struct):
    metadata: _Name = msgspec.field(default_factory=_Name)


_args_decoder = msgspec.json.Decoder(ExtenderArgs)
_node_decoder = msgspec.json.Decoder(WireNode)
_name_decoder = msgspec.json.Decoder(_NamedObject)


# Kubernetes supports clusters of up to 5,000 nodes (kubernetes.io, "Considerations for large
# clusters"); three times that leaves room and keeps what one request may allocate bounded.
MAX_NODES = 15_000
# Upper bound on the JSON values one body may hold, counted by its commas before decoding:
# msgspec builds a whole list before checking its length, and 8 M one-letter names in a
# 32 MiB body took 550 MB and 1.6 s. A 5,000-node full-node request has ~1 M.
MAX_VALUES = 2_000_000


def decode_args(body: bytes, max_nodes: int = MAX_NODES) -> ExtenderArgs:
    if not body:
        raise BadRequest("empty body: expected ExtenderArgs JSON")
    # Each value takes two bytes at least ("1,"): shorter bodies need no scan (the names-mode
    # hot path never pays for it; a 14 MiB full-node body pays ~6 ms).
    if len(body) > 2 * MAX_VALUES and body.count(b",") > MAX_VALUES:
        raise BadRequest(f"more than {MAX_VALUES} JSON values: not a scheduler request")
    try:
        args = _args_decoder.decode(body)
    except msgspec.ValidationError as e:
        hint = " (keys are PascalCase: Pod, Nodes, NodeNames)" if "unknown field" in str(e) else ""
        raise BadRequest(f"invalid ExtenderArgs: {e}{hint}") from e
    except msgspec.DecodeError as e:
        raise BadRequest(f"malformed JSON: {e}") from e
    except RecursionError as e:
        raise BadRequest(f"JSON nested too deeply: {e}") from e
    if args.Pod is None:
        raise BadRequest("ExtenderArgs has no Pod")
    if args.NodeNames is None and (args.Nodes is None or args.Nodes.items is None):
        raise BadRequest("ExtenderArgs has neither NodeNames nor Nodes")
    items = args.Nodes.items if args.Nodes is not None else None
    count = len(args.NodeNames) if args.NodeNames is not None else len(items or ())
    if count > max_nodes:
        raise BadRequest(f"{count} nodes in one request, over the limit of {max_nodes}")
    return args


# Go marshals a Node as kind, apiVersion, metadata{name, ...}: the name sits in the first bytes.
_LEADING_NAME = re.compile(
    rb'\{(?:"kind":"Node",)?(?:"apiVersion":"v1",)?"metadata":\{"name":"([a-z0-9.-]+)"')


def node_name(raw: msgspec.Raw) -> str:
    """Just the name: enough for nodes the watch cache already knows.

    Read from the object's first bytes when it is laid out as Go writes it; otherwise (other
    key order, whitespace, escapes) by a typed decode that skips every other field.
    """
    match = _LEADING_NAME.match(raw)
    if match is not None:
        return match.group(1).decode()
    try:
        return _name_decoder.decode(raw).metadata.name
    except (msgspec.DecodeError, RecursionError) as e:
        raise BadRequest(f"invalid node in Nodes.items: {e}") from e


def decode_node(raw: msgspec.Raw) -> WireNode:
    try:
        return _node_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError) as e:
        raise BadRequest(f"invalid node in Nodes.items: {e}") from e


def encode_str(text: str) -> bytes:
    return msgspec.json.encode(text)


def host_priority(name: str, score: int) -> bytes:
    return b'{"Host":' + encode_str(name) + b',"Score":' + str(score).encode() + b"}"


def priority_list(fragments: Iterable[bytes]) -> bytes:
    return b"[" + b",".join(fragments) + b"]"


def filter_result(
    *,
    node_names: list[bytes] | None,
    nodes: list[bytes] | None,
    failed: list[bytes],
    unresolvable: list[bytes],
    error: str = "",
) -> bytes:
    """ExtenderFilterResult from pre-encoded JSON (quoted names, whole nodes, `"name":"why"`).

    Failure maps keep the request's node order; Go decodes a map whatever its key order.
    """
    nodes_json = b"null"
    if nodes is not None:
        nodes_json = b'{"metadata":{},"items":[' + b",".join(nodes) + b"]}"
    names_json = b"null" if node_names is None else b"[" + b",".join(node_names) + b"]"
    return (
        b'{"Nodes":' + nodes_json
        + b',"NodeNames":' + names_json
        + b',"FailedNodes":{' + b",".join(failed)
        + b'},"FailedAndUnresolvableNodes":{' + b",".join(unresolvable)
        + b'},"Error":' + encode_str(error) + b"}"
    )


def error_result(message: str) -> bytes:
    return filter_result(node_names=None, nodes=None, failed=[], unresolvable=[], error=message)
