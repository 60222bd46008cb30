"""What the commands that talk to nothing load (issue 32): `gpusteward --version`, `--help` and
`policy check FILE`, as a CI job or a pre-commit hook runs them, build every command's flags and
read the policy without importing any SDK the apps run on (together about 1 s and 90 MB).

Each command runs in a fresh interpreter that reports the modules it ended with; the apps' run
entry points, which gpusteward/cli.py imports only when their command runs (``RUNS``), still
resolve, and every command and subcommand still answers ``--help``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusteward.adapters.podresources import DEFAULT_SOCKET
from gpusteward.cli import RUNS, VERSION, build_parser, main, resolve

REPO = Path(__file__).resolve().parents[2]
POLICY = str(REPO / "deploy" / "policy.example.yaml")
SDKS = {"kubernetes_asyncio", "aiohttp", "prometheus_api_client", "pynvml", "grpc", "numpy",
        "pandas", "prometheus_client", "requests", "urllib3", "tenacity"}
# The command's own interpreter: runs it as the console script does, then says what it loaded.
PROBE = """
import json, os, sys
from gpusteward.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


def loaded_by(argv: list[str], out: Path) -> tuple[int, set[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTEWARD_")}
    subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, check=True,
                   env={**env, "PROBE_OUT": str(out)}, capture_output=True, timeout=60)
    said = json.loads(out.read_text())
    return said["code"], set(said["modules"])


@pytest.mark.parametrize("argv", [
    pytest.param(["--version"], id="version"),
    pytest.param(["--help"], id="help"),
    pytest.param(["policy", "check", POLICY], id="policy-check"),
])
def test_a_command_that_talks_to_nothing_loads_no_sdk_and_no_app_run(
        argv: list[str], tmp_path: Path) -> None:
    code, modules = loaded_by(argv, tmp_path / "modules.json")
    assert code in (0, None)
    assert sorted(SDKS & {m.split(".")[0] for m in modules}) == []
    runs = {target.partition(":")[0] for target in RUNS.values()}
    assert sorted(runs & modules) == []


def test_every_command_but_policy_runs_the_function_its_entry_names() -> None:
    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    assert set(RUNS) == set(commands) - {"policy"}  # policy's run is gpusteward.cli's own
    assert all(callable(resolve(target)) for target in [*RUNS.values(), VERSION])


def command_lines(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from command_lines(child, (*path, name))


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p) or "gpusteward")
                                  for p in command_lines(build_parser())])
def test_every_command_and_subcommand_answers_help_with_exit_0(
        path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(('gpusteward', *path))}")


def test_the_agent_flag_defaults_to_the_kubelet_socket_the_adapter_knows() -> None:
    assert build_parser().parse_args(["agent"]).pod_resources_socket == DEFAULT_SOCKET
