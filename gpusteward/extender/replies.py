"""Answer filter and prioritize from the precomputed fragments: lookups and byte joins only.

Pure with respect to the view: nothing here changes it. What the request path does change (the
pod's expected placement) the handler records (`app.respond`)."""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter

import msgspec

from gpusteward.core.cards import CardPatternError
from gpusteward.core.kubewire import QuantityError
from gpusteward.core.scoring import Demand
from gpusteward.extender import wire
from gpusteward.extender.scorebook import DemandTable, FilterOutcome, Fragments
from gpusteward.extender.view import PlacementView

NOT_CACHED = "node not in gpusteward's cache yet; retry"


class Reply(msgspec.Struct):
    body: bytes
    unknown_nodes: int = 0  # nodes not in the cache (answered "retry" or scored 0)
    # prioritize: the top-ranked node, where the scheduler most likely binds the pod
    best_node: str | None = None


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
        name = wire.node_name(raw)
        frags = table.by_node.get(name)
        if frags is None and name:
            try:
                state = view.state_from_request(wire.decode_node(raw))
            except QuantityError as e:
                raise wire.BadRequest(f"node {name}: {e}") from e
            frags = view.book.fragments_for_unlisted(state, table.demand)
        yield name, frags, raw


def filter_reply(view: PlacementView, args: wire.ExtenderArgs) -> Reply:
    table = view.book.table(demand_or_400(view, args))
    lists: tuple[list[bytes], list[bytes], list[bytes]] = ([], [], [])  # by FilterOutcome
    passed, failed, unresolvable = lists
    unknown = 0
    names_only = args.NodeNames is not None
    if args.NodeNames is not None:  # the hot path: lookups and appends
        get = table.by_node.get
        for name in args.NodeNames:
            f = get(name)
            if f is None:
                unknown += 1
                failed.append(_not_cached(name))
            else:
                lists[f.outcome].append(f.entry)
    else:
        for name, frags, raw in _by_name(view, table, args):
            if frags is None:
                unknown += 1
                failed.append(_not_cached(name))
            elif frags.outcome == FilterOutcome.PASSED:
                assert raw is not None  # full-node mode: every node arrives whole
                passed.append(bytes(raw))
            else:
                lists[frags.outcome].append(frags.failure)
    body = wire.filter_result(node_names=passed if names_only else None,
                              nodes=None if names_only else passed, failed=failed,
                              unresolvable=unresolvable)
    return Reply(body, unknown)


def _not_cached(name: str) -> bytes:
    return wire.encode_str(name) + b":" + wire.encode_str(NOT_CACHED)


def prioritize_reply(view: PlacementView, args: wire.ExtenderArgs) -> Reply:
    table = view.book.table(demand_or_400(view, args))
    ranked: list[Fragments | None]
    if args.NodeNames is not None:  # the hot path: C-level lookups and one join
        names = args.NodeNames
        ranked = list(map(table.by_node.get, names))
    else:
        names, ranked = [], []
        for name, frags, _ in _by_name(view, table, args):
            names.append(name)
            ranked.append(frags)
    unknown = ranked.count(None)
    if unknown:
        pairs = zip(names, ranked, strict=True)
        body = wire.priority_list([f.priority_json if f else wire.host_priority(n, 0)
                                   for n, f in pairs])
    else:
        body = wire.priority_list(map(_PRIORITY_JSON, ranked))
    best = max(filter(None, ranked), key=_SCORE, default=None)
    return Reply(body, unknown, None if best is None else best.name)


_PRIORITY_JSON = attrgetter("priority_json")
_SCORE = attrgetter("score")
