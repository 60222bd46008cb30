"""The DCGM simulator: dcgm-exporter's `/metrics` for every GPU of the sandbox's fake nodes.

It watches Nodes and GPU Pods like any gpusteward app. Each bound GPU pod gets stable GPU
indices on its node (lowest free first, kept until the pod goes away). A pod's utilization comes
from its annotation `sandbox.gpusteward.io/gpu-util`:

    "85"              85 % on every GPU of the pod, all the time
    "90:5m,0:25m"     a repeating profile: 90 % for 5 minutes, then 0 % for 25, from binding

A time-sliced node (GFD's ``nvidia.com/gpu.replicas`` R > 1, allocatable = GPUs x R) folds
every R slots onto one physical GPU, which reads the sum of its pods' use and is named for the
pod on its lowest slot; labelled ``sandbox.gpusteward.io/virtual-gpus: "true"`` its exporter runs
with ``--kubernetes-virtual-gpus`` and prints a copy per pod instead (``simgpu.Share``).

Free GPUs read 0 %. Node labels `sandbox.gpusteward.io/xid` and `sandbox.gpusteward.io/gpu-temp`
make every GPU of that node report that XID / temperature (health tests);
`sandbox.gpusteward.io/xid-gpus: "1"` limits the XID to those physical GPUs.

Shared and partitioned GPUs are reported as dcgm-exporter reports them: a time-sliced node
(`nvidia.com/gpu.replicas` R) gets R pod slots per GPU and one series per physical GPU, which
reads the sum of its pods' utilizations and is attributed to the pod on its lowest slot (the
exporter maps replica ids `<uuid>::<n>` to the GPU and keeps one pod per device); a MIG node
(mixed strategy, `nvidia.com/mig-<profile>` allocatable) one series per instance, with no
`DCGM_FI_DEV_GPU_UTIL` or, where the node is labelled `sandbox.gpusteward.io/mig-gpu-util: zero`,
a 0. Like dcgm-exporter,
`/metrics` keeps showing a GPU's last XID after the label goes (NVIDIA/dcgm-exporter#500); with
``--xid-count-window`` it also exports ``DCGM_EXP_XID_ERRORS_COUNT``, which does drop back.

A node labelled ``sandbox.gpusteward.io/dcgm-exporter: "4.9"`` has an exporter of 4.9 or later:
DCGM 4.7's field names and units, and ``hostname``/``DCGM_FI_SYSTEM_DRIVER_VERSION`` labels
(``core.dcgm.DCGM47``); relabelling a node mid-run is its DaemonSet pod being upgraded. Any other
value, or none, is 4.8 (``core.dcgm.LEGACY``).

A node labelled ``sandbox.gpusteward.io/exporter: down`` has an exporter that answers 503 on its
``/nodes/<node>/metrics`` (a crashed or hung dcgm-exporter pod): its scrape fails and Prometheus
marks its series stale, while every other node keeps answering.

A HAMi node (its ``hami.io/node-nvidia-register`` annotation, gpusteward.sandbox.hami) reports
each registered GPU with the sum of the pods HAMi placed on it (its pods' ``hami.io/vgpu-
devices-allocated``) and no pod labels: dcgm-exporter cannot map HAMi's ``<UUID>-<n>`` device
ids. Its vGPU monitor is ``/nodes/<node>/hami/metrics``: each pod's slice with the pod's use
(gpusteward.sandbox.hamimon), HAMi 2.9's names, or the legacy ones where the node is labelled
``sandbox.gpusteward.io/hami-metrics: legacy``; a pod annotated
``sandbox.gpusteward.io/hami-monitor: "off"`` has no series (no CUDA context yet).

A DRA pod's GPUs are the devices its claims were allocated, and carry its pod labels as
dcgm-exporter's DRA mapping adds them; on a node labelled
``sandbox.gpusteward.io/exporter-dra-mapping: "off"`` they carry only their UUID.

With ``--hosts-dir`` it also keeps, for every GPU node, what the NVML agent reads on a real
node (``gpusteward.sandbox.gpuhosts``), from the same GPUs and the same pod assignments.

    python -m gpusteward.sandbox.simulator --kubeconfig FILE --listen 127.0.0.1:9400
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from aiohttp import web

from gpusteward.adapters.addresses import parse_hostport
from gpusteward.adapters.dra import start as start_dra_watches
from gpusteward.adapters.kube import Watcher, connect
from gpusteward.core import hami
from gpusteward.core.dcgm import GENERATIONS, MigInstance, PodRef
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.fleet import FleetStore
from gpusteward.core.model import Node, Pod
from gpusteward.core.sharing import MIG_RESOURCE_PREFIX, replicas
from gpusteward.core.typedconfig import Duration
from gpusteward.sandbox import hamimon
from gpusteward.sandbox.fleet import (
    GPU_RESOURCES,
    MIG_GPU_UTIL_LABEL,
    TEMP_LABEL,
    XID_GPUS_LABEL,
    XID_LABEL,
)
from gpusteward.sandbox.gpuhosts import GpuHosts
from gpusteward.sandbox.hamimon import ContainerSlice
from gpusteward.sandbox.scrape import hami_monitor_path, simulator_path
from gpusteward.sandbox.simgpu import Share, SimGpu, model_name_for_product, render_exposition

UTIL_ANNOTATION = "sandbox.gpusteward.io/gpu-util"
EXPORTER_LABEL = "sandbox.gpusteward.io/exporter"  # "down": the node's exporter answers 503
GENERATION_LABEL = "sandbox.gpusteward.io/dcgm-exporter"  # "4.9": DCGM 4.7 names and units
# `off`: the node's exporter runs without DRA pod mapping, so GPUs allocated through claims carry
# no pod labels (only their UUID); on, they carry the pod's, as dcgm-exporter's DRA mapping does.
EXPORTER_DRA_LABEL = "sandbox.gpusteward.io/exporter-dra-mapping"
VIRTUAL_GPUS_LABEL = "sandbox.gpusteward.io/virtual-gpus"
HAMI_METRICS_LABEL = "sandbox.gpusteward.io/hami-metrics"  # "legacy": HAMi <= 2.8's names
HAMI_MONITOR_ANNOTATION = "sandbox.gpusteward.io/hami-monitor"  # "off": no series of the pod
IDLE_TEMP_C, BUSY_TEMP_C = 34, 71


class ProfileError(ValueError):
    pass


def parse_profile(text: str) -> list[tuple[float, float]]:
    """`90:5m,0:25m` -> [(90.0, 300.0), (0.0, 1500.0)]; `85` -> [(85.0, inf)]."""
    steps = []
    for part in text.split(","):
        value, _, length = part.strip().partition(":")
        try:
            percent = float(value)
            seconds = float(Duration.parse(length)) if length else float("inf")
        except ValueError as e:
            raise ProfileError(f"bad {UTIL_ANNOTATION} {text!r}: {e}") from e
        if not 0 <= percent <= 100 or seconds <= 0:
            raise ProfileError(f"bad {UTIL_ANNOTATION} {text!r}: percent 0-100, length > 0")
        steps.append((percent, seconds))
    return steps


def util_at(profile: str | None, elapsed: float) -> float:
    if not profile:
        return 0.0
    steps = parse_profile(profile)
    cycle = sum(length for _, length in steps)
    t = elapsed % cycle if cycle != float("inf") else elapsed
    for percent, length in steps:
        if t < length:
            return percent
        t -= length
    return steps[-1][0]


class GpuAssigner:
    """Stable GPU indices for the pods bound to each node (slots: replicas, MIG instances)."""

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, list[int]]] = {}

    def assign(self, node: Node, pods: Iterable[Pod],
               pinned: Mapping[str, list[int]] | None = None) -> dict[str, list[int]]:
        """``pinned``: pods whose GPUs are known (DRA claims name their devices)."""
        held = self._by_node.setdefault(node.name, {})
        live = {p.uid: p for p in pods}
        for uid in list(held):
            if uid not in live:
                del held[uid]
        held.update({uid: list(idx) for uid, idx in (pinned or {}).items() if uid in live})
        taken = {i for indices in held.values() for i in indices}
        for uid, pod in sorted(live.items(), key=lambda kv: (kv[1].bound_at or 0, kv[0])):
            if uid not in held:
                free = [i for i in range(node.gpus) if i not in taken][: pod.gpus]
                held[uid] = free
                taken.update(free)
        return held


def simulate(fleet: FleetStore, assigner: GpuAssigner, now: float,
             only: str | None = None, dra: DraFleet | None = None) -> list[SimGpu]:
    """Every GPU of the fleet, or of node ``only``. A DRA pod gets the GPUs its claims were
    allocated (the sandbox's driver names whole GPU ``i`` ``gpu-<i>``)."""
    gpus: list[SimGpu] = []
    nodes = fleet.nodes.values() if only is None else [n for n in [fleet.nodes.get(only)] if n]
    for node in nodes:
        if not node.product or node.gpus <= 0:
            continue
        pods = {p.uid: p for p in fleet.pods_on(node.name) if not p.deleting}
        if node.vgpus:
            gpus += _hami_gpus(node, pods.values(), now)
            continue
        pinned = {uid: [int(d.name.removeprefix("gpu-")) for d in devices]
                  for uid in pods if dra and (devices := dra.devices_of(uid))}
        owner = {i: pods[uid] for uid, idx in assigner.assign(node, pods.values(), pinned).items()
                 for i in idx}
        if node.labels.get(EXPORTER_DRA_LABEL) == "off":  # the exporter maps no DRA pod
            owner = {i: p for i, p in owner.items() if p.uid not in pinned}
        gpus += _node_gpus(node, owner, now)
    return gpus


def _mig_profile(node: Node) -> str | None:
    return next((r.removeprefix(MIG_RESOURCE_PREFIX) for r, n in node.resources.items()
                 if r.startswith(MIG_RESOURCE_PREFIX) and n > 0), None)


def _node_gpus(node: Node, owner: dict[int, Pod], now: float) -> list[SimGpu]:
    """One SimGpu per MIG instance, else per physical GPU with the pods on its replica slots."""
    profile = _mig_profile(node)
    if profile is not None:
        per_gpu = max(1, node.gpus // max(1, int(node.labels.get("nvidia.com/gpu.count", "1"))))
        memory = int(node.labels.get(f"{MIG_RESOURCE_PREFIX}{profile}.memory", "10240"))
        gpu_util = node.labels.get(MIG_GPU_UTIL_LABEL, "absent")
        return [_gpu(node, slot // per_gpu, [owner[slot]] if slot in owner else [], now,
                     memory, MigInstance(slot % per_gpu + 1, profile, gpu_util))
                for slot in range(node.gpus)]
    shares = replicas(node)
    memory = int(node.labels.get("nvidia.com/gpu.memory", "81559"))
    virtual = shares > 1 and node.labels.get(VIRTUAL_GPUS_LABEL) == "true"
    out = []
    for g in range(node.gpus // shares):
        held = [(str(s - g * shares), owner[s]) for s in range(g * shares, (g + 1) * shares)
                if s in owner]
        gpu = _gpu(node, g, [p for _, p in held], now, memory)
        if virtual and held:  # --kubernetes-virtual-gpus: a copy per pod, with its own use
            gpu = dataclasses.replace(gpu, shares=tuple(
                Share(PodRef(p.namespace, p.name, "main"), n, _pod_util(p, now))
                for n, p in held))
        out.append(gpu)
    return out


def _hami_gpus(node: Node, pods: Iterable[Pod], now: float) -> list[SimGpu]:
    """Each registered GPU with the summed use of the pods HAMi placed on it, no pod named."""
    on: dict[str, list[Pod]] = {}
    for p in pods:
        for s in hami.slices(p.annotations):
            on.setdefault(s.uuid, []).append(p)
    out = []
    for i, device in enumerate(node.vgpus):
        gpu = _gpu(node, i, on.get(device.id, []), now, device.devmem)
        out.append(dataclasses.replace(gpu, pod=None))
    return out


def hami_slices(fleet: FleetStore, node: Node, now: float) -> list[ContainerSlice]:
    """What HAMi's vGPU monitor on ``node`` reports: each placed pod's slices, with its use."""
    out = []
    for p in fleet.pods_on(node.name):
        if p.deleting or p.annotations.get(HAMI_MONITOR_ANNOTATION) == "off":
            continue
        for i, s in enumerate(hami.slices(p.annotations)):
            out.append(ContainerSlice(node.name, p.namespace, p.name, "main", s.uuid,
                                      _pod_util(p, now), vdevice=i))
    return out


def _pod_util(pod: Pod, now: float) -> float:
    try:
        return util_at(pod.annotations.get(UTIL_ANNOTATION), now - (pod.bound_at or now))
    except ProfileError as e:
        logging.getLogger("gpusteward.simulator").warning("%s: %s", pod.key, e)
        return 0.0


def _xid(node: Node, index: int) -> int:
    only = node.labels.get(XID_GPUS_LABEL)
    if only and str(index) not in {i.strip() for i in only.split(",")}:
        return 0
    return int(node.labels.get(XID_LABEL) or 0)


def _gpu(node: Node, index: int, pods: list[Pod], now: float, memory: int,
         mig: MigInstance | None = None) -> SimGpu:
    """``pods``: those holding the GPU (several on a time-sliced one); the first is named."""
    util = min(100.0, sum(_pod_util(p, now) for p in pods))
    temp = int(node.labels.get(TEMP_LABEL) or (BUSY_TEMP_C if util > 50 else IDLE_TEMP_C))
    pod = pods[0] if pods else None
    return SimGpu(
        node=node.name, index=index, model_name=model_name_for_product(node.product or ""),
        util_percent=util, memory_mib=memory,
        fb_used_mib=int(memory * (0.6 if util else 0.05)) if pod else 0,
        temp_c=temp, power_w=70.0 + 6.0 * util, xid=_xid(node, index),
        pod=PodRef(pod.namespace, pod.name, "main") if pod else None, mig=mig,
    )


class ExporterXids:
    """XIDs as dcgm-exporter shows them, from the XIDs the GPUs raise now.

    Its XID gauge keeps a GPU's last XID until the exporter restarts; its opt-in
    DCGM_EXP_XID_ERRORS_COUNT counts the XIDs of the last ``window`` seconds (one per GPU here)
    and its opt-in DCGM_EXP_XID_ERRORS_TOTAL every XID since it started: one each time a GPU
    starts raising one (a fault held for a while is one event).
    """

    def __init__(self, window: float = 0.0) -> None:
        self.window = window
        self._last: dict[tuple[str, int], tuple[int, float]] = {}
        self._raised: dict[tuple[str, int], int] = {}  # the XID each GPU raised last time
        self._total: dict[tuple[str, int, int], int] = {}

    def apply(self, gpus: Iterable[SimGpu], now: float) -> list[SimGpu]:
        out = []
        for gpu in gpus:
            key = (gpu.node, gpu.index)
            if gpu.xid:
                self._last[key] = (gpu.xid, now)
                if self._raised.get(key) != gpu.xid:
                    self._total[(*key, gpu.xid)] = self._total.get((*key, gpu.xid), 0) + 1
            self._raised[key] = gpu.xid
            xid, at = self._last.get(key, (0, 0.0))
            recent = bool(xid) and now - at <= self.window
            out.append(dataclasses.replace(gpu, xid=xid, xid_count=int(recent),
                                           xid_total=self._total.get((*key, xid), 0)))
        return out


def _generation(node: Node | None) -> str:
    version = node.labels.get(GENERATION_LABEL, "4.8") if node else "4.8"
    return version if version in GENERATIONS else "4.8"


def create_app(fleet: FleetStore, clock: Callable[[], float] = time.time,
               assigner: GpuAssigner | None = None,
               xids: ExporterXids | None = None, dra: DraFleet | None = None) -> web.Application:
    assigner = assigner or GpuAssigner()
    xids = xids or ExporterXids()
    window_ms = int(xids.window * 1000) or None

    async def metrics(request: web.Request) -> web.Response:
        """Every node's GPUs, or (``/nodes/{node}/metrics``) one node's, as its exporter."""
        only = fleet.nodes.get(request.match_info.get("node", ""))
        if only is not None and only.labels.get(EXPORTER_LABEL) == "down":
            raise web.HTTPServiceUnavailable(text="exporter down (sandbox fault)")
        now = clock()
        gpus = xids.apply(simulate(fleet, assigner, now, request.match_info.get("node"), dra),
                          now)
        by_generation: dict[str, list[SimGpu]] = {"4.8": []}
        for gpu in gpus:  # each node's exporter prints its own generation's families
            by_generation.setdefault(_generation(fleet.nodes.get(gpu.node)), []).append(gpu)
        text = "".join(render_exposition(group, xid_count_window_ms=window_ms, xid_total=True,
                                         generation=GENERATIONS[v],
                                         node_label=GENERATIONS[v].node_label)
                       for v, group in sorted(by_generation.items()) if group or v == "4.8")
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def hami_monitor(request: web.Request) -> web.Response:
        """One HAMi node's vGPU monitor."""
        node = fleet.nodes.get(request.match_info["node"])
        if node is None or not node.vgpus:
            raise web.HTTPNotFound(text="no HAMi node of that name")
        text = hamimon.render_exposition(hami_slices(fleet, node, clock()),
                                         legacy=node.labels.get(HAMI_METRICS_LABEL) == "legacy")
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get(simulator_path("{node}"), metrics),
                    web.get(hami_monitor_path("{node}"), hami_monitor),
                    web.get("/health", health)])
    return app


async def _main(args: argparse.Namespace) -> None:
    api = await connect(args.kubeconfig)
    fleet = FleetStore()
    dra = DraFleet(fleet)  # a DRA pool's GPUs and pods, as the apps see them
    watchers = [Watcher(api, dra, kind, list(GPU_RESOURCES)) for kind in ("nodes", "pods")]
    tasks = [asyncio.create_task(w.run()) for w in watchers]
    tasks.append(start_dra_watches(api, dra))
    assigner = GpuAssigner()  # one for /metrics and the GPU hosts: the same GPUs per pod
    if args.hosts_dir:
        hosts = GpuHosts(Path(args.hosts_dir))

        def model() -> tuple[list[SimGpu], dict[str, str]]:
            # The NVML agent reads whole GPUs, not MIG instances; a DRA pod's are its claim's.
            gpus = [g for g in simulate(fleet, assigner, time.time(), dra=dra) if g.mig is None]
            return gpus, dra.claim_names()

        tasks.append(asyncio.create_task(hosts.run(model, args.hosts_tick)))
    host, port = parse_hostport(args.listen)
    app = create_app(fleet, assigner=assigner, xids=ExporterXids(args.xid_count_window), dra=dra)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    await asyncio.gather(*tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", default="127.0.0.1:9400")
    parser.add_argument("--hosts-dir", help="also keep each GPU node's NVML library file and "
                        "kubelet PodResources socket here, for NVML agents (see gpuhosts)")
    parser.add_argument("--hosts-tick", type=float, default=0.5,
                        help="seconds between updates of --hosts-dir")
    parser.add_argument("--xid-count-window", type=float, default=0.0,
                        help="also export DCGM_EXP_XID_ERRORS_COUNT over this many seconds "
                        "(dcgm-exporter's --xid-count-window-size; 0: off, as in its default CSV)")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
