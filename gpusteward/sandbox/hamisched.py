"""A stand-in for HAMi's scheduler extender (filter and bind), speaking its wire shape.

HAMi's extender (github:Project-HAMi/HAMi v2.10.0, ``cmd/scheduler/main.go`` routes,
``pkg/scheduler/scheduler.go`` Filter and Bind, ``pkg/scheduler/routes/route.go``) answers
kube-scheduler's extender/v1 JSON, whose keys are Go's field names:

* ``POST /filter`` with ``{"Pod", "NodeNames"}`` (``nodeCacheCapable: true``): a pod asking no
  HAMi resource gets its nodes back as they came; otherwise HAMi picks the one node and the
  devices (gpusteward.sandbox.hami), writes the pod's annotations there and then, and answers
  ``{"NodeNames": [node]}``, or ``FailedNodes`` with HAMi's reasons (``node unregistered``,
  ``<n>/<m> CardInsufficientCore`` ...). Always 200, ``Error`` empty.
* ``POST /bind`` with ``{"PodName", "PodNamespace", "PodUID", "Node"}``: ``hami.io/bind-phase:
  allocating`` and the binding; the device plugin's Allocate then empties
  ``-to-allocate`` and sets ``success`` (done here at once: no kubelet runs the plugin).

    python -m gpusteward.sandbox.hamisched --server URL --listen 127.0.0.1:PORT  (token: $TOKEN)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter
from typing import Any

from aiohttp import web

from gpusteward.adapters.addresses import parse_hostport
from gpusteward.core import hami as records
from gpusteward.sandbox.hami import (
    BIND_PHASE,
    BIND_TIME,
    GPU_POLICY,
    NODE,
    TIME,
    TO_ALLOCATE,
    NodeDevices,
    encode,
    placed_on,
    requests,
)
from gpusteward.sandbox.kubehttp import KubeHTTP

_LOCK = asyncio.Lock()  # one Filter at a time, as HAMi's node lock serialises them


def _reply(names: list[str] | None, failed: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"Nodes": None, "NodeNames": names, "FailedNodes": failed,
                              "FailedAndUnresolvableNodes": None, "Error": ""})


def choose(pod: dict[str, Any], names: list[str], nodes: dict[str, dict[str, Any]],
           pods: list[dict[str, Any]]) -> tuple[str, str] | dict[str, str]:
    """(node, encoded devices) for the pod, or each node's reason."""
    asks = requests(pod)
    policy = (pod["metadata"].get("annotations") or {}).get(GPU_POLICY, "spread")
    failed, best = {}, None
    for name in names:
        node = nodes.get(name)
        if node is None or records.NODE_REGISTER not in (
                node["metadata"].get("annotations") or {}):
            failed[name] = "node unregistered"
            continue
        devices = NodeDevices.of(node, placed_on(name, pods))
        load = devices.load
        placed = devices.place(asks, policy)
        if placed is None:
            failed[name] = _reason(devices, asks)
        elif best is None or load > best[0]:  # nodes binpacked, HAMi's default
            best = (load, name, encode(placed))
    return failed if best is None else (best[1], best[2])


def _reason(devices: NodeDevices, asks: list[records.Ask]) -> str:
    """GenReason's shape: ``<count>/<cards> <Reason>`` per reason, sorted, joined by ", "."""
    why: Counter[str] = Counter()
    for d in devices.devices:
        for r in asks:
            if r.vgpus and not d.fits(r):
                why[_why(d, r)] += 1
                break
    if not why:
        return "NodeInsufficientDevice"
    return ", ".join(f"{n}/{len(devices.devices)} {k}" for k, n in sorted(why.items()))


def _why(d: records.DeviceLoad, r: records.Ask) -> str:
    """The first of Fit's reasons that holds, in Fit's order."""
    total = d.device
    if d.slots >= total.count:
        return "CardTimeSlicingExhausted"
    if total.devmem - d.mem < r.mem_on(total):
        return "CardInsufficientMemory"
    if total.devcore - d.cores < r.cores:
        return "CardInsufficientCore"
    if r.cores == 100 and d.slots:
        return "ExclusiveDeviceAllocateConflict"
    return "CardComputeUnitsExhausted"


def create_app(api: KubeHTTP) -> web.Application:
    async def filter_(request: web.Request) -> web.Response:
        args = await request.json()
        pod, names = args["Pod"], list(args.get("NodeNames") or [])
        if not any(r.vgpus for r in requests(pod)):
            return _reply(names)
        async with _LOCK:
            nodes = {n["metadata"]["name"]: n
                     for n in (await asyncio.to_thread(api.get, "/api/v1/nodes"))["items"]}
            pods = (await asyncio.to_thread(api.get, "/api/v1/pods"))["items"]
            picked = choose(pod, names, nodes, pods)
            if isinstance(picked, dict):
                return _reply(None, picked)
            node, devices = picked
            meta = pod["metadata"]
            await asyncio.to_thread(api.merge_patch, _pod_path(meta["namespace"], meta["name"]),
                                    {"metadata": {"annotations": {
                                        NODE: node, TIME: str(int(time.time())),
                                        TO_ALLOCATE: devices, records.ALLOCATED: devices}}})
        return _reply([node])

    async def bind(request: web.Request) -> web.Response:
        args = await request.json()
        path = _pod_path(args["PodNamespace"], args["PodName"])
        try:
            await asyncio.to_thread(api.merge_patch, path, {"metadata": {"annotations": {
                BIND_PHASE: "allocating", BIND_TIME: str(int(time.time()))}}})
            await asyncio.to_thread(api.create, f"{path}/binding", {
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": args["PodName"], "namespace": args["PodNamespace"],
                             "uid": args["PodUID"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]}})
            containers = len((await asyncio.to_thread(api.get, path))["spec"]["containers"])
            await asyncio.to_thread(api.merge_patch, path, {"metadata": {"annotations": {
                BIND_PHASE: "success", TO_ALLOCATE: ";" * containers}}})
        except Exception as e:  # HAMi answers every failure as the Error text
            return web.json_response({"Error": str(e)})
        return web.json_response({"Error": ""})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.post("/filter", filter_), web.post("/bind", bind),
                    web.get("/healthz", healthz)])
    return app


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True, help="the API server's URL")
    parser.add_argument("--listen", default="127.0.0.1:8765")
    args = parser.parse_args()
    host, port = parse_hostport(args.listen)
    web.run_app(create_app(KubeHTTP(args.server, os.environ["TOKEN"])), host=host, port=port,
                access_log=None, print=None)


if __name__ == "__main__":
    main()
