"""Extender latency: server-side p50/p99 and loopback round trips against a bare-aiohttp floor.

    python benchmarks/bench_extender.py [--nodes 1000 5000] [--requests 400] [--quick]
        [--verbs filter prioritize preempt]

Server-side time is the handler's work (decode + `app.respond`: the answer and the expected
placement it records) measured in-process. The round trip
compares the real app, served from its own process, with a floor server that only decodes the
same body with json.loads and encodes a same-size reply with json.dumps (target in
docs/architecture.md: ratio <= 1.0). The preempt verb is measured server-side only, with every
node a candidate proposing two victims (a third of all pods idle). Results go to
benchmarks/results/extender.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fleetgen import PRODUCTS, fleet, node_json
from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.model import Evidence
from gpusteward.extender import wire
from gpusteward.extender.app import Extender, create_app, respond
from gpusteward.extender.preempt import Preempter
from gpusteward.extender.replies import filter_reply, prioritize_reply
from gpusteward.extender.view import PlacementView
from gpusteward.sandbox.procs import free_port

NOW = 1_800_000_000.0
RESULTS = Path(__file__).resolve().parent / "results"
POD = {
    "metadata": {"name": "train-0", "namespace": "ml", "uid": "u",
                 "labels": {"gpusteward.io/class": "training"},
                 "annotations": {"gpusteward.io/card-types": "NVIDIA-H100*,NVIDIA-A100*"}},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"},
                                                         "requests": {"nvidia.com/gpu": "2"}}}]},
}


def make_view(n: int) -> PlacementView:
    nodes, pods, telemetry = fleet(n, now=NOW)
    store = FleetStore()
    view = PlacementView(parse_policy({}), store, clock=lambda: NOW)
    store.replace_all(nodes, pods)
    view.set_telemetry(telemetry)
    return view


def bodies_names(n: int) -> bytes:
    names = [f"gpu-node-{i:05d}" for i in range(n)]
    return json.dumps({"Pod": POD, "Nodes": None, "NodeNames": names}).encode()


def bodies(n: int) -> dict[str, bytes]:
    names = [f"gpu-node-{i:05d}" for i in range(n)]
    full = [node_json(name, PRODUCTS[i % len(PRODUCTS)]) for i, name in enumerate(names)]
    return {
        "names": bodies_names(n),
        # Compact, as Go's encoding/json writes it.
        "full": json.dumps({"Pod": POD, "Nodes": {"metadata": {}, "items": full},
                            "NodeNames": None}, separators=(",", ":")).encode(),
    }


def quantiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_ms": 1000 * statistics.median(s), "p99_ms": 1000 * s[int(0.99 * (len(s) - 1))]}


def server_side(view: PlacementView, body: bytes, verb: str, count: int) -> dict[str, float]:
    answer = filter_reply if verb == "filter" else prioritize_reply
    respond(view, answer, wire.decode_args(body))  # first sight of the demand builds its table
    times = []
    for _ in range(count):
        t = time.perf_counter()
        respond(view, answer, wire.decode_args(body))
        times.append(time.perf_counter() - t)
    return quantiles(times)


def preempter(view: PlacementView) -> Preempter:
    """Every pod judged as the background refresh would, a third of them idle."""
    p = Preempter(view.policy, view.fleet, None, CollectorRegistry(), clock=lambda: NOW)
    window = float(view.policy.reclaim.idle.window or 0)
    p.book.rebuild(view.fleet.pods.values(), {window: {
        pod.key: Evidence(window, 0.0 if i % 3 == 0 else 60.0, 1.0, pod.gpus)
        for i, pod in enumerate(view.fleet.pods.values())}})
    return p


def preempt_body(view: PlacementView, n: int, meta: bool) -> bytes:
    """ExtenderPreemptionArgs with n candidate nodes, each with the victims the scheduler
    proposes for POD (2 GPUs): after its reprieve pass, the fewest pods that free 2 GPUs, here
    two 1-GPU pods (pods the extender does not know where a node has fewer)."""
    by_node: dict[str, list[str]] = {}
    for pod in view.fleet.pods.values():
        by_node.setdefault(pod.node or "", []).append(pod.uid)
    victims = {}
    for i in range(n):
        name = f"gpu-node-{i:05d}"
        uids = (by_node.get(name, []) + [f"unknown-{i}-{j}" for j in range(2)])[:2]
        if meta:
            victims[name] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
        else:
            victims[name] = {"Pods": [{"metadata": {"name": u, "namespace": "ml", "uid": u},
                                       "spec": {"nodeName": name}} for u in uids],
                             "NumPDBViolations": 0}
    key = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
    other = "NodeNameToVictims" if meta else "NodeNameToMetaVictims"
    return json.dumps({"Pod": POD, other: None, key: victims}, separators=(",", ":")).encode()


def preempt_server_side(p: Preempter, body: bytes, count: int) -> dict[str, float]:
    """Wall time, and the process's CPU time, to the reply: on a shared machine the wall time
    also counts the moments other processes held the cores. The decoded request is then freed
    as the server frees it, after the reply is written; that time is reported on its own."""
    wall, cpu, freed = [], [], []
    for _ in range(count):
        t, c = time.perf_counter(), time.process_time()
        answered = p.respond(body)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        c = time.process_time()
        answered.spent.clear()
        freed.append(time.process_time() - c)
    return {**quantiles(wall), **{f"cpu_{k}": v for k, v in quantiles(cpu).items()},
            "freed_p50_ms": 1000 * statistics.median(freed)}


def floor_side(body: bytes, reply: object, count: int) -> dict[str, float]:
    times = []
    for _ in range(count):
        t = time.perf_counter()
        json.loads(body)
        json.dumps(reply).encode()
        times.append(time.perf_counter() - t)
    return quantiles(times)


def floor_reply(verb: str, n: int) -> object:
    """The reply gpusteward gives for the same request, as plain objects: same size, same keys."""
    view = make_view(n)
    answer = filter_reply if verb == "filter" else prioritize_reply
    return json.loads(answer(view, wire.decode_args(bodies_names(n))).body)


def decode_speed(body: bytes, count: int = 5) -> dict[str, float]:
    def best(fn) -> float:
        times = []
        for _ in range(count):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    def typed() -> None:  # what a full-mode request costs us: names of nodes the cache knows
        args = wire.decode_args(body)
        for raw in args.Nodes.items:
            wire.node_name(raw)

    ours, stdlib = best(typed), best(lambda: json.loads(body))
    return {"typed_ms": ours * 1000, "json_loads_ms": stdlib * 1000, "speedup": stdlib / ours}


# --- round trips: each server in its own process, one client -------------------------------

def serve(kind: str, n: int, port: int) -> None:
    if kind == "gpusteward":
        app = create_app(Extender(make_view(n), telemetry=None), max_body_bytes=256 << 20)
        # The refresh loop would re-read telemetry we do not have; the view is already built.
        app.cleanup_ctx.clear()
    else:
        replies = {v: floor_reply(v, n) for v in ("filter", "prioritize")}

        def handler(verb):
            async def h(request: web.Request) -> web.Response:
                json.loads(await request.read())
                return web.Response(body=json.dumps(replies[verb]).encode(),
                                    content_type="application/json")
            return h

        app = web.Application(client_max_size=256 << 20)
        app.add_routes([web.post(f"/{v}", handler(v)) for v in replies])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)



async def round_trips(port: int, verb: str, body: bytes, count: int) -> list[float]:
    url = f"http://127.0.0.1:{port}/{verb}"
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            async with session.post(url, data=body) as r:
                await r.read()
        times = []
        for _ in range(count):
            t = time.perf_counter()
            async with session.post(url, data=body) as r:
                await r.read()
                assert r.status == 200, r.status
            times.append(time.perf_counter() - t)
    return times


async def throughput(port: int, body: bytes, clients: int = 16, seconds: float = 5.0,
                     cap: int = 50_000) -> float:
    """Requests/s the server (one process, one core) answers under concurrent load;
    bounded in time and count, loopback only."""
    url = f"http://127.0.0.1:{port}/prioritize"
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline and done < cap:
            async with session.post(url, data=body) as r:
                await r.read()
            done += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return done / (time.perf_counter() - started)


def start(kind: str, n: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--nodes", str(n),
                             "--port", str(port)])
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


def run(nodes: list[int], count: int, verbs: list[str]) -> dict:
    results = []
    load_at_start = os.getloadavg()[0]
    for n in nodes:
        view = make_view(n)
        if "preempt" in verbs:
            p = preempter(view)
            for meta, mode in ((True, "names"), (False, "full")):
                body = preempt_body(view, n, meta)
                results.append({"nodes": n, "verb": "preempt", "mode": mode,
                                "server": preempt_server_side(p, body, count),
                                "body_mb": len(body) / 1e6})
        placement = [v for v in verbs if v != "preempt"]
        if placement:
            results += placement_rows(n, view, count, placement)
    return {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv), "results": results,
            # 1-minute load average: other work on the same cores slows the CPU time too
            "load": [load_at_start, os.getloadavg()[0]]}


def placement_rows(n: int, view: PlacementView, count: int, verbs: list[str]) -> list[dict]:
    """filter/prioritize: server side, round trips against the floor, throughput."""
    results: list[dict] = []
    body = bodies(n)
    ours, _ = start("gpusteward", n)
    floor, floor_port = start("floor", n)
    ours_port = int(ours.args[-1])
    try:
        for verb in verbs:
            row = {"nodes": n, "verb": verb, "mode": "names",
                   "server": server_side(view, body["names"], verb, count),
                   "floor_server": floor_side(body["names"], floor_reply(verb, n), count)}
            rt_ours = asyncio.run(round_trips(ours_port, verb, body["names"], count))
            rt_floor = asyncio.run(round_trips(floor_port, verb, body["names"], count))
            row["round_trip"] = quantiles(rt_ours)
            row["floor_round_trip"] = quantiles(rt_floor)
            row["ratio_p50"] = statistics.median(rt_ours) / statistics.median(rt_floor)
            results.append(row)
            full = server_side(view, body["full"], verb, max(20, count // 10))
            results.append({"nodes": n, "verb": verb, "mode": "full", "server": full,
                            "body_mb": len(body["full"]) / 1e6})
        results.append({"nodes": n, "mode": "full", "decode": decode_speed(body["full"])})
        results.append({"nodes": n, "mode": "names", "verb": "prioritize",
                        "requests_per_second": asyncio.run(throughput(ours_port,
                                                                      body["names"]))})
    finally:
        for p in (ours, floor):
            p.terminate()
            p.wait()
    return results


def print_table(report: dict) -> None:
    print(f"# extender benchmark — {report['machine']}, Python {report['python']}")
    for r in report["results"]:
        if "requests_per_second" in r:
            print(f"{r['nodes']:>6} names prioritize  {r['requests_per_second']:.0f} requests/s "
                  f"under 16 concurrent loopback clients (server: one process)")
            continue
        if "decode" in r:
            d = r["decode"]
            print(f"{r['nodes']:>6} full  decode   typed {d['typed_ms']:.1f} ms  json.loads "
                  f"{d['json_loads_ms']:.1f} ms  speedup {d['speedup']:.1f}x")
            continue
        s = r["server"]
        line = (f"{r['nodes']:>6} {r['mode']:<5} {r['verb']:<10} server p50 {s['p50_ms']:.3f} "
                f"p99 {s['p99_ms']:.3f} ms")
        if "cpu_p50_ms" in s:
            line += f" (CPU time p50 {s['cpu_p50_ms']:.3f} p99 {s['cpu_p99_ms']:.3f} ms)"
        if "floor_server" in r:
            f, rt, frt = r["floor_server"], r["round_trip"], r["floor_round_trip"]
            line += (f" | floor server p50 {f['p50_ms']:.3f} | round trip p50 {rt['p50_ms']:.3f}"
                     f" p99 {rt['p99_ms']:.3f} vs floor p50 {frt['p50_ms']:.3f}"
                     f" p99 {frt['p99_ms']:.3f} ms | ratio {r['ratio_p50']:.2f}")
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000, 10000])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="CI: tiny run, checks it works")
    parser.add_argument("--serve", choices=["gpusteward", "floor"])
    parser.add_argument("--port", type=int)
    parser.add_argument("--verbs", nargs="+", choices=["filter", "prioritize", "preempt"],
                        default=["filter", "prioritize", "preempt"])
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.nodes[0], args.port)
        return
    if args.quick:
        args.nodes, args.requests = [200], 30
    report = run(args.nodes, args.requests, args.verbs)
    print_table(report)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        every = set(args.verbs) == {"filter", "prioritize", "preempt"}
        name = "extender.json" if every else f"extender-{'-'.join(args.verbs)}.json"
        (RESULTS / name).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
