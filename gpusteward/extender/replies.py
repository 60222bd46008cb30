"""Answer filter and prioritize from the precomputed fragments: lookups and byte joins only."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from gpusteward.core.cards import CardPatternError
from gpusteward.core.kubewire import QuantityError
from gpusteward.core.scoring import Demand
from gpusteward.extender import wire
from gpusteward.extender.scorebook import DemandTable, Fragments
from gpusteward.extender.view import PlacementView

NOT_CACHED = "node not in gpusteward's cache yet; retry"


class Outcome(msgspec.Struct):
    body: bytes
    unknown_nodes: int = 0


def demand_or_400(view: PlacementView, args: wire.ExtenderArgs) -> Demand:
    assert args.Pod is not None
    try:
        return view.demand_of(args.Pod)
    except (CardPatternError, QuantityError) as e:
        raise wire.BadRequest(f"Pod: {e}") from e


def _by_name(view: PlacementView, table: DemandTable,
             args: wire.ExtenderArgs) -> Iterator[tuple[str, Fragments | None, msgspec.Raw | None]]:
    """(name, fragments or None when unknown, raw node in full-node mode)."""
    if args.NodeNames is not None:
        for name in args.NodeNames:
            yield name, table.by_node.get(name), None
        return
    assert args.Nodes is not None and args.Nodes.items is not None
    for raw in args.Nodes.items:
        node = wire.decode_node(raw)
        name = node.metadata.name
        frags = table.by_node.get(name)
        if frags is None and name:
            frags = view.book.fragments_for_unlisted(view.state_from_request(node), table.demand)
        yield name, frags, raw


def filter_reply(view: PlacementView, args: wire.ExtenderArgs) -> Outcome:
    table = view.book.table(demand_or_400(view, args))
    passed: list[bytes] = []
    failed: list[tuple[str, bytes]] = []
    unresolvable: list[tuple[str, bytes]] = []
    unknown = 0
    for name, frags, raw in _by_name(view, table, args):
        if frags is None:
            unknown += 1
            failed.append((name, wire.encode_str(name) + b":" + wire.encode_str(NOT_CACHED)))
        elif frags.failure is None:
            passed.append(frags.quoted if raw is None else bytes(raw))
        elif frags.resolvable:
            failed.append((name, frags.failure))
        else:
            unresolvable.append((name, frags.failure))
    full = args.NodeNames is None
    body = wire.filter_result(
        node_names=None if full else passed,
        nodes=passed if full else None,
        failed=failed,
        unresolvable=unresolvable,
    )
    return Outcome(body, unknown)


def prioritize_reply(view: PlacementView, args: wire.ExtenderArgs) -> Outcome:
    table = view.book.table(demand_or_400(view, args))
    parts: list[bytes] = []
    unknown = 0
    for name, frags, _ in _by_name(view, table, args):
        if frags is None:
            unknown += 1
            parts.append(wire.host_priority(name, 0))
        else:
            parts.append(frags.priority)
    return Outcome(wire.priority_list(parts), unknown)
