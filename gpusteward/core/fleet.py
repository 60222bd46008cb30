"""An in-memory index of GPU nodes and GPU pods, fed by watch events.

Pure bookkeeping (no I/O): the kube adapter applies events, apps read it. Every change reports the
node names it touched so that derived state (scores, reclaim views) is refreshed per node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import msgspec

from gpusteward.core.model import Node, Pod, reservation_of

Listener = Callable[[set[str]], None]


class FleetWriter(Protocol):
    """What the node and pod watchers write to: a FleetStore, or a DraFleet in front of one
    (core/drafleet.py), which joins DRA devices in before they reach the store."""

    def upsert_node(self, node: Node) -> None: ...
    def delete_node(self, name: str) -> None: ...
    def upsert_pod(self, pod: Pod) -> None: ...
    def delete_pod(self, uid: str) -> None: ...
    def replace_all(self, nodes: Iterable[Node] | None, pods: Iterable[Pod] | None) -> None: ...
    def note_gpuless(self, uid: str, name: str, node: str | None) -> None: ...
    def replace_gpuless(self, pods: Iterable[tuple[str, str, str]]) -> None: ...


class FleetStore:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, Pod] = {}
        self._by_node: dict[str, dict[str, Pod]] = {}
        # Pending pods holding a reservation, by the node it is on (the GPUs a queue reclaim
        # freed for them there: extender/view.py keeps them from other pods).
        self._reserving: dict[str, dict[str, Pod]] = {}
        self._listeners: list[Listener] = []
        # Bound pods that hold no GPU, uid -> (name, node): an exporter whose series name its
        # pod instead of its node is placed by it (core.attribution.node_of).
        self._gpuless: dict[str, tuple[str, str]] = {}

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _changed(self, names: set[str]) -> None:
        names.discard("")
        if not names:
            return
        for listener in self._listeners:
            listener(names)

    def pods_on(self, node: str) -> Iterable[Pod]:
        return self._by_node.get(node, {}).values()

    def reserving(self, node: str) -> Iterable[Pod]:
        """Pending pods whose reservation (as written, maybe over) is on this node."""
        return self._reserving.get(node, {}).values()

    @property
    def any_reserving(self) -> bool:
        return bool(self._reserving)

    def upsert_node(self, node: Node) -> None:
        if self.nodes.get(node.name) != node:
            self.nodes[node.name] = node
            self._changed({node.name})

    def delete_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self._changed({name})

    def upsert_pod(self, pod: Pod) -> None:
        old = self.pods.get(pod.uid)
        if old is not None and old.node == pod.node and old.bound_at is not None:
            # Keep the precise time the binding was first seen (burst correction).
            pod = msgspec.structs.replace(pod, bound_at=old.bound_at)
        if old == pod:
            return
        self._unindex(old)
        self.pods[pod.uid] = pod
        self._index(pod)
        if old is None or _placement(old) != _placement(pod):
            self._changed({n for p in (pod, old) if p is not None for n in _nodes(p)})

    def delete_pod(self, uid: str) -> None:
        old = self.pods.pop(uid, None)
        if old is not None:
            self._unindex(old)
            self._changed(set(_nodes(old)))

    def replace_all(self, nodes: Iterable[Node] | None, pods: Iterable[Pod] | None) -> None:
        """After a (re-)list: the listed objects are the whole truth for their kind."""
        touched: set[str] = set()
        if nodes is not None:
            fresh = {n.name: n for n in nodes}
            touched |= {k for k in self.nodes.keys() | fresh.keys()
                        if self.nodes.get(k) != fresh.get(k)}
            self.nodes = fresh
        if pods is not None:
            touched |= {n for p in self.pods.values() for n in _nodes(p)}
            self.pods = {p.uid: p for p in pods}
            self._by_node, self._reserving = {}, {}
            for p in self.pods.values():
                self._index(p)
            touched |= {n for p in self.pods.values() for n in _nodes(p)}
        self._changed(touched)

    def note_gpuless(self, uid: str, name: str, node: str | None) -> None:
        """A pod that holds no GPU (or no longer exists, ``node`` None)."""
        if node:
            self._gpuless[uid] = (name, node)
        else:
            self._gpuless.pop(uid, None)

    def replace_gpuless(self, pods: Iterable[tuple[str, str, str]]) -> None:
        """After a re-list: (uid, name, node) of every bound pod that holds no GPU."""
        self._gpuless = {uid: (name, node) for uid, name, node in pods}

    def pod_nodes(self) -> dict[str, str]:
        """Pod name -> node, for the pods that hold no GPU."""
        return dict(self._gpuless.values())

    def _index(self, pod: Pod) -> None:
        if pod.node:
            self._by_node.setdefault(pod.node, {})[pod.uid] = pod
        elif (reserved := _reserved_at(pod)) is not None:
            self._reserving.setdefault(reserved, {})[pod.uid] = pod

    def _unindex(self, pod: Pod | None) -> None:
        if pod is not None:
            _drop(self._by_node, pod.node, pod.uid)
            _drop(self._reserving, _reserved_at(pod), pod.uid)


def _drop(index: dict[str, dict[str, Pod]], node: str | None, uid: str) -> None:
    on_node = index.get(node) if node else None
    if node and on_node is not None:
        on_node.pop(uid, None)
        if not on_node:
            del index[node]


def _reserved_at(pod: Pod) -> str | None:
    """The node of a pending pod's reservation."""
    r = reservation_of(pod) if pod.node is None else None
    return r.node if r is not None else None


def _nodes(pod: Pod) -> tuple[str, ...]:
    """The nodes whose views a pod counts in: where it is bound, or reserved."""
    node = pod.node or _reserved_at(pod)
    return (node,) if node else ()


def _placement(pod: Pod) -> tuple[object, ...]:
    """What node-level views derive from a pod; a status or metadata update changes none of it,
    and in a burst those updates outnumber bindings. A pending pod counts only through its
    reservation, and its nomination (which keeps the reservation or ends it)."""
    reserved = _reserved_at(pod)
    return (pod.node, pod.gpus, pod.deleting, pod.phase in ("Succeeded", "Failed"), pod.bound_at,
            reserved, pod.nominated_node if reserved else None)
