"""Fleet view cost: 1,000 nodes x 8 GPUs on NVIDIA's DRA driver vs the same fleet on the device
plugin.

    python benchmarks/bench_fleetview.py [--nodes 1000] [--quick]

The extender's fleet view is what its list+watch caches hold after decoding: Nodes and GPU Pods,
plus on DRA ResourceSlices, DeviceClasses and ResourceClaims joined into them (core/dra.py).
Both fleets have the same GPUs and the same 4 one-GPU pods per node: on the device plugin as
`nvidia.com/gpu` allocatable and requests, on DRA as one ResourceSlice per node (the driver's
device shape, gpusteward.sandbox.dra) and one allocated template claim per pod. We time a full
re-list (decode every LIST body and rebuild the view: what a start or a 410 Gone costs; median
of 5), one watch event each way (a pod bound; on DRA also its claim allocated), and measure the
view's retained memory (tracemalloc, after the LIST bodies are freed) and the LIST bytes.
In-process, no API server: its serving cost is not gpusteward's. Results:
benchmarks/results/fleetview.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fleetgen import node_json
from benchmarks.memory import peak_rss_mb, rss_mb
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.drawire import (
    WireClaim,
    WireClass,
    WireSlice,
    slice_devices,
    to_claim,
    to_class,
)
from gpusteward.core.fleet import FleetStore
from gpusteward.core.kubewire import WireNode, WirePod, to_node, to_pod
from gpusteward.sandbox import dra

RESULTS = Path(__file__).resolve().parent / "results"
RESOURCES = ("nvidia.com/gpu",)
PRODUCT = "NVIDIA-H100-80GB-HBM3"
PODS_PER_NODE = 4


def pod_json(node: str, k: int, claims: bool, gpu: bool = True) -> dict[str, Any]:
    name = f"train-{node}-{k}"
    container: dict[str, Any] = {"name": "main", "image": "registry.example/ml/train:1"}
    spec: dict[str, Any] = {"nodeName": node, "containers": [container],
                            "priorityClassName": "batch", "priority": 1000}
    if not gpu:  # a CPU pod: listed and decoded, not kept
        container["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    elif claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    else:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"},
                                  "requests": {"nvidia.com/gpu": "1"}}
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "labels": {"app": "train", "gpusteward.io/team": "ml"},
                         "creationTimestamp": "2026-11-29T10:00:00Z"},
            "spec": spec,
            "status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True",
                 "lastTransitionTime": "2026-11-29T10:00:01Z"}]}}


def claim_json(node: str, k: int) -> dict[str, Any]:
    pod = f"train-{node}-{k}"
    return {"metadata": {"name": f"{pod}-gpu-abcde", "namespace": "ml",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                              "uid": f"uid-{pod}", "controller": True}]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": dra.GPU_CLASS, "allocationMode": "ExactCount",
                "count": 1}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": dra.DRIVER, "pool": node, "device": f"gpu-{k}"}]}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]}}


def bodies(nodes: int, on_dra: bool) -> dict[str, bytes]:
    """The LIST bodies' items, one JSON document per kind."""
    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    node_objs = [node_json(n, PRODUCT) for n in names]
    if on_dra:  # the kubelet alone: no GPU allocatable, no GFD labels
        for obj in node_objs:
            obj["status"]["allocatable"].pop("nvidia.com/gpu")
            obj["status"]["capacity"].pop("nvidia.com/gpu")
            obj["metadata"]["labels"] = {k: v for k, v in obj["metadata"]["labels"].items()
                                         if not k.startswith("nvidia.com/")}
    out = {"nodes": msgspec.json.encode(node_objs),
           "pods": msgspec.json.encode([pod_json(n, k, on_dra) for n in names
                                        for k in range(PODS_PER_NODE)])}
    if on_dra:
        out["resourceslices"] = msgspec.json.encode([
            dra.resource_slice(n, [dra.gpu_device(n, i, PRODUCT, 81559) for i in range(8)])
            for n in names])
        out["deviceclasses"] = msgspec.json.encode(dra.device_classes())
        out["resourceclaims"] = msgspec.json.encode([claim_json(n, k) for n in names
                                                     for k in range(PODS_PER_NODE)])
    return out


def build(raw: dict[str, bytes]) -> tuple[FleetStore, DraFleet]:
    """Decode every body and rebuild the view, as a (re-)list of each watch does."""
    store = FleetStore()
    view = DraFleet(store)
    if "resourceslices" in raw:
        view.replace_slices({w.metadata.name: slice_devices(w, view.driver) for w in
                             msgspec.json.decode(raw["resourceslices"], type=list[WireSlice])})
        view.replace_classes(to_class(w, view.driver) for w in
                             msgspec.json.decode(raw["deviceclasses"], type=list[WireClass]))
        view.replace_claims(to_claim(w, view.driver) for w in
                            msgspec.json.decode(raw["resourceclaims"], type=list[WireClaim]))
    view.replace_all(
        [to_node(w, RESOURCES) for w in msgspec.json.decode(raw["nodes"], type=list[WireNode])],
        [to_pod(w, RESOURCES) for w in msgspec.json.decode(raw["pods"], type=list[WirePod])])
    return store, view


def timed(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def retained_mb(raw: dict[str, bytes]) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    view = build(raw)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del view
    return (after - before) / 1e6


def event_us(raw: dict[str, bytes], on_dra: bool, runs: int) -> float:
    """One pod bound (and on DRA its claim allocated), applied as the watches apply it."""
    store, view = build(raw)
    pod = msgspec.json.encode(pod_json("gpu-node-00000", 7, on_dra))
    claim = msgspec.json.encode(claim_json("gpu-node-00000", 7))

    def apply() -> None:
        view.upsert_pod(to_pod(msgspec.json.decode(pod, type=WirePod), RESOURCES))
        if on_dra:
            w = msgspec.json.decode(claim, type=WireClaim)
            view.set_claim(f"{w.metadata.namespace}/{w.metadata.name}", to_claim(w, view.driver))
    return 1e6 * timed(apply, runs)


def measure(nodes: int, on_dra: bool, runs: int) -> dict[str, Any]:
    raw = bodies(nodes, on_dra)
    store, _ = build(raw)
    assert sum(n.gpus for n in store.nodes.values()) == 8 * nodes
    assert sum(p.gpus for p in store.pods.values()) == PODS_PER_NODE * nodes
    return {"mode": "dra" if on_dra else "device-plugin", "nodes": nodes, "gpus": 8 * nodes,
            "pods": PODS_PER_NODE * nodes,
            "list_mb": {k: len(v) / 1e6 for k, v in raw.items()},
            "relist_ms": 1000 * timed(lambda: build(raw), runs),
            "retained_mb": retained_mb(raw), "event_us": event_us(raw, on_dra, 200)}


def extender_rss(nodes: int, gpu_pods: int, other_pods: int) -> dict[str, Any]:
    """In this (fresh) process: the extender's view of `nodes` nodes with `gpu_pods` one-GPU and
    `other_pods` CPU pods each, from LIST pages of 500 as its watches read them, with telemetry
    for every GPU, its placement view and its preemption book; peak and settled RSS."""
    from benchmarks.fleetgen import fleet
    from gpusteward.core.policy import parse_policy
    from gpusteward.extender.app import create_app  # noqa: F401 — the whole extender imported
    from gpusteward.extender.victimbook import VictimBook
    from gpusteward.extender.view import PlacementView

    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    store = FleetStore()
    node_body = msgspec.json.encode([node_json(n, PRODUCT) for n in names])
    listed_nodes = [to_node(w, RESOURCES) for w in
                    msgspec.json.decode(node_body, type=list[WireNode])]
    del node_body
    kept = []
    per_node = gpu_pods + other_pods
    for start in range(0, nodes * per_node, 500):  # one LIST page at a time
        page = msgspec.json.encode([
            pod_json(names[i // per_node], i % per_node, False, gpu=i % per_node < gpu_pods)
            for i in range(start, min(start + 500, nodes * per_node))])
        kept += [p for p in (to_pod(w, RESOURCES) for w in
                             msgspec.json.decode(page, type=list[WirePod])) if p.gpus > 0]
    store.replace_all(listed_nodes, kept)
    policy = parse_policy({})
    view = PlacementView(policy, store)
    view.set_telemetry(fleet(nodes)[2])
    book = VictimBook(policy)
    book.rebuild(store.pods.values(), {})
    gc.collect()
    assert sum(p.gpus for p in store.pods.values()) == gpu_pods * nodes
    return {"nodes": nodes, "gpus": 8 * nodes, "pods": per_node * nodes,
            "gpu_pods": gpu_pods * nodes,
            "peak_rss_mb": peak_rss_mb(),
            "settled_rss_mb": rss_mb()}


def extender_rss_in_fresh_process(nodes: int, gpu_pods: int, other_pods: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--rss-only", str(nodes), str(gpu_pods),
                          str(other_pods)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="tiny size, no results written")
    parser.add_argument("--rss-nodes", type=int, nargs="*", default=[1000, 2000, 3000, 5000],
                        help="fleet sizes for the extender's memory (8 GPU + 2 CPU pods a node)")
    parser.add_argument("--rss-only", type=int, nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_only:
        print(json.dumps(extender_rss(*args.rss_only)))
        return
    nodes, runs = (20, 1) if args.quick else (args.nodes, 5)
    rss_sizes = [20] if args.quick else args.rss_nodes
    results = [measure(nodes, on_dra, runs) for on_dra in (False, True)]
    memory = [extender_rss_in_fresh_process(n, 8, 2) for n in rss_sizes]
    for m in memory:
        print(f"extender view of {m['nodes']} nodes, {m['pods']} pods ({m['gpu_pods']} on "
              f"GPUs): peak RSS {m['peak_rss_mb']:.0f} MB, settled {m['settled_rss_mb']:.0f} MB")
    for r in results:
        print(f"{r['mode']:>13}: re-list {r['relist_ms']:.0f} ms, retained "
              f"{r['retained_mb']:.1f} MB, one watch event {r['event_us']:.0f} us, LIST "
              f"{sum(r['list_mb'].values()):.1f} MB")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "fleetview.json").write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
            "results": results, "memory": memory}, indent=2) + "\n")


if __name__ == "__main__":
    main()
