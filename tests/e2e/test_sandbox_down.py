"""`gpusteward sandbox down` after `KEEP=1 make demo` leaves no process behind: the demo's own
sandbox, kept, and its reclaimer, started last, from a process that then exits as the demo
does; then the real `sandbox down`. Issue 27 item 2: it said "sandbox stopped" while that
reclaimer ran on, orphaned, against an API server that was gone."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from gpusteward.sandbox.cluster import stop_from_state
from gpusteward.sandbox.procs import SandboxError, pid_alive, stop_pid

# What the demo does with KEEP=1, minus the workload and its output: start_sandbox keeps the
# sandbox (detached), start_reclaimer adds the reclaimer, and the process exits.
KEPT_DEMO = """
import sys
from pathlib import Path
from gpusteward.sandbox import demo
demo.start_reclaimer(demo.start_sandbox(Path(sys.argv[1]), keep=True))
"""


def naming(state: Path) -> dict[int, str]:
    """Live processes whose command line names the state dir (every sandbox process with a
    kubeconfig, config or data dir there; a zombie's is empty): pid -> the command's start."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile
            continue
        if any(str(state) in arg for arg in argv) and pid_alive(int(entry.name)):
            found[int(entry.name)] = " ".join(argv[:3])
    return found


def test_sandbox_down_after_the_kept_demo_leaves_no_process_behind(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        subprocess.run([sys.executable, "-c", KEPT_DEMO, str(state)], check=True, timeout=300)
        pids = json.loads((state / "state.json").read_text())["pids"]
        assert set(pids.values()) <= set(naming(state))  # all alive, and seen by naming()

        down = subprocess.run([sys.executable, "-m", "gpusteward", "sandbox", "down",
                               f"--state-dir={state}"], capture_output=True, text=True,
                              timeout=120)

        assert (down.returncode, down.stderr.strip()) == (0, "sandbox stopped")
        assert naming(state) == {}
        assert [name for name, pid in pids.items() if pid_alive(pid)] == []
        assert {"reclaimer", "extender", "apiserver"} <= set(pids)  # the demo's, on record
        assert not (state / "state.json").exists()
    finally:  # a failure above must not leave the kept sandbox running either
        with contextlib.suppress(SandboxError, OSError):
            stop_from_state(state)
        for pid in naming(state):
            stop_pid(pid)
