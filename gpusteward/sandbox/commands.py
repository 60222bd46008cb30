"""`gpusteward sandbox up|down|status|env`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpusteward.sandbox.build import SandboxBuildError
from gpusteward.sandbox.checkout import missing_from_checkout
from gpusteward.sandbox.cluster import Sandbox, SandboxConfig, stop_from_state
from gpusteward.sandbox.fleet import DEFAULT_FLEET, FleetError, load_fleet
from gpusteward.sandbox.procs import SandboxError, pid_alive


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.environ.get("GPUSTEWARD_SANDBOX_DIR") or Path(base) / "gpusteward" / "sandbox")


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else default_state_dir()


def _err(message: str) -> None:
    print(f"gpusteward sandbox: {message}", file=sys.stderr)


def up(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    if (state_dir / "state.json").exists():
        _err(f"a sandbox already runs from {state_dir}; `gpusteward sandbox down` first")
        return 1
    try:
        fleet = load_fleet(args.fleet) if args.fleet else DEFAULT_FLEET
    except (FleetError, OSError) as e:
        _err(str(e))
        return 2
    cfg = SandboxConfig(state_dir=state_dir, fleet=fleet, with_extender=args.with_extender,
                        with_reclaimer=args.with_reclaimer, telemetry=args.telemetry,
                        with_controllers=args.controllers,
                        honor_labels=args.honor_labels,
                        preemption=not args.no_preemption,
                        extender_replicas=args.extender_replicas,
                        real_nodes=args.real_nodes,
                        detach=True,
                        log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.policy:
        cfg.policy = Path(args.policy).resolve()
    try:
        sandbox = Sandbox(cfg).start()
    except (SandboxBuildError, SandboxError, TimeoutError) as e:
        _err(str(e))
        return 1
    except KeyboardInterrupt:
        _err("interrupted; everything started was stopped")
        return 130
    print("\n".join(sandbox.env_lines()))
    return 0


def down(args: argparse.Namespace) -> int:
    try:
        stopped = stop_from_state(_state_dir(args))
    except SandboxError as e:
        _err(f"{e}; run `gpusteward sandbox down` again")
        return 1
    if stopped:
        print("sandbox stopped", file=sys.stderr)
    else:
        print("no sandbox running", file=sys.stderr)
    return 0


def _state(args: argparse.Namespace) -> dict | None:
    path = _state_dir(args) / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def status(args: argparse.Namespace) -> int:
    state = _state(args)
    if state is None:
        print("no sandbox running")
        return 1
    for name, pid in state["pids"].items():
        print(f"{name:<20} pid {pid:<8} {'running' if pid_alive(pid) else 'STOPPED'}")
    print(f"kubeconfig           {state['kubeconfig']}")
    print(f"prometheus           {state['prometheus_url']}")
    return 0


def env(args: argparse.Namespace) -> int:
    state = _state(args)
    if state is None:
        _err("no sandbox running; start one with `gpusteward sandbox up`")
        return 1
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PROMETHEUS_URL={state['prometheus_url']}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.sandbox_command == "up" and (problem := missing_from_checkout()):
        _err(problem)
        return 2
    return {"up": up, "down": down, "status": status, "env": env}[args.sandbox_command](args)
