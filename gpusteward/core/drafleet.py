"""The fleet's Nodes and Pods with their DRA GPUs joined in.

``DraFleet`` sits in front of a FleetStore: the node and pod watchers write through it, the DRA
watchers feed it, and the store holds the joined result. A node's GPUs are its device-plugin
allocatable plus its DRA devices; a pod's are its extended-resource requests plus the devices of
its allocated claims (before allocation, what its claims ask of GPU classes). A request that
the pod's `status.extendedResourceClaimStatus` maps to a claim counts once, as the claim.
A device a NoSchedule or NoExecute taint withholds and no claim holds is the node's
`withheld`: counted in its GPUs, offered to no new pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from gpusteward.core.dra import DEFAULT_DRIVER, DraClaim, DraClass, DraDevice
from gpusteward.core.fleet import FleetStore
from gpusteward.core.health import Fault, device_fault
from gpusteward.core.model import Node, Pod, WithheldDevice
from gpusteward.core.policy import Health
from gpusteward.core.sharing import FULL_GPU


class DraFleet:
    """A FleetStore's writer that adds DRA devices to Nodes and Pods (see the module docstring).

    The node and pod watchers call the FleetStore methods here; ``base`` keeps what they wrote,
    the store what the join makes of it. Pods that hold no GPU after the join stay out of the
    store, as the pod watcher keeps them out.
    """

    def __init__(self, store: FleetStore, driver: str = DEFAULT_DRIVER):
        self.store, self.driver = store, driver
        self.base_nodes: dict[str, Node] = {}
        self.base_pods: dict[str, Pod] = {}
        self.slices: dict[str, tuple[DraDevice, ...]] = {}
        self.claims: dict[str, DraClaim] = {}
        self.classes: dict[str, DraClass] = {}
        self._devices: dict[tuple[str, str], DraDevice] = {}  # (pool, device name)
        self._on_node: dict[str, dict[tuple[str, str], DraDevice]] = {}
        self._of_pod: dict[str, list[DraClaim]] = {}
        self._held: dict[tuple[str, str], int] = {}  # (pool, device) -> claims allocating it

    # -- what the joined objects are
    def node(self, base: Node) -> Node:
        devices = self._on_node.get(base.name, {}).values()
        if not devices:
            return base
        resources = dict(base.resources) if base.resources else (
            {FULL_GPU: base.gpus} if base.gpus else {})
        for d in devices:
            resources[d.resource] = resources.get(d.resource, 0) + 1
        product = base.product or next((d.product for d in devices if d.product), None)
        withheld = tuple(WithheldDevice(d.resource, taint) for d in devices
                         if (taint := d.withheld_by) is not None
                         and not self._held.get((d.pool, d.name)))
        return msgspec.structs.replace(base, product=product, gpus=sum(resources.values()),
                                       resources=resources, withheld=withheld)

    def pod(self, base: Pod) -> Pod:
        claims = self._of_pod.get(base.uid)
        if not claims:
            return base
        resources = {n: c for n, c in (base.resources or ({FULL_GPU: base.gpus} if base.gpus
                                                          else {})).items()
                     if not self._served_by_claim(n, claims)}
        for claim in claims:
            for name, count in self._claim_units(claim):
                resources[name] = resources.get(name, 0) + count
        resources = {n: c for n, c in resources.items() if c}
        return msgspec.structs.replace(base, gpus=sum(resources.values()), resources=resources)

    def claim_names(self) -> dict[str, str]:
        """Pod key -> the name of a claim that was allocated GPUs for it."""
        return {p.key: c.key.split("/", 1)[1] for uid, claims in self._of_pod.items()
                if (p := self.base_pods.get(uid)) is not None for c in claims if c.devices}

    def claims_unseen(self, pod_uid: str, templates: int) -> bool:
        """Fewer claims seen for the pod than it has ResourceClaimTemplates (each makes one
        claim the pod controls; a claim it names directly is linked only once reserved)."""
        return len(self._of_pod.get(pod_uid, ())) < templates

    def devices_of(self, pod_uid: str) -> list[DraDevice]:
        """The known devices allocated to a pod's claims (telemetry joins by their UUIDs)."""
        return [d for c in self._of_pod.get(pod_uid, ()) for _, pool, name in c.devices
                if (d := self._devices.get((pool, name))) is not None]

    def faults(self, health: Health) -> dict[str, Fault]:
        """Pod key -> the fault a taint on one of its allocated devices declares."""
        out = {}
        for uid in self._of_pod:
            pod = self.base_pods.get(uid)
            if pod is None:
                continue
            found = next((f for d in self.devices_of(uid)
                          if (f := device_fault(d, health)) is not None), None)
            if found is not None:
                out[pod.key] = found
        return out

    def _served_by_claim(self, resource: str, claims: list[DraClaim]) -> bool:
        """An extended resource a DeviceClass serves, once the scheduler made its claim."""
        return any(c.extended for c in claims) and any(
            c.extended_resource == resource for c in self.classes.values())

    def _claim_units(self, claim: DraClaim) -> list[tuple[str, int]]:
        if claim.devices:
            out: dict[str, int] = {}
            for _, pool, name in claim.devices:
                d = self._devices.get((pool, name))
                unit = d.resource if d is not None else FULL_GPU
                out[unit] = out.get(unit, 0) + 1
            return list(out.items())
        return [(FULL_GPU, count) for cls, count in claim.asked
                if (c := self.classes.get(cls)) is not None and c.gpu]

    # -- FleetStore's writer interface, used by the node and pod watchers
    def upsert_node(self, node: Node) -> None:
        self.base_nodes[node.name] = node
        self.store.upsert_node(self.node(node))

    def delete_node(self, name: str) -> None:
        self.base_nodes.pop(name, None)
        self.store.delete_node(name)

    def upsert_pod(self, pod: Pod) -> None:
        self.base_pods[pod.uid] = pod
        self._forward_pod(pod.uid)

    def delete_pod(self, uid: str) -> None:
        self.base_pods.pop(uid, None)
        self.store.delete_pod(uid)

    def replace_all(self, nodes: Iterable[Node] | None, pods: Iterable[Pod] | None) -> None:
        joined_nodes = joined_pods = None
        if nodes is not None:
            self.base_nodes = {n.name: n for n in nodes}
            joined_nodes = [self.node(n) for n in self.base_nodes.values()]
        if pods is not None:
            self.base_pods = {p.uid: p for p in pods}
            joined_pods = [j for p in self.base_pods.values() if (j := self.pod(p)).gpus > 0]
        self.store.replace_all(joined_nodes, joined_pods)

    def note_gpuless(self, uid: str, name: str, node: str | None) -> None:
        self.store.note_gpuless(uid, name, node)

    def replace_gpuless(self, pods: Iterable[tuple[str, str, str]]) -> None:
        self.store.replace_gpuless(pods)

    def _forward_pod(self, uid: str) -> None:
        base = self.base_pods.get(uid)
        if base is None:
            return
        joined = self.pod(base)
        if joined.gpus > 0:
            self.store.upsert_pod(joined)
        else:
            self.store.delete_pod(uid)

    # -- the DRA watchers' side: an event updates the indexes in place, a re-list rebuilds them
    def set_slice(self, name: str, devices: tuple[DraDevice, ...] | None) -> None:
        """A slice's devices (None: the slice is gone)."""
        old = self.slices.pop(name, ())
        for d in old:
            self._devices.pop((d.pool, d.name), None)
            self._on_node.get(d.node, {}).pop((d.pool, d.name), None)
        if devices:
            self.slices[name] = devices
            self._add_devices(devices)
        changed = {d.pool for d in (*old, *(devices or ()))}
        self._refresh_nodes({d.node for d in (*old, *(devices or ()))})
        self._refresh_pods({uid for uid, claims in self._of_pod.items() if any(
            pool in changed for c in claims for _, pool, _ in c.devices)})

    def replace_slices(self, slices: Mapping[str, tuple[DraDevice, ...]]) -> None:
        nodes = {d.node for ds in (*self.slices.values(), *slices.values()) for d in ds}
        self.slices = {k: v for k, v in slices.items() if v}
        self._devices, self._on_node = {}, {}
        for devices in self.slices.values():
            self._add_devices(devices)
        self._refresh_nodes(nodes)
        self._refresh_pods(set(self._of_pod))

    def set_class(self, name: str, cls: DraClass | None) -> None:
        if cls is None:
            self.classes.pop(name, None)
        else:
            self.classes[name] = cls
        self._refresh_pods(set(self._of_pod))

    def replace_classes(self, classes: Iterable[DraClass]) -> None:
        self.classes = {c.name: c for c in classes}
        self._refresh_pods(set(self._of_pod))

    def set_claim(self, key: str, claim: DraClaim | None) -> None:
        old = self.claims.pop(key, None)
        self._hold(old, -1)
        self._hold(claim, 1)
        for uid in old.pods if old else ():
            left = [c for c in self._of_pod.get(uid, ()) if c.key != key]
            if left:
                self._of_pod[uid] = left
            else:
                self._of_pod.pop(uid, None)
        if claim is not None:
            self.claims[key] = claim
            for uid in claim.pods:
                self._of_pod.setdefault(uid, []).append(claim)
        self._refresh_pods({*(old.pods if old else ()), *(claim.pods if claim else ())})
        self._refresh_withheld({k for c in (old, claim) if c for k in _keys(c)})

    def replace_claims(self, claims: Iterable[DraClaim]) -> None:
        touched = set(self._of_pod)
        was_held = set(self._held)
        self.claims = {c.key: c for c in claims}
        self._of_pod, self._held = {}, {}
        for claim in self.claims.values():
            self._hold(claim, 1)
            for uid in claim.pods:
                self._of_pod.setdefault(uid, []).append(claim)
        self._refresh_pods(touched | set(self._of_pod))
        self._refresh_withheld(was_held ^ set(self._held))

    def _hold(self, claim: DraClaim | None, by: int) -> None:
        for key in _keys(claim) if claim else ():
            left = self._held.get(key, 0) + by
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)

    def _refresh_withheld(self, keys: set[tuple[str, str]]) -> None:
        """The nodes of tainted devices a claim took or let go: their `withheld` changed."""
        self._refresh_nodes({d.node for k in keys
                             if (d := self._devices.get(k)) is not None and d.withheld_by})

    def _add_devices(self, devices: Iterable[DraDevice]) -> None:
        for d in devices:
            self._devices[(d.pool, d.name)] = d
            self._on_node.setdefault(d.node, {})[(d.pool, d.name)] = d

    def _refresh_nodes(self, names: set[str]) -> None:
        for name in names:
            if name in self.base_nodes:
                self.store.upsert_node(self.node(self.base_nodes[name]))

    def _refresh_pods(self, uids: set[str]) -> None:
        for uid in uids:
            self._forward_pod(uid)


def _keys(claim: DraClaim) -> list[tuple[str, str]]:
    return [(pool, name) for _, pool, name in claim.devices]
