"""A Prometheus query API answering the what-if history's range queries for a synthetic fleet.

Backfilling a real Prometheus with a week of 1,000 GPUs (40 million samples per DCGM field
alone, as OpenMetrics text several GB) does not fit the benchmark machine, so this process
answers ``/api/v1/query_range`` the way Prometheus would for the queries
``gpusteward.adapters.history`` issues (matrix results, one series per label set, one point per
step, values as strings), from a seeded fleet model: 8-GPU nodes, pods of 1-8 GPUs following
each other on the same GPUs (some created before the window, some pending first), each a
training job (busy), a notebook (busy and idle in turns of hours), a forgotten pod (busy an
hour, then idle) or an inference server (partly busy); one exporter outage of an hour per node.
Prometheus's own query time is not part of what the benchmark measures.

    python benchmarks/whatif_prometheus.py --port 9090 --gpus 1000 --days 7 --end 1800000000
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import re
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpusteward.adapters.promql import LEFT_CLOSED_PROBE

STEP, SCRAPE = 60, 30
HOUR_STEPS = 3600 // STEP
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")


@dataclass
class FakePod:
    uid: str
    namespace: str
    name: str
    team: str
    node: str
    gpus: list[int]
    pending_from: int  # step indices (may be negative: before the window)
    running_from: int
    running_to: int
    owner: tuple[str, str]
    ends: list[int] = field(default_factory=list)  # utilization segments: end step, value
    values: list[float] = field(default_factory=list)

    def util(self, steps: range) -> list[tuple[range, str]]:
        """Its utilization over ``steps``, segment by segment (the last one lasts)."""
        out, i = [], steps.start
        while i < steps.stop:
            k = min(bisect.bisect_right(self.ends, i), len(self.values) - 1)
            stop = steps.stop if k == len(self.values) - 1 else min(steps.stop, self.ends[k])
            out.append((range(i, stop), f"{self.values[k]:g}"))
            i = stop
        return out


class Fleet:
    def __init__(self, gpus: int, steps: int, seed: int = 7):
        rng = random.Random(seed)
        self.steps = steps
        self.nodes = [f"gpu-{n:04d}" for n in range(max(1, gpus // 8))]
        self.outage = {n: rng.randrange(steps) for n in self.nodes}
        self.pods: list[FakePod] = []
        for node in self.nodes:
            first = 0
            while first < 8:
                size = min(rng.choice([1, 1, 2, 2, 4, 8]), 8 - first)
                self._fill(rng, node, list(range(first, first + size)))
                first += size

    def _fill(self, rng: random.Random, node: str, gpus: list[int]) -> None:
        t = -rng.randrange(2 * 24 * HOUR_STEPS)
        while t < self.steps:
            pending = rng.choice([0, 0, 0, rng.randrange(1, HOUR_STEPS)])
            life = rng.randrange(6 * HOUR_STEPS, 3 * 24 * HOUR_STEPS)
            n = len(self.pods)
            team = f"team-{n % 20}"
            kind = rng.choices(["training", "notebook", "forgotten", "inference"],
                               [40, 30, 15, 15])[0]
            owner = {"training": ("Job", f"train-{n}"), "inference": ("ReplicaSet",
                     f"serve-{n}-7d9f8c")}.get(kind, ("<none>", "<none>"))
            pod = FakePod(f"uid-{n}", f"ns-{n % 50}", f"{kind}-{n}", team, node, gpus, t,
                          t + pending, min(t + pending + life, self.steps + HOUR_STEPS), owner)
            self._pattern(rng, pod, kind)
            self.pods.append(pod)
            t = pod.running_to + 1 + rng.randrange(2 * HOUR_STEPS)

    def _pattern(self, rng: random.Random, pod: FakePod, kind: str) -> None:
        t = pod.running_from
        busy = True
        while t <= pod.running_to:
            if kind == "training":
                length, value = 10**9, 80.0 + rng.random() * 15
            elif kind == "inference":
                length, value = rng.randrange(HOUR_STEPS, 8 * HOUR_STEPS), 20 + rng.random() * 40
            elif kind == "forgotten":
                length, value = (HOUR_STEPS, 70.0) if busy else (10**9, 0.0)
            else:
                length = rng.randrange(HOUR_STEPS, 6 * HOUR_STEPS)
                value = 60 + rng.random() * 30 if busy else rng.random() * 2
            t += length
            busy = not busy
            pod.ends.append(t)
            pod.values.append(round(value, 1))

    def present(self, a: int, b: int) -> list[FakePod]:
        return [p for p in self.pods if p.pending_from <= b and p.running_to >= a]


def _range(lo: int, hi: int, a: int, b: int) -> range:
    return range(max(lo, a), min(hi, b) + 1)


def _minus(spans: list[range], cut: range) -> list[range]:
    """``spans`` (consecutive steps each) less the steps of ``cut``."""
    out = []
    for s in spans:
        out += [r for r in (range(s.start, min(s.stop, cut.start)),
                            range(max(s.start, cut.stop), s.stop)) if r]
    return out


Runs = list[tuple[range, str]]  # consecutive steps with one value each


class Answers:
    def __init__(self, fleet: Fleet, start: float):
        self.fleet, self.start = fleet, start
        # each step's '[<time>,' once: a series' points are joined from these (the fleet's
        # bodies are GBs; formatting every point would make this process the bottleneck)
        self.stamps = [f"[{self.at(i):.3f}," for i in range(fleet.steps)]

    def at(self, i: int) -> float:
        return self.start + i * STEP

    def _series(self, metric: dict[str, str], runs: Runs) -> str:
        values = ",".join(f'"{v}"],'.join(self.stamps[r.start:r.stop]) + f'"{v}"]'
                          for r, v in runs if r)
        return f'{{"metric":{json.dumps(metric)},"values":[{values}]}}'

    def answer(self, query: str, a: int, b: int) -> list[str]:
        kind = next(k for k, pattern in KINDS if re.search(pattern, query))
        return getattr(self, kind)(a, b)

    def info(self, a: int, b: int) -> list[str]:
        out = []
        for p in self.fleet.present(a, b):
            base = {"namespace": p.namespace, "pod": p.name, "uid": p.uid, "priority_class": ""}
            for node, lo, hi in (("", p.pending_from, p.running_from - 1),
                                 (p.node, p.running_from, p.running_to)):
                steps = _range(lo, hi, a, b)
                if steps:
                    out.append(self._series({**base, "node": node}, [(steps, "1")]))
        return out

    def phase(self, a: int, b: int) -> list[str]:
        out = []
        for p in self.fleet.present(a, b):
            for phase, lo, hi in (("Pending", p.pending_from, p.running_from - 1),
                                  ("Running", p.running_from, p.running_to)):
                steps = _range(lo, hi, a, b)
                if steps:
                    out.append(self._series({"uid": p.uid, "phase": phase}, [(steps, "1")]))
        return out

    def _gpu_series(self, a: int, b: int, value) -> list[str]:
        out = []
        holders: dict[tuple[str, int], list[FakePod]] = {}
        for p in self.fleet.present(a, b):
            for g in p.gpus:
                holders.setdefault((p.node, g), []).append(p)
        for n, node in enumerate(self.fleet.nodes):
            dark = range(self.fleet.outage[node], self.fleet.outage[node] + HOUR_STEPS)
            for g in range(8):
                base = {"UUID": f"GPU-{n:04d}-{g}", "Hostname": node, "gpu": str(g),
                        "namespace": "gpu-operator", "pod": f"dcgm-exporter-{n:05d}"}
                held = sorted(holders.get((node, g), []), key=lambda p: p.running_from)
                free = [range(a, b + 1)]
                for p in held:
                    held_steps = _range(p.running_from, p.running_to, a, b)
                    steps = _minus([held_steps], dark)
                    free = _minus(free, held_steps)
                    if steps:
                        out.append(self._series({**base, "exported_namespace": p.namespace,
                                                 "exported_pod": p.name},
                                                [run for r in steps for run in value(p, r)]))
                idle = _minus(free, dark)
                if idle:
                    out.append(self._series(base, [run for r in idle for run in value(None, r)]))
        return out

    def peak(self, a: int, b: int) -> list[str]:
        return self._gpu_series(a, b, lambda p, r: p.util(r) if p else [(r, "0")])

    def count(self, a: int, b: int) -> list[str]:
        return self._gpu_series(a, b, lambda p, r: [(r, str(STEP // SCRAPE))])

    def _static(self, a: int, b: int, metric) -> list[str]:
        return [self._series(m, [(range(b, b + 1), v)]) for p in self.fleet.present(a, b)
                for m, v in [metric(p)] if m]

    def gpus(self, a: int, b: int) -> list[str]:
        return self._static(a, b, lambda p: ({"uid": p.uid, "resource": "nvidia_com_gpu"},
                                             str(len(p.gpus))))

    def owner(self, a: int, b: int) -> list[str]:
        return self._static(a, b, lambda p: ({"uid": p.uid, "owner_kind": p.owner[0],
                                              "owner_name": p.owner[1]}, "1")
                            if p.owner[0] != "<none>" else ({}, ""))

    def labels(self, a: int, b: int) -> list[str]:
        return self._static(a, b, lambda p: ({"__name__": "kube_pod_labels", "uid": p.uid,
                                              "namespace": p.namespace, "pod": p.name,
                                              "label_gpusteward_io_team": p.team}, "1"))

    def created(self, a: int, b: int) -> list[str]:
        return self._static(a, b, lambda p: ({"uid": p.uid}, f"{self.at(p.pending_from):.0f}"))

    def xid(self, a: int, b: int) -> list[str]:
        return []  # a healthy fleet: no GPU's DCGM_EXP_XID_ERRORS_TOTAL series exists

    def model(self, a: int, b: int) -> list[str]:
        return [self._series({"UUID": f"GPU-{n:04d}-{g}", "gpu": str(g), "Hostname": node,
                              "modelName": MODELS[n % 2]}, [(range(b, b + 1), "0")])
                for n, node in enumerate(self.fleet.nodes) for g in range(8)]


KINDS = [("xid", "DCGM_EXP_XID_ERRORS_TOTAL"),
         ("info", "kube_pod_info"), ("phase", "kube_pod_status_phase"),
         ("gpus", "kube_pod_container_resource_requests"), ("owner", "kube_pod_owner"),
         ("labels", "kube_pod_labels"), ("created", "kube_pod_created"), ("model", "modelName"),
         # by the DCGM selector inside, whatever wraps it (core/vocabulary.py's union)
         ("count", r"count_over_time\(DCGM"), ("peak", r"max_over_time\(DCGM")]


def serve(answers: Answers, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the base class's name
            url = urllib.parse.urlparse(self.path)
            if url.path == "/-/ready":
                return self._send(b"ready")
            q = urllib.parse.parse_qs(url.query)
            if url.path == "/api/v1/query":  # the left-closed probe: answered as 3.x would
                assert q["query"][0] == LEFT_CLOSED_PROBE, q
                return self._send(b'{"status":"success","data":{"resultType":"vector",'
                                  b'"result":[{"metric":{},"value":[0,"1"]}]}}')
            a = round((float(q["start"][0]) - answers.start) / STEP)
            b = round((float(q["end"][0]) - answers.start) / STEP)
            series = answers.answer(q["query"][0], a, b)
            body = ('{"status":"success","data":{"resultType":"matrix","result":['
                    + ",".join(series) + "]}}")
            return self._send(body.encode())

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--days", type=float, default=7)
    p.add_argument("--end", type=float, required=True)
    args = p.parse_args()
    steps = int(args.days * 86400 // STEP) + 1
    start = args.end - (steps - 1) * STEP
    serve(Answers(Fleet(args.gpus, steps), start), args.port)


if __name__ == "__main__":
    main()
