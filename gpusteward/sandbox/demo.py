"""`make demo`: gpusteward placing a mixed GPU workload on a local sandbox cluster.

Starts the sandbox (building the control plane on first use), runs the extender behind the real
kube-scheduler, submits training, inference and experiment pods with card preferences and
different utilizations -- on whole GPUs, on MIG slices of the MIG-mixed A100 node, on replicas
of the time-sliced T4 node and on H200s that NVIDIA's DRA driver serves (a ResourceSlice, no
device plugin) -- and shows where each pod landed and why. Set KEEP=1 to leave the
sandbox running afterwards; ``--with kueue`` (``make demo WITH=kueue``) adds a Kueue Job and a
notebook reclaimed the native way (gpusteward/sandbox/native.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gpusteward.adapters.dra import RESOURCE_API
from gpusteward.core.cards import parse_card_types, preference_rank
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.drawire import WireSlice, slice_devices
from gpusteward.core.fleet import FleetStore
from gpusteward.core.kubewire import WireNode, to_node
from gpusteward.core.model import Node
from gpusteward.core.sharing import physical
from gpusteward.sandbox import chart, native
from gpusteward.sandbox.build import SandboxBuildError
from gpusteward.sandbox.cluster import Sandbox, SandboxConfig
from gpusteward.sandbox.commands import default_state_dir
from gpusteward.sandbox.fleet import DEFAULT_FLEET, GPU_RESOURCES, Fleet, Pool
from gpusteward.sandbox.kubehttp import KubeHTTP, wait_for
from gpusteward.sandbox.procs import SandboxError
from gpusteward.sandbox.receiver import Receiver
from gpusteward.sandbox.renderers import RendererBuildError, ensure_renderers
from gpusteward.sandbox.simulator import UTIL_ANNOTATION

NS = "demo"


@dataclass(frozen=True)
class Job:
    name: str
    cls: str
    gpus: int
    cards: str | None
    util: str  # what the simulator makes its GPUs read
    resource: str = "nvidia.com/gpu"
    shared: bool = False  # tolerates the time-sliced node's taint


MIG_SLICE = "nvidia.com/mig-1g.10gb"
TIME_SLICED_TAINT = "gpusteward.io/time-sliced"

# First the long-running background load, then pods whose placement shows the rules at work;
# then MIG slices, and replicas of the time-sliced T4s: four saturate its GPU 0 together, the
# idle notebook gets GPU 1 to itself.
WORKLOAD = [
    Job("llm-pretrain", "training", 8, "NVIDIA-H100*", "97"),
    Job("vision-finetune", "training", 4, "NVIDIA-H100*,NVIDIA-A100*", "88"),
    Job("notebook-alice", "experiment", 1, "NVIDIA-L4", "0"),
    Job("chat-serving-0", "inference", 1, "NVIDIA-L4,NVIDIA-A100*", "35"),
    Job("chat-serving-1", "inference", 1, "NVIDIA-L4,NVIDIA-A100*", "35"),
    Job("chat-serving-2", "inference", 1, "NVIDIA-L4,NVIDIA-A100*", "35"),
    Job("ranking-batch", "batch", 4, None, "70"),
    Job("speech-finetune", "training", 4, "NVIDIA-H100*,NVIDIA-A100*", "91"),
    Job("notebook-bob", "experiment", 1, None, "0"),
    Job("mig-serving", "inference", 1, "NVIDIA-A100*", "75", MIG_SLICE),
    Job("mig-notebook", "experiment", 1, None, "0", MIG_SLICE),
    *(Job(f"t4-infer-{i}", "inference", 1, "Tesla-T4", "25", shared=True) for i in range(4)),
    Job("t4-notebook", "experiment", 1, "Tesla-T4", "0", shared=True),
    # nvidia.com/gpu on the DRA pool: the driver's DeviceClass serves it (KEP-5004).
    Job("dra-serving", "inference", 2, "NVIDIA-H200", "60"),
    Job("dra-notebook", "experiment", 1, "NVIDIA-H200", "0"),
]
# The default fleet plus a DRA pool: H200s published as NVIDIA's DRA driver publishes them.
DEMO_FLEET = Fleet(pools=[*DEFAULT_FLEET.pools, Pool(
    name="h200-dra", product="NVIDIA-H200", count=1, gpus=4, memory_mi_b=143771, dra=True)])


def manifest(job: Job) -> dict[str, Any]:
    annotations = {UTIL_ANNOTATION: job.util}
    if job.cards:
        annotations["gpusteward.io/card-types"] = job.cards
    tolerations = [{"key": TIME_SLICED_TAINT, "operator": "Exists",
                    "effect": "NoSchedule"}] if job.shared else []
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": job.name, "labels": {"gpusteward.io/class": job.cls,
                                                  "gpusteward.io/team": "demo"},
                     "annotations": annotations},
        "spec": {"terminationGracePeriodSeconds": 1, "tolerations": tolerations, "containers": [{
            "name": "main", "image": "registry.invalid/cuda-job:1",
            "resources": {"limits": {job.resource: str(job.gpus)}}}]},
    }


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.load(resp)


def node_utilization(prometheus_url: str) -> dict[str, float]:
    # Engine activity: MIG instances report no DCGM_FI_DEV_GPU_UTIL.
    query = "100 * avg by (Hostname) (DCGM_FI_PROF_GR_ENGINE_ACTIVE)"
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as resp:
        result = json.load(resp)["data"]["result"]
    return {r["metric"]["Hostname"]: float(r["value"][1]) for r in result}


def explain(box: Sandbox, job: Job, nodes: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    """What the extender thinks of every node for this pod (no uid: nothing is reserved): the
    one the scheduler calls, a host process or the installed chart's Service."""
    pod = manifest(job)
    url = box.cfg.scheduler_extender_url or box.extender_url
    verdict = _post(f"{url}/filter", {"Pod": pod, "NodeNames": nodes})
    rejected = {**verdict["FailedNodes"], **verdict["FailedAndUnresolvableNodes"]}
    scores = _post(f"{url}/prioritize", {"Pod": pod, "NodeNames": nodes})
    return {e["Host"]: e["Score"] for e in scores}, rejected


def _node_of(api: KubeHTTP, pod: str) -> str | None:
    return api.get(f"/api/v1/namespaces/{NS}/pods/{pod}")["spec"].get("nodeName")


def fleet_nodes(api: KubeHTTP) -> dict[str, Node]:
    """The nodes as gpusteward sees them: device-plugin allocatable plus DRA devices."""
    store = FleetStore()
    dra = DraFleet(store)
    dra.replace_slices({o["metadata"]["name"]: slice_devices(msgspec.convert(o, WireSlice),
                                                              dra.driver)
                        for o in api.get(f"{RESOURCE_API}/resourceslices")["items"]})
    dra.replace_all([to_node(msgspec.convert(o, WireNode), GPU_RESOURCES)
                     for o in api.get("/api/v1/nodes")["items"]], [])
    return store.nodes


def run_workload(box: Sandbox) -> list[dict[str, Any]]:
    api = box.api()
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": NS}})
    objects = fleet_nodes(api)
    nodes = sorted(objects)
    rows = []
    for job in WORKLOAD:
        util = node_utilization(box.prometheus_url)
        scores, rejected = explain(box, job, nodes)
        api.create(f"/api/v1/namespaces/{NS}/pods", manifest(job))
        node = wait_for(f"{job.name} to be scheduled",
                        partial(_node_of, api, job.name), timeout=60)
        rows.append({"pod": job.name, "class": job.cls, "gpus": job.gpus,
                     "physical": physical({job.resource: job.gpus}, job.gpus, objects[node]),
                     "wants": job.cards or "(class tiers)", "node": node,
                     "card": objects[node].product or "", "node_util": util.get(node, 0.0),
                     "score": scores.get(node), "best_other": max(
                         (s for n, s in scores.items() if n != node and n not in rejected),
                         default=None),
                     "rejected": len(rejected)})
        # Let the new pod's GPUs show up in telemetry before the next decision.
        time.sleep(2.5)
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = (f"{'pod':<17}{'class':<11}{'gpus':>5}  {'wants':<27}{'landed on':<12}"
              f"{'card':<23}{'util':>5}{'score':>6}{'next':>5}{'ruled out':>10}")
    print(header)
    print("-" * len(header))
    for r in rows:
        other = "-" if r["best_other"] is None else str(r["best_other"])
        gpus = f"{r['physical']:.2g}" if r["physical"] != r["gpus"] else str(r["gpus"])
        print(f"{r['pod']:<17}{r['class']:<11}{gpus:>5}  {r['wants']:<27}{r['node']:<12}"
              f"{r['card']:<23}{r['node_util']:>4.0f}%{r['score']:>6}{other:>5}"
              f"{r['rejected']:>10}")


def summary(rows: list[dict[str, Any]]) -> list[str]:
    def accepted(r: dict[str, Any]) -> bool:
        patterns = parse_card_types(None if r["wants"].startswith("(") else r["wants"])
        return not patterns or preference_rank(r["card"], patterns) is not None

    ok = sum(accepted(r) for r in rows)
    top = sum(r["best_other"] is None or r["score"] >= r["best_other"] for r in rows)
    return [
        f"{len(rows)} GPU pods placed by the real kube-scheduler with the gpusteward extender.",
        f"{ok}/{len(rows)} landed on a card they accept; "
        f"{top}/{len(rows)} on a node gpusteward scored highest among those allowed.",
        "score = gpusteward's 0-10 placement score (card fit, live GPU load, packing, health);",
        "next = best score among the other allowed nodes; util = node GPU utilization before;",
        "gpus = physical GPUs: a 1g.10gb MIG slice is 1/7 of an A100, a T4 replica 1/4 of a T4;",
        "the H200s are served by Dynamic Resource Allocation (ResourceSlice, DeviceClass).",
    ]


def gpu_events(box: Sandbox) -> list[dict[str, Any]]:
    items = box.api().get(f"/api/v1/namespaces/{NS}/events")["items"]
    return sorted((e for e in items if e.get("reason", "").startswith("GPU")),
                  key=lambda e: (e.get("lastTimestamp") or "", e["metadata"]["name"]))


def watch_reclaimer(box: Sandbox, rows: list[dict[str, Any]],
                    timeout: float = 150) -> tuple[float, set[str]]:
    """Print the reclaimer's Events as they come; return the physical GPUs it gave back and the
    pods it reclaimed."""
    idle = {j.name for j in WORKLOAD if j.util == "0"}
    gpus = {r["pod"]: r["physical"] for r in rows}
    seen: set[str] = set()
    reclaimed: set[str] = set()
    started = time.monotonic()
    while time.monotonic() - started < timeout and not idle <= reclaimed:
        for e in gpu_events(box):
            if e["metadata"]["name"] in seen:
                continue
            seen.add(e["metadata"]["name"])
            pod = e["involvedObject"]["name"]
            print(f"  +{time.monotonic() - started:5.1f}s  {pod:<17}{e['reason']:<16}"
                  f"{e['message'][:90]}")
            if e["reason"] == "GPUReclaimed":
                reclaimed.add(pod)
        time.sleep(1)
    return sum(gpus[p] for p in reclaimed), reclaimed


def notifying(box: Sandbox, receiver: Receiver) -> Path:
    """The sandbox policy plus a JSON webhook sink at the local receiver, its URL in a file as
    a mounted Secret would hold it."""
    policy = yaml.safe_load(Path(box.cfg.policy).read_text())
    policy["notifications"] = {"sinks": [{"name": "demo", "format": "json", "urlFile": str(
        receiver.url_file(box.cfg.state_dir, "webhook-url"))}]}
    path = box.cfg.state_dir / "policy-with-notifications.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def print_notifications(receiver: Receiver, wait: float = 20) -> bool:
    """What the webhook receiver got; the reclaims' messages may trail their Events a little."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not any(
            b["event"] == "reclaimed" for b in receiver.bodies()):
        time.sleep(1)
    bodies = receiver.bodies()
    print(f"\nNotifications received by a webhook on {receiver.url} ({len(bodies)}):\n")
    for b in bodies:
        print(f"  {b['event']:<10}{b['workload']:<28} team={b['team']:<8}"
              f"deadline={b.get('deadline') or '-'}")
    if bodies:
        print(f"\n  e.g. snooze: {bodies[0]['snooze']}\n       back:   {bodies[0]['restore']}")
    return any(b["event"] == "reclaimed" for b in bodies)


def print_report(box: Sandbox) -> bool:
    """The fleet report over the demo's last minutes: allocated vs really used GPUs."""
    print("\nFleet report (gpusteward report --window 3m --by card):\n", flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "gpusteward", "report", f"--policy={box.cfg.policy}",
         "--window=3m", "--by=card", f"--kubeconfig={box.kubeconfig}",
         f"--prometheus-url={box.prometheus_url}"], text=True, timeout=120)
    return out.returncode == 0


def print_whatif(box: Sandbox, since: float) -> bool:
    """What-if over the demo's own history: the policy it ran with, and one that waits longer."""
    patient = Path(tempfile.mkdtemp(prefix="gpusteward-demo-")) / "patient.yaml"
    policy = yaml.safe_load(Path(box.cfg.policy).read_text())
    policy["reclaim"]["idle"]["window"] = "60s"
    patient.write_text(yaml.safe_dump(policy))
    window = max(60, int(time.time() - since))
    print(f"\nWhat-if over the demo's history (gpusteward whatif --window {window}s, the sandbox "
          "policy beside one with a 60 s idle window):\n", flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "gpusteward", "whatif", f"--policy={box.cfg.policy}",
         f"--policy={patient}", f"--window={window}s", "--top=5",
         f"--prometheus-url={box.prometheus_url}"], text=True, timeout=300)
    return out.returncode == 0


def start_sandbox(state: Path, keep: bool, native_too: bool = False,
                  with_chart: bool = False) -> Sandbox:
    """The demo's sandbox. Kept (KEEP=1), its processes outlive the demo, each on record in
    ``state`` as it starts, for `gpusteward sandbox down`. With the chart: a real node for its
    pods, and no extender process (the chart's runs as pods)."""
    return Sandbox(SandboxConfig(state_dir=state, fleet=DEMO_FLEET, with_extender=not with_chart,
                                 real_nodes=1 if with_chart else 0, detach=keep,
                                 with_controllers=("kueue",) if native_too else (),
                                 log=lambda m: print(f"  {m}", flush=True))).start()


def install_chart(box: Sandbox) -> tuple[chart.Helm, Path]:
    """`helm install` of the chart, its reclaimer off until the workload is placed;
    the scheduler then calls the extender pods through their Service."""
    helm = chart.Helm(ensure_renderers() / "helm", box.kubeconfig)
    values = chart.sandbox_values(box)
    path = chart.write_values(box, values)
    print(f"\nInstalling the chart (helm install {chart.RELEASE} deploy/helm/gpusteward "
          f"-n {chart.NAMESPACE} -f {path} --set reclaimer.enabled=false --wait)...", flush=True)
    helm.install(path, "--set=reclaimer.enabled=false")
    url = chart.use_chart_extender(box)
    jobs = chart.scrape_service_monitors(box, helm, path)
    for line in helm.run("status", chart.RELEASE).stdout.splitlines()[:6]:
        print(f"  {line}")
    print(f"  the scheduler calls the extender Service at {url}; Prometheus scrapes "
          f"{', '.join(jobs)}", flush=True)
    return helm, path


def start_chart_reclaimer(helm: chart.Helm, values: Path) -> None:
    print("\nTurning the chart's reclaimer on, 2 replicas (helm upgrade --reuse-values); "
          "one leads\nthrough its Lease. The sandbox policy runs it in enforce mode with a 15 s "
          "idle window\nand a 4 s grace (shipped default: observe, 30 min, 15 min).\n",
          flush=True)
    helm.upgrade(values, "--reuse-values", "--set=reclaimer.enabled=true")


def start_reclaimer(box: Sandbox) -> Receiver:
    """The reclaimer, started last, as one of the sandbox's processes (so on its record too),
    with its notifications going to a webhook receiver in this process."""
    receiver = Receiver()
    box.cfg.policy = notifying(box, receiver)
    box.start_reclaimer()
    return receiver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpusteward.sandbox.demo")
    parser.add_argument("--with", dest="extra", choices=["kueue", "chart"], action="append",
                        default=[],
                        help="kueue: also reclaim a Kueue Job and a notebook the native way "
                             "(starts the real Kueue, built from its Go module on first use); "
                             "chart: run gpusteward as the Helm chart installs it, as pods on a "
                             "real node from the image `make image` builds")
    extra = parser.parse_args(argv).extra
    native_too, with_chart = "kueue" in extra, "chart" in extra
    keep = os.environ.get("KEEP") == "1"
    state = default_state_dir() if keep else Path(tempfile.mkdtemp(prefix="gpusteward-demo-"))
    if keep and (state / "state.json").exists():
        print(f"a sandbox already runs from {state}; run `gpusteward sandbox down` first",
              file=sys.stderr)
        return 1
    print("Starting the sandbox (the first run builds Kubernetes from Go modules: ~6 min)...")
    try:
        box = start_sandbox(state, keep, native_too, with_chart)
        installed = install_chart(box) if with_chart else None
    except (SandboxBuildError, SandboxError, TimeoutError, chart.HelmError,
            RendererBuildError) as e:
        print(f"demo failed to start the sandbox: {e}", file=sys.stderr)
        return 1
    try:
        print("\nPlacing a mixed GPU workload, one pod at a time:\n")
        since = time.time()
        rows = run_workload(box)
        print_rows(rows)
        print()
        print("\n".join(summary(rows)))
        if native_too:
            print(f"\nIn namespace {native.NS}: an idle Kueue Job holding its queue's one GPU, "
                  "a busy\nhigher-priority one waiting for it, and an idle Kubeflow notebook.")
            native.setup(box.api())
        receiver = None
        if installed:
            start_chart_reclaimer(*installed)
        else:
            print("\nStarting the reclaimer. The sandbox policy runs it in enforce mode with a "
                  "15 s\nidle window and a 4 s grace (shipped default: observe, 30 min, 15 min)."
                  "\n")
            receiver = start_reclaimer(box)
        returned, reclaimed = watch_reclaimer(box, rows)
        allocated = sum(r["physical"] for r in rows)
        idle = {j.name for j in WORKLOAD if j.util == "0"}
        print(f"\nReclaimer: {returned:.3g} of {allocated:.3g} allocated GPUs were held by idle "
              f"pods and given back ({', '.join(sorted(reclaimed))}); busy pods were left alone.")
        native_ok = True
        if native_too:
            print(f"\nReclaimed the native way ({native.NS}):\n")
            native_ok = native.watch(box.api())
        ok = all(r["node"] for r in rows) and reclaimed == idle and native_ok
        if receiver is not None:  # the chart's pods cannot reach a receiver in this process
            ok = print_notifications(receiver) and ok
        ok = print_report(box) and ok
        ok = print_whatif(box, since) and ok
    finally:
        if keep:
            print(f"\nThe sandbox keeps running (state in {state}). Explore it with:\n"
                  f"  eval $(.venv/bin/gpusteward sandbox env)\n"
                  f"  curl -s \"$PROMETHEUS_URL/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL\"\n"
                  f"Stop it with: .venv/bin/gpusteward sandbox down")
        else:
            box.stop()
            print("\nSandbox stopped.")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
