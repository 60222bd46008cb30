"""The image as built from the Dockerfile (issue 27): who it runs as, on a read-only root, what
``--version`` names, every command's ``--help``, the sandbox's refusal, the packaged policy
schema, and its size against the budget."""

from __future__ import annotations

import argparse
import errno
import json
from pathlib import Path

import pytest

from gpusteward.cli import build_parser
from gpusteward.sandbox.image import SIZE_BUDGET_MB, Built, git_revision, podman
from tests.deploy.conftest import REPO
from tests.image.conftest import RunImage

_UNPRIVILEGED = 65532


def _command_paths(parser: argparse.ArgumentParser,
                   above: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command line the CLI defines (``extender``, ``policy``, ``policy check``, ...)."""
    paths = [above] if above else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += _command_paths(child, (*above, name))
    return paths


COMMANDS = _command_paths(build_parser(every_command=True))


def test_the_cli_walk_finds_every_app() -> None:
    # Guards the parametrisation below: a walk that found nothing would pass vacuously.
    tops = {path[0] for path in COMMANDS}
    assert {"extender", "reclaimer", "report", "whatif", "agent", "policy", "sandbox"} <= tops
    assert ("policy", "check") in COMMANDS


def test_runs_as_the_unprivileged_user(image: Built, run_image: RunImage) -> None:
    # The chart sets runAsNonRoot without a runAsUser: the kubelet refuses a root image.
    config = json.loads(podman("image", "inspect", image.tag).stdout)[0]["Config"]
    assert config["User"] == f"{_UNPRIVILEGED}:{_UNPRIVILEGED}"
    done = run_image("-c", "import os; print(os.getuid(), os.getgid(), os.getgroups())",
                     entrypoint="python")
    assert done.returncode == 0, done.stderr
    uid, gid, *_ = done.stdout.split(maxsplit=2)
    assert (int(uid), int(gid)) == (_UNPRIVILEGED, _UNPRIVILEGED)


def test_the_root_filesystem_is_read_only_and_nothing_needs_it(run_image: RunImage) -> None:
    # Kubernetes' readOnlyRootFilesystem leaves even /tmp read-only (podman's --read-only would
    # mount a tmpfs there; run_image turns that off). The interpreter writes no bytecode beside
    # the sources: compileall ran at build time and PYTHONDONTWRITEBYTECODE is set.
    probe = ("import sys\n"
             "for path in ('/opt/gpusteward/probe', '/tmp/probe'):\n"
             "    try:\n        open(path, 'w')\n    except OSError as exc:\n"
             "        print(exc.errno)\n"
             "print(sys.dont_write_bytecode)\n")
    done = run_image("-c", probe, entrypoint="python")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(errno.EROFS), str(errno.EROFS), "True"]


def test_version_names_the_release_and_the_revision_built(image: Built,
                                                          run_image: RunImage) -> None:
    done = run_image("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"gpusteward {image.version} (revision {git_revision()})"
    labels = json.loads(podman("image", "inspect", image.tag).stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.revision"] == git_revision()
    assert labels["org.opencontainers.image.version"] == image.version


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_answers_help(run_image: RunImage, command: tuple[str, ...]) -> None:
    # Imports every app's modules on the image's own dependency set (a missing wheel or
    # package-data file fails here, not in a pod's CrashLoopBackOff).
    done = run_image(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: gpusteward {' '.join(command)}")
    assert done.stderr == ""


def test_the_sandbox_refuses_in_one_line(run_image: RunImage) -> None:
    done = run_image("sandbox", "up")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpusteward sandbox: a development command")


def test_checks_a_mounted_policy_and_prints_the_packaged_schema(run_image: RunImage) -> None:
    example = REPO / "deploy" / "policy.example.yaml"
    done = run_image("policy", "check", "/etc/gpusteward/policy.yaml",
                     volumes=(f"{example}:/etc/gpusteward/policy.yaml:ro",))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/etc/gpusteward/policy.yaml: valid"
    schema = run_image("policy", "schema")
    assert schema.returncode == 0, schema.stderr
    assert json.loads(schema.stdout) == json.loads(
        (REPO / "deploy" / "policy.schema.json").read_text())


def test_a_bad_policy_exits_2_inside_the_image_too(run_image: RunImage, tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("reclaim:\n  idleMinutes: 30\n  minPodAge: soon\n")
    bad.chmod(0o644)
    done = run_image("policy", "check", "/p.yaml", volumes=(f"{bad}:/p.yaml:ro",))
    assert done.returncode == 2
    assert "reclaim.idleMinutes: unknown field" in done.stderr
    assert "reclaim.minPodAge" in done.stderr


def test_size_within_budget(image: Built) -> None:
    assert image.size_mb <= SIZE_BUDGET_MB, (
        f"{image.tag} weighs {image.size_mb:.0f} MB, over the budget of {SIZE_BUDGET_MB} MB")
