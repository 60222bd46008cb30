"""--context and KUBECONFIG path lists reach the sandbox's real API server, through the
`gpusteward` command itself.

KUBECONFIG lists a decoy first: its current-context points at a port where nothing listens, so
anything that works below can only have gone to the context picked with --context, found in the
second file (kubectl's merge: the first file's current-context wins unless --context says
otherwise).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpusteward.sandbox.cluster import Sandbox

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml"


@pytest.fixture(scope="module")
def kubeconfig_list(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> str:
    decoy = tmp_path_factory.mktemp("kubeconfig") / "decoy"
    decoy.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "decoy",
        "clusters": [{"name": "decoy", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "decoy", "user": {"token": "nobody"}}],
        "contexts": [{"name": "decoy", "context": {"cluster": "decoy", "user": "decoy"}}]}))
    assert yaml.safe_load(Path(sandbox.kubeconfig).read_text())["current-context"] == "sandbox"
    return f"{decoy}{os.pathsep}{sandbox.kubeconfig}"


def gpusteward(kubeconfig: str, sandbox: Sandbox, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PROMETHEUS_URL": sandbox.prometheus_url}
    return subprocess.run([sys.executable, "-m", "gpusteward", *argv], capture_output=True,
                          text=True, timeout=180, env=env)


def test_the_report_reads_the_context_named_from_a_kubeconfig_path_list(
        sandbox: Sandbox, kubeconfig_list: str) -> None:
    flags = ["report", "--format=json", "--window=20s", "--step=5s"]
    picked = gpusteward(kubeconfig_list, sandbox, *flags, "--context=sandbox")
    direct = gpusteward(str(sandbox.kubeconfig), sandbox, *flags)

    # 3: written, but Prometheus has no GPU samples yet (a sandbox just started); the fleet
    # below comes from the API server either way
    assert picked.returncode in (0, 3), picked.stderr
    assert direct.returncode in (0, 3), direct.stderr
    fleet = json.loads(picked.stdout)["totals"]["allocatable"]
    assert fleet > 0
    assert fleet == json.loads(direct.stdout)["totals"]["allocatable"]


def test_reclaimer_restore_reaches_the_api_server_of_the_context(
        sandbox: Sandbox, kubeconfig_list: str) -> None:
    missing = f"default/Deployment/absent-{secrets.token_hex(3)}"
    out = gpusteward(kubeconfig_list, sandbox, "reclaimer", "restore", missing,
                     "--context=sandbox")
    # The real API server's 404 for a Deployment that does not exist, not a refused connection.
    assert out.returncode == 1
    assert f"restoring {missing} failed: HTTP 404" in out.stderr


@pytest.mark.parametrize("argv", [
    pytest.param(["report"], id="report"),
    pytest.param(["reclaimer", "restore", "default/Deployment/x"], id="restore"),
    pytest.param(["reclaimer", f"--policy={POLICY}", "--once"], id="reclaimer"),
])
def test_an_unknown_context_is_one_line_and_exit_2(
        sandbox: Sandbox, kubeconfig_list: str, argv: list[str]) -> None:
    out = gpusteward(kubeconfig_list, sandbox, *argv, "--context=prod")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.endswith(f"context 'prod' is not in KUBECONFIG={kubeconfig_list} "
                         "(contexts: decoy, sandbox)")
