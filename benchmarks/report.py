"""Turn benchmarks/results/*.json into PNG plots and benchmarks/RESULTS.md.

    python benchmarks/report.py
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def revision() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=HERE)
    return out.stdout.strip() or "unknown"


def plot_extender(ext: dict) -> str:
    rows = [r for r in ext["results"] if r.get("mode") == "names" and "server" in r]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, verb in zip(axes, ("filter", "prioritize"), strict=True):
        data = sorted((r["nodes"], r) for r in rows if r["verb"] == verb)
        nodes = [n for n, _ in data]
        ax.plot(nodes, [r["server"]["p99_ms"] for _, r in data], "o-", label="server p99")
        ax.plot(nodes, [r["round_trip"]["p50_ms"] for _, r in data], "s-",
                label="round trip p50")
        ax.plot(nodes, [r["floor_round_trip"]["p50_ms"] for _, r in data], "^--",
                label="decode+encode floor, round trip p50")
        ax.axhline(2.0, color="grey", linestyle=":", label="target: server p99 2 ms")
        ax.set_xscale("log")
        ax.set_title(f"{verb} (nodeCacheCapable: true)")
        ax.set_xlabel("candidate nodes")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "extender.png", dpi=110)
    plt.close(fig)
    return "extender.png"


def plot_scheduler(sched: dict) -> str:
    """Median pods/s per setup and fleet size, the bars' whiskers spanning every repetition."""
    sizes = sched["sizes"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        rows = size["summary"][::-1]
        values = [r["pods_per_second"] for r in rows]
        spread = [[r["pods_per_second"] - r["min"] for r in rows],
                  [r["max"] - r["pods_per_second"] for r in rows]]
        colours = ["#27a" if r["setup"].startswith(("b", "c")) else
                   "#aaa" if r["setup"].startswith("n") else "#555" for r in rows]
        ax.barh([f"({r['setup']}) {r['label']}" for r in rows], values, xerr=spread,
                color=colours, capsize=3)
        ax.set_xlabel("pods bound per second (median, whiskers: min-max)")
        ax.set_title(f"{size['nodes']} kwok nodes, {sched['reps']} repetitions")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "scheduler.png", dpi=110)
    plt.close(fig)
    return "scheduler.png"


def _num(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def extender_section(ext: dict) -> list[str]:
    lines = ["## Extender latency (`python benchmarks/bench_extender.py`)", "",
             f"Machine: {ext['machine']}, Python {ext['python']}, {ext['date']}. "
             "Server-side = decode + answer in-process; round trip = loopback HTTP to the real app "
             "vs a bare aiohttp server that only `json.loads` the same body and `json.dumps` a "
             "same-size reply. Medians and p99 of one run.", "",
             "| nodes | mode | verb | server p50 ms | server p99 ms | round trip p50 ms | "
             "floor p50 ms | ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in ext["results"]:
        if "server" not in r:
            continue
        rt = _num(r.get("round_trip", {}).get("p50_ms"), 3)
        fl = _num(r.get("floor_round_trip", {}).get("p50_ms"), 3)
        lines.append(
            f"| {r['nodes']} | {r['mode']} | {r['verb']} | {r['server']['p50_ms']:.3f} | "
            f"{r['server']['p99_ms']:.3f} | {rt} | {fl} | {_num(r.get('ratio_p50'), 2)} |")
    lines += ["", "| nodes | full-mode decode (ours) ms | json.loads ms | speedup |",
              "|---|---|---|---|"]
    lines += [f"| {r['nodes']} | {r['decode']['typed_ms']:.1f} | {r['decode']['json_loads_ms']:.1f}"
              f" | {r['decode']['speedup']:.1f}x |" for r in ext["results"] if "decode" in r]
    lines += ["", "| nodes | prioritize requests/s, 16 concurrent clients, one server process |",
              "|---|---|"]
    lines += [f"| {r['nodes']} | {r['requests_per_second']:.0f} |"
              for r in ext["results"] if "requests_per_second" in r]
    return lines + ["", "![extender latency](extender.png)", ""]


def scheduler_section(sched: dict) -> list[str]:
    lines = ["## Scheduler throughput (`python benchmarks/bench_scheduler.py`)", "",
             f"Real kube-scheduler v1.36.3 (each fleet size gives the date of its run); "
             f"{sched['machine']}. Each setup ran "
             f"{sched['reps']} times, alternating the order; the table gives the median with the "
             "spread of the repetitions. The scheduler is stopped, the pods are created, the "
             "scheduler is started; rate = pods bound after it is ready / time to bind the last. "
             "(n) and (n') are the protocol floor: a no-op extender in Go on the upstream "
             "`extender/v1` types; (a') is the scheduler alone with the batching that 1.36 turns "
             "off for every profile with an extender also off. Attempt latency: the scheduler's "
             "own `scheduler_scheduling_attempt_duration_seconds` (bucket upper bounds).", ""]
    for size in sched["sizes"]:
        when = f", {size['date']}" if "date" in size else ""
        scrape = f", scraped every {size['scrape_s']} s" if "scrape_s" in size else ""
        lines += [f"{size['nodes']} kwok GPU nodes ({size['gpus']} GPUs{scrape}), "
                  f"{size['pods']} pods{when}:",
                  "", "| setup | pods/s (median) | spread | /(a) | /(a') | /floor | "
                  "attempt p50 ms | attempt p99 ms |", "|---|---|---|---|---|---|---|---|"]
        for r in size["summary"]:
            floor = (f"{r['ratio_to_floor']:.2f} to ({r['floor']})" if "floor" in r else "")
            lines.append(
                f"| ({r['setup']}) {r['label']} | {r['pods_per_second']:.1f} | "
                f"{r['min']:.1f}–{r['max']:.1f} | {r['ratio_to_a']:.2f} | "
                f"{r['ratio_to_a_prime']:.2f} | {floor} | {r['attempt_p50_ms']:.0f} | "
                f"{r['attempt_p99_ms']:.0f} |")
        lines.append("")
        lines += time_split(size)
    return [*lines, "![scheduler throughput](scheduler.png)", ""]


def time_split(size: dict) -> list[str]:
    """Where each setup's time went: every sandbox process's CPU per pod while it ran, and the
    extender's own time per call (its request-duration histogram)."""
    rows = [r for r in size["summary"] if r.get("cpu_ms_per_pod")]
    if not rows:
        return []
    lines = [f"Where the time went at {size['nodes']} nodes: wall ms per pod (1 / rate) and CPU "
             "ms per pod of each process over the same span (medians of the repetitions; two "
             "cores give at most 2 CPU ms per wall ms); gpusteward's server-side ms per filter "
             "or prioritize call from its own histogram.", "",
             "| setup | wall ms/pod | scheduler | extender | apiserver | etcd | kwok | the rest "
             "| extender ms/call |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cpu = dict(r["cpu_ms_per_pod"])
        picked = [cpu.pop(name, 0.0) for name in ("scheduler", "apiserver", "etcd", "kwok")]
        ext = cpu.pop("noopextender", 0.0) if r["setup"].startswith("n") else 0.0
        ext += cpu.pop("extender", 0.0) if r["setup"][0] in "bc" else 0.0
        per_call = r.get("extender_ms_per_call")
        lines.append(f"| ({r['setup']}) | {1000 / r['pods_per_second']:.1f} | {picked[0]:.1f} | "
                     f"{ext:.1f} | {picked[1]:.1f} | {picked[2]:.1f} | {picked[3]:.1f} | "
                     f"{sum(cpu.values()):.1f} | "
                     f"{'' if per_call is None else f'{per_call:.2f}'} |")
    return [*lines, ""]


def reclaimer_section(rec: dict) -> list[str]:
    lines = ["## Reclaimer scale (`python benchmarks/bench_reclaimer.py`)", "",
             f"{rec['date']}. Decision = `plan()` on a synthetic snapshot, median of 5, peak RSS "
             "of a fresh process; cycle = one snapshot read against the sandbox's real API "
             "server and Prometheus plus the decision, in a fresh process (its peak RSS is the "
             "reclaimer's), with every pod placed by the real scheduler on kwok nodes and "
             "sampled for a full idle window; floor = the same read + decide with nothing "
             "else on the cores: LISTs paged as the API server pages them but served without "
             "its cost (benchmarks/listserver.py), evidence from a real Prometheus loaded with "
             "the history (promtool backfill).", "",
             "| GPU pods | decision ms | peak RSS MB | actions |", "|---|---|---|---|"]
    lines += [f"| {d['pods']} | {d['decision_ms']:.0f} | {d['peak_rss_mb']:.0f} | {d['actions']} |"
              for d in rec["decision"]]
    if rec.get("floor"):
        lines += ["", "| GPU pods, floor | Prometheus | read s | read, our CPU s | Prometheus CPU "
                  "s | decide s | read + decide s | peak RSS MB | API calls | PromQL queries |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {f['pods']} | {f.get('prometheus', '2')} | {f['read_s']:.2f} | "
                  f"{f['read_cpu_s']:.2f} | "
                  f"{f['prometheus_cpu_s']:.2f} | {f['decide_s']:.3f} | "
                  f"{f['read_s'] + f['decide_s']:.2f} | {f['peak_rss_mb']:.0f} | "
                  f"{f['api_calls']} | {f['promql_queries']} |" for f in rec["floor"]]
    lines += ["", "| GPU pods in sandbox | scrape s | read s | read, our CPU s | decide s | "
              "read + decide s | peak RSS MB | API calls | PromQL queries | pods with evidence | "
              "idle | sandbox CPU during the cycle, s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_cycle_row(c) for c in rec["cycle"]]
    return lines + ["", "![reclaimer cycle](reclaimer.png)", ""]


def _cycle_row(c: dict) -> str:
    cpu = f"{c['read_cpu_s']:.2f}" if "read_cpu_s" in c else ""
    return (f"| {c['pods']} | {c.get('scrape_s', 1)} | {c['read_s']:.2f} | {cpu} | "
            f"{c['decide_s']:.3f} | {c['read_s'] + c['decide_s']:.2f} | "
            f"{c.get('peak_rss_mb', 0):.0f} | {c['api_calls']} | {c['promql_queries']} | "
            f"{c.get('pods_with_evidence', '')} | {c.get('idle_pods_seen', '')} | "
            f"{_busiest(c.get('sandbox_cpu_s', {}))} |")


def _busiest(cpu: dict[str, float]) -> str:
    """The sandbox processes that used the most CPU during a cycle, busiest first."""
    ranked = sorted(cpu.items(), key=lambda kv: -kv[1])[:4]
    return ", ".join(f"{name} {used:.1f}" for name, used in ranked if used >= 0.05)


def plot_reclaimer(rec: dict) -> str:
    cycle = sorted(rec["cycle"], key=lambda c: c["pods"])
    pods = [c["pods"] for c in cycle]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].plot(pods, [c["read_s"] + c["decide_s"] for c in cycle], "o-", label="read + decide")
    axes[0].plot(pods, [c["read_s"] for c in cycle], "s--", label="read")
    floor = sorted(rec.get("floor", []), key=lambda f: f["pods"])
    floor = [f for f in floor if f.get("prometheus") == floor[0].get("prometheus")]  # one major
    if floor:
        axes[0].plot([f["pods"] for f in floor], [f["read_s"] + f["decide_s"] for f in floor],
                     "^-", label="read + decide, floor")
        axes[1].plot([f["pods"] for f in floor], [f["peak_rss_mb"] for f in floor], "^-",
                     label="peak RSS, floor")
    axes[0].axhline(2.0, color="grey", linestyle=":", label="target 2 s at 20,000")
    axes[0].set_ylabel("s")
    axes[1].plot(pods, [c.get("peak_rss_mb", 0) for c in cycle], "o-", label="peak RSS")
    axes[1].axhline(300, color="grey", linestyle=":", label="target 300 MB at 20,000")
    axes[1].set_ylabel("MB")
    return _saved(fig, axes, ("one reclaimer cycle", "reclaimer memory"), "GPU pods",
                  "reclaimer.png")


def telemetry_section(tel: dict) -> list[str]:
    lines = ["## Telemetry cost (`python benchmarks/bench_telemetry.py`)", "",
             f"{tel['date']}: one extender refresh ({tel['results'][0]['queries_per_refresh']} "
             "PromQL queries, median of 10) against one real Prometheus holding every GPU's "
             "history, in a fresh process whose peak RSS is given.", "",
             "| nodes | GPUs | refresh p50 ms | max ms | JSON MB | MB on the wire (gzip) | "
             "peak RSS MB | largest queries (JSON MB) |", "|---|---|---|---|---|---|---|---|"]
    for r in tel["results"]:
        top = sorted(r["bytes_by_query"].items(), key=lambda kv: -kv[1])[:3]
        rss = f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else "—"
        lines.append(f"| {r['nodes']} | {r['gpus']} | {r['refresh_p50_ms']:.0f} | "
                     f"{r['refresh_max_ms']:.0f} | {r['bytes_per_refresh'] / 1e6:.2f} | "
                     f"{r['wire_bytes_per_refresh'] / 1e6:.2f} | {rss} | "
                     f"{', '.join(f'{k} {v / 1e6:.2f}' for k, v in top)} |")
    if tel.get("note"):
        lines += ["", f"Note: {tel['note']}."]
    return [*lines, *majors_table(tel), *thanos_table(tel), "",
            "![telemetry refresh](telemetry.png)", ""]


def majors_table(tel: dict) -> list[str]:
    """The same refresh on each Prometheus major of the run (``--prometheus 3 2``)."""
    rows = [r for r in tel["results"] if len(r.get("by_prometheus", {})) > 1]
    if not rows:
        return []
    majors = list(rows[0]["by_prometheus"])
    head = " | ".join(f"Prometheus {m}: p50 ms | CPU s per refresh" for m in majors)
    lines = ["", "The same refresh on each Prometheus major, in the same run (3: built from its "
             "Go module; 2: Debian's 2.42).", "", f"| nodes | GPUs | {head} |",
             "|---|---|" + "---|---|" * len(majors)]
    for r in rows:
        cells = " | ".join(f"{b['refresh_p50_ms']:.0f} | {b['cpu_s_per_refresh']['prometheus']:.2f}"
                           for b in (r["by_prometheus"][m] for m in majors))
        lines.append(f"| {r['nodes']} | {r['gpus']} | {cells} |")
    return lines


def thanos_table(tel: dict) -> list[str]:
    """The same refresh through a Thanos querier over two Prometheus shards (``--thanos``)."""
    rows = [r for r in tel["results"] if "thanos" in r]
    if not rows:
        return []
    lines = ["", "The same refresh through a Thanos querier (v0.40.1, built from its Go module) "
             "over two Prometheus instances holding half the fleet each behind their sidecars, "
             "in the same run; CPU seconds per refresh of each process (one Prometheus: its "
             "own).", "",
             "| nodes | GPUs read | one Prometheus p50 ms | Thanos p50 ms | ratio | Thanos max ms "
             "| Thanos MB on the wire | CPU s per refresh: one Prometheus | querier | sidecars "
             "| Prometheus shards |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["thanos"]
        cpu = t["cpu_s_per_refresh"]
        part = {k: sum(v for name, v in cpu.items() if name.startswith(k))
                for k in ("querier", "sidecar", "prometheus")}
        lines.append(f"| {r['nodes']} | {t['gpus_read']} | {r['refresh_p50_ms']:.0f} | "
                     f"{t['refresh_p50_ms']:.0f} | {t['refresh_p50_ms'] / r['refresh_p50_ms']:.2f}"
                     f" | {t['refresh_max_ms']:.0f} | {t['wire_bytes_per_refresh'] / 1e6:.2f} | "
                     f"{r['cpu_s_per_refresh']['prometheus']:.2f} | {part['querier']:.2f} | "
                     f"{part['sidecar']:.2f} | {part['prometheus']:.2f} |")
    return lines


def plot_telemetry(tel: dict) -> str:
    rows = sorted(tel["results"], key=lambda r: r["gpus"])
    gpus = [r["gpus"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].plot(gpus, [r["refresh_p50_ms"] / 1000 for r in rows], "o-", label="refresh p50")
    sharded = [r for r in rows if "thanos" in r]
    if sharded:
        axes[0].plot([r["gpus"] for r in sharded],
                     [r["thanos"]["refresh_p50_ms"] / 1000 for r in sharded], "s-",
                     label="through Thanos, 2 shards")
    axes[0].axhline(2.0, color="grey", linestyle=":", label="target 2 s at 40,000")
    axes[0].set_ylabel("s")
    axes[1].plot(gpus, [r["bytes_per_refresh"] / 1e6 for r in rows], "o-", label="JSON")
    axes[1].plot(gpus, [r["wire_bytes_per_refresh"] / 1e6 for r in rows], "s-",
                 label="on the wire (gzip)")
    axes[1].axhline(15, color="grey", linestyle=":", label="target 15 MB at 40,000")
    axes[1].set_ylabel("MB")
    measured = [r for r in rows if "peak_rss_mb" in r]
    axes[2].plot([r["gpus"] for r in measured], [r["peak_rss_mb"] for r in measured], "o-",
                 label="peak RSS")
    axes[2].set_ylabel("MB")
    return _saved(fig, axes, ("refresh time", "bytes per refresh", "memory"), "GPUs",
                  "telemetry.png")


def _saved(fig, axes, titles: tuple[str, ...], xlabel: str, name: str) -> str:
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / name, dpi=110)
    plt.close(fig)
    return name


def fleetview_section(fv: dict) -> list[str]:
    lines = ["## Fleet view on DRA vs the device plugin (`python benchmarks/bench_fleetview.py`)",
             "", f"{fv['date']}. The extender's list+watch view of the same fleet, its GPUs "
             "served by the device plugin or by NVIDIA's DRA driver (a ResourceSlice per node, "
             "a DeviceClass, an allocated claim per pod). Re-list = decode every LIST body and "
             "rebuild the view (median of 5); retained = the view's memory after the bodies "
             "are freed; event = one pod bound (on DRA also its claim allocated).", "",
             "| GPUs served by | nodes | GPUs | pods | LIST MB | re-list ms | retained MB | "
             "event µs |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['nodes']} | {r['gpus']} | {r['pods']} | "
              f"{sum(r['list_mb'].values()):.1f} | {r['relist_ms']:.0f} | "
              f"{r['retained_mb']:.1f} | {r['event_us']:.0f} |" for r in fv["results"]]
    if fv.get("memory"):
        lines += ["", "The extender's memory against fleet size, each in a fresh process that "
                  "imports the whole extender: nodes and pods from LIST pages of 500 (8 one-GPU "
                  "pods and 2 CPU pods a node, the CPU pods decoded and dropped as the watch "
                  "does), telemetry for every GPU, the placement view and the preemption book. "
                  "Peak includes the pages being decoded; settled is after.", "",
                  "| nodes | GPUs | pods listed | GPU pods | peak RSS MB | settled RSS MB |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {m['nodes']} | {m['gpus']} | {m['pods']} | {m['gpu_pods']} | "
                  f"{m['peak_rss_mb']:.0f} | {m['settled_rss_mb']:.0f} |" for m in fv["memory"]]
    return [*lines, ""]


def preempt_section(pre: dict) -> list[str]:
    """The preempt-only run (``--verbs preempt``): wall and CPU time beside each other, since
    it ran beside other work on the shared cores."""
    load = (f" Load average {pre['load'][0]:.1f} at the start, {pre['load'][1]:.1f} at the end "
            "(other work on the same cores)." if "load" in pre else "")
    lines = [f"### Preempt verb (`python {pre['command']}`)", "",
             f"Machine: {pre['machine']}, Python {pre['python']}, {pre['date']}.{load} Every node "
             "a candidate proposing two victims (a third of all pods idle); server-side = decode "
             "+ answer in-process, to the reply; the server frees the decoded request after "
             "the reply is written (the last column, not in the others).", "",
             "| candidates | mode | body MB | server p50 ms | server p99 ms | CPU p50 ms | "
             "CPU p99 ms | freed after, p50 ms |", "|---|---|---|---|---|---|---|---|"]
    for r in pre["results"]:
        s = r["server"]
        mode = "meta victims (nodeCacheCapable)" if r["mode"] == "names" else "full victims"
        freed = f"{s['freed_p50_ms']:.2f}" if "freed_p50_ms" in s else "in the others"
        lines.append(f"| {r['nodes']} | {mode} | {r['body_mb']:.2f} | {s['p50_ms']:.2f} | "
                     f"{s['p99_ms']:.2f} | {s['cpu_p50_ms']:.2f} | {s['cpu_p99_ms']:.2f} | "
                     f"{freed} |")
    return [*lines, ""]


def whatif_section(wi: dict) -> list[str]:
    lines = ["## What-if replay (`python benchmarks/bench_whatif.py`)", "",
             f"{wi['date']}, `{wi['command']}`. History read through the real adapter (range "
             "queries over HTTP, JSON decode, attribution) from benchmarks/whatif_prometheus.py "
             "standing in for Prometheus (a week of 1,000 GPUs does not backfill here; its own "
             "time to answer is in the wall time, not in our CPU), then replayed with the "
             "shipped defaults (60 s interval). Target: a week of 1,000 GPUs in <= 60 s and "
             "<= 1 GB RSS, queries bounded.", "",
             "| GPUs | days | cycles | pods | read s | replay s | wall s | our CPU s | "
             "peak RSS MB | PromQL queries | reclaims |", "|---|---|---|---|---|---|---|---|---|"
             "---|---|"]
    lines += [f"| {r['gpus']} | {r['days']:g} | {r['steps']} | {r['pods']} | {r['read_s']:.1f} | "
              f"{r['replay_s']:.1f} | {r['total_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['peak_rss_mb']:.0f} | {r['promql_queries']} | {r['reclaimed']} |"
              for r in wi["runs"]]
    return lines + [""]


def startup_section(st: dict) -> list[str]:
    """The commands a CI job or a pre-commit hook runs: before the start-up work (an earlier
    source tree run in the same rounds) and now, one table per bytecode mode."""
    lines = ["## Start-up (`python benchmarks/bench_startup.py`)", "",
             "Each command in a fresh process, the commands (and the earlier revision's, where "
             "measured) taking turns round after round; wall time around the process, peak RSS "
             "of the process itself; medians. `python -c pass` is the interpreter's own start "
             "(with the editable install's path hook). Target: <= 0.3 s and <= 40 MB each "
             "(issue 32).", ""]
    for run in st.values():
        sides = [(label, run[label]) for label in ("before", "now") if label in run]
        lines += [f"Bytecode {run['bytecode']}; {run['machine']}, Python {run['python']}, "
                  f"{run['date']}, `python {run['command']}`, {run['runs']} runs, load "
                  f"{run['load'][0]:.1f}-{run['load'][1]:.1f}, peak RSS from {run['rss_from']}; "
                  + ", ".join(f"{label}: revision {side['revision']}" for label, side in sides)
                  + ".", ""]
        pair = len(sides) == 2
        head = ["command", *(f"{label} s" for label, _ in sides), *(["ratio"] if pair else []),
                *(f"{label} peak RSS MB" for label, _ in sides), *(["ratio"] if pair else [])]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name in run["now"]["results"]:
            got = [side["results"].get(name) for _, side in sides]
            lines.append("| " + " | ".join([f"`{name}`", *_startup_cells(got, "median_s", 2),
                                            *_startup_cells(got, "median_rss_mb", 0)]) + " |")
        lines.append("")
    return lines


def ci_section(ci: dict) -> list[str]:
    """The suite's own cost: a cold `.ci/run` on a fresh clone (issues 27 and 32)."""
    lines = ["## CI time (a cold `.ci/run`)", ""]
    for run in ci.values():
        builds = sum(run.get("builds_s", {}).values())
        lines += [f"{run['machine']}, {run['date']}, revision {run['revision']}: "
                  f"`{run['command']}`. Cold: {run['cold_for']}. Beside it: {run['beside']}.", "",
                  "| figure | value |", "|---|---|",
                  f"| `.ci/run` (`make test`, `make demo`, `make bench-quick`) | "
                  f"{run['total_s'] / 60:.1f} min (target <= {run['target_s'] / 60:.0f}) |",
                  f"| `pytest tests` ({run['tests_passed']} passed) | "
                  f"{run['pytest_s'] / 60:.1f} min |",
                  *([f"| Go builds, summed | {builds / 60:.1f} min, all done "
                     f"{run['builds_done_after_s'] / 60:.0f} min into the run (background "
                     "prebuild, gpusteward/sandbox/prebuild.py) |"] if builds else []),
                  *(f"| build: {name} | {s / 60:.1f} min |"
                    for name, s in run.get("builds_s", {}).items()),
                  *(f"| tier: {name} | {s / 60:.1f} min |"
                    for name, s in run.get("tiers_s", {}).items()),
                  f"| before | {run['before']} |", ""]
    return lines


def _startup_cells(got: list[dict | None], key: str, digits: int) -> list[str]:
    """One figure of a command per side, and before / now where both were measured."""
    cells = [_num(g[key] if g else None, digits) for g in got]
    if len(got) == 2:
        before, now = got
        cells.append(f"{before[key] / now[key]:.1f}x" if before and now else "")
    return cells


def main() -> None:
    ext, sched, rec, tel = (load(n) for n in ("extender", "scheduler", "reclaimer", "telemetry"))
    out = ["# Benchmark results", "",
           f"Assembled by `benchmarks/report.py` (the last step of `make bench`) on "
           f"{time.strftime('%Y-%m-%d')} at revision {revision()} from benchmarks/results/; each "
           "section gives the date of its own run "
           f"({platform.machine()}, 2 cores, 24 GiB; everything — apiserver, etcd, scheduler, "
           "kwok, Prometheus, the extender and the load generator — shares those 2 cores). "
           "Targets are in docs/architecture.md.", ""]
    if ext:
        plot_extender(ext)
        out += extender_section(ext)
    pre = load("extender-preempt")
    if pre:
        out += preempt_section(pre)
    if sched:
        plot_scheduler(sched)
        out += scheduler_section(sched)
    if rec:
        plot_reclaimer(rec)
        out += reclaimer_section(rec)
    if tel:
        plot_telemetry(tel)
        out += telemetry_section(tel)
    fv = load("fleetview")
    if fv:
        out += fleetview_section(fv)
    wi = load("whatif")
    if wi:
        out += whatif_section(wi)
    st = load("startup")
    if st:
        out += startup_section(st)
    ci = load("ci")
    if ci:
        out += ci_section(ci)
    notes = HERE / "NOTES.md"
    if notes.exists():
        out += [notes.read_text()]
    (HERE / "RESULTS.md").write_text("\n".join(out))
    print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
