"""Start-up cost of the `gpusteward` command (issue 32): the commands a CI job or a pre-commit
hook runs, `--version`, `--help` and `policy check FILE`, each in a fresh process, N times.

    python benchmarks/bench_startup.py [--runs 20] [--base REV | --before DIR]
                                       [--no-bytecode-cache] [--quick]

Wall time is taken around each process (the console script next to this interpreter), peak RSS
from GNU time's %M: the command's own high-water mark, where getrusage's would carry this
process's across fork and exec (benchmarks/memory.py). The commands take turns, round after
round, so load from other work on the shared cores falls on all of them alike; `python -c pass`
on the same interpreter is the floor no command goes under. ``--before DIR``: also run each
command from the source tree in DIR (an earlier revision: `git archive REV | tar -x -C DIR`),
put first on PYTHONPATH and run in that tree (its own example policy), in the same rounds, so
the two are compared under the same load; ``--base REV`` makes that tree itself, in a
temporary directory (`make bench`: STARTUP_BASE, the revision before issue 32's start-up work).
Bytecode: cached, as an installed package has it (PYTHONPYCACHEPREFIX in a temporary directory,
filled by one round that is not counted); ``--no-bytecode-cache`` compiles gpusteward's modules
at every start instead, as a source tree does under PYTHONDONTWRITEBYTECODE=1 (the default of
this machine's shells). Medians of the runs; target <= 0.3 s and <= 40 MB each. Results:
results/startup.json, one entry per bytecode mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TARGET_S, TARGET_MB = 0.3, 40.0
FLOOR = "python -c pass"


class Side(NamedTuple):
    """How one revision's commands run: their environment and working directory."""

    env: dict[str, str]
    cwd: Path


def gpusteward() -> list[str]:
    script = Path(sys.executable).with_name("gpusteward")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpusteward"]


COMMANDS = {
    "gpusteward --version": [*gpusteward(), "--version"],
    "gpusteward --help": [*gpusteward(), "--help"],
    "gpusteward policy check deploy/policy.example.yaml":
        [*gpusteward(), "policy", "check", "deploy/policy.example.yaml"],
}


def find_gnu_time() -> str | None:
    path = shutil.which("time")
    if path is None:
        return None
    said = subprocess.run([path, "--version"], capture_output=True, text=True)
    return path if "GNU" in said.stdout + said.stderr else None


def once(argv: list[str], side: Side, gnu_time: str | None, out: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS in MB of one fresh process."""
    env, cwd = side
    if gnu_time is None:  # no GNU time: wait4's figure, which may include ours (an upper bound)
        t = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, argv)
        return wall, usage.ru_maxrss / 1024
    t = time.perf_counter()
    subprocess.run([gnu_time, "-f", "%M", "-o", str(out), *argv], cwd=cwd, env=env,
                   stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t
    return wall, int(out.read_text().split()[-1]) / 1024  # kB


def measure(runs: int, before: Path | None, cache: Path | None) -> dict:
    gnu_time = find_gnu_time()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTEWARD_")
           and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env |= {"PYTHONPYCACHEPREFIX": str(cache)} if cache else {"PYTHONDONTWRITEBYTECODE": "1"}
    sides = {"now": Side(env, REPO)}
    if before is not None:  # in its own tree: it checks its own example policy
        sides["before"] = Side({**env, "PYTHONPATH": os.pathsep.join(
            [str(before), *filter(None, [env.get("PYTHONPATH")])])}, before)
    plan = [(side, name, argv) for side in sides for name, argv in COMMANDS.items()]
    plan.append(("now", FLOOR, [sys.executable, "-c", "pass"]))
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for side, _, argv in (plan if cache else []):  # fills the bytecode cache
            once(argv, sides[side], gnu_time, Path(tmp) / "time.out")
        for _ in range(runs):
            for side, name, argv in plan:
                samples.setdefault((side, name), []).append(
                    once(argv, sides[side], gnu_time, Path(tmp) / "time.out"))
    report = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv), "runs": runs,
              "bytecode": "cached" if cache else "compiled at each start",
              "rss_from": "GNU time %M" if gnu_time else "wait4 ru_maxrss (an upper bound)",
              # 1-minute load average: other work on the same cores slows every start
              "load": [load_at_start, os.getloadavg()[0]]}
    for side in sides:
        where = REPO if side == "now" else before
        assert where is not None
        report[side] = {"revision": revision(where), "results": {
            name: summary(got) for (s, name), got in samples.items() if s == side}}
    return report


def summary(got: list[tuple[float, float]]) -> dict:
    walls, peaks = [w for w, _ in got], [p for _, p in got]
    return {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "median_rss_mb": statistics.median(peaks), "max_rss_mb": max(peaks)}


def archive(rev: str, into: Path) -> Path:
    """``rev``'s source tree, as `git archive` gives it, in a directory named by its short
    commit (which revision() then reports)."""
    short = subprocess.run(["git", "rev-parse", "--short", f"{rev}^{{commit}}"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.strip()
    tree = into / short
    tree.mkdir()
    tar = subprocess.run(["git", "archive", short], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=tar.stdout, check=True)
    return tree


def revision(tree: Path) -> str:
    """The tree's commit (the directory's name where it is no git checkout, as git archive
    leaves it), and whether gpusteward/ has changes not committed."""
    if not (tree / ".git").exists():
        return tree.name
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=tree).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "gpusteward"],
                           capture_output=True, text=True, cwd=tree).stdout.strip()
    return head + (" with uncommitted changes" if dirty else "")


def show(report: dict) -> None:
    print(f"# start-up — {report['machine']}, Python {report['python']}, {report['runs']} runs, "
          f"bytecode {report['bytecode']}, load {report['load'][0]:.1f}-{report['load'][1]:.1f}, "
          f"revision {report['now']['revision']}")
    before = report.get("before", {}).get("results", {})
    for name, r in report["now"]["results"].items():
        line = (f"{name:<52} median {r['median_s'] * 1000:6.0f} ms "
                f"(min {r['min_s'] * 1000:.0f}, max {r['max_s'] * 1000:.0f}), "
                f"peak RSS {r['median_rss_mb']:5.1f} MB")
        if name in before:
            line += (f"; before ({report['before']['revision']}) "
                     f"{before[name]['median_s'] * 1000:.0f} ms, "
                     f"{before[name]['median_rss_mb']:.1f} MB")
        if name != FLOOR:
            met = r["median_s"] <= TARGET_S and r["median_rss_mb"] <= TARGET_MB
            line += "  [target met]" if met else "  [target missed]"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="fresh processes per command")
    earlier = parser.add_mutually_exclusive_group()
    earlier.add_argument("--base", metavar="REV",
                         help="an earlier revision of this repository to compare with, run alike")
    earlier.add_argument("--before", type=Path, metavar="DIR",
                         help="an earlier revision's source tree to compare with, run alike")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="compile gpusteward's modules at every start")
    parser.add_argument("--quick", action="store_true", help="CI: 2 runs, no figures written")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as trees:
        before = archive(args.base, Path(trees)) if args.base else args.before
        report = measure(2 if args.quick else args.runs, before,
                         None if args.no_bytecode_cache else Path(cache))
    show(report)
    if not args.quick:
        path = RESULTS / "startup.json"
        saved = json.loads(path.read_text()) if path.exists() else {}
        saved[report["bytecode"]] = report
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(saved, indent=2) + "\n")


if __name__ == "__main__":
    main()
