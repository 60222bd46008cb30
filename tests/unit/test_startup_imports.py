"""What the commands that talk to nothing load (issue 32): `gpusteward --version`, `--help` and
`policy check FILE`, as a CI job or a pre-commit hook runs them, import no SDK the apps run on
(together about 1 s and 90 MB), and no other command's flags or run function.

Each command runs in a fresh interpreter that reports the modules it ended with; the functions
gpusteward/cli.py imports only when their command is named (``COMMANDS``) still resolve, and
every command and subcommand still answers ``--help``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusteward.adapters.podresources import DEFAULT_SOCKET
from gpusteward.cli import COMMANDS, VERSION, build_parser, main, resolve

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


def modules_of(command: str) -> set[str]:
    """The modules a command's ``COMMANDS`` entry names (its flags' and its run's)."""
    entry = COMMANDS[command]
    return {target.partition(":")[0] for target in (entry.flags, entry.run)}


@pytest.mark.parametrize(("argv", "command"), [
    pytest.param(["--version"], None, id="version"),
    pytest.param(["--help"], None, id="help"),
    pytest.param(["policy", "check", POLICY], "policy", id="policy-check"),
])
def test_a_command_that_talks_to_nothing_loads_no_sdk_and_no_other_command(
        argv: list[str], command: str | None, tmp_path: Path) -> None:
    code, modules = loaded_by(argv, tmp_path / "modules.json")
    assert code in (0, None)
    assert sorted(SDKS & {m.split(".")[0] for m in modules}) == []
    others = set().union(*(modules_of(c) for c in COMMANDS if c != command))
    assert sorted(others & modules) == []
    if command is None:  # nothing but argparse: no YAML, msgspec, TLS or package metadata
        assert sorted({"yaml", "msgspec", "ssl", "importlib.metadata"} & modules) == []


def test_every_command_is_registered_and_its_functions_resolve() -> None:
    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    assert list(commands) == list(COMMANDS)
    assert all(callable(resolve(target))
               for c in COMMANDS.values() for target in (c.flags, c.run, VERSION))


def test_a_command_line_adds_the_flags_of_the_command_it_names_only() -> None:
    parser = build_parser()
    assert parser.parse_args(["policy", "check", "p.yaml"]).file == "p.yaml"
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flagged = {name for name, child in commands.choices.items()
               if any(a.dest != "help" for a in child._actions)}
    assert flagged == {"policy"}


def command_lines(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from command_lines(child, (*path, name))


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p) or "gpusteward")
                                  for p in command_lines(build_parser(every_command=True))])
def test_every_command_and_subcommand_answers_help_with_exit_0(
        path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(('gpusteward', *path))}")


def test_the_agent_flag_defaults_to_the_kubelet_socket_the_adapter_knows() -> None:
    assert build_parser().parse_args(["agent"]).pod_resources_socket == DEFAULT_SOCKET
