"""What a user sees when they get something wrong: one line on stderr and a fixed exit code
(0 ok, 1 runtime, 2 usage), asserted word for word through real `python -m gpusteward` runs.

An unreachable API server is a closed local port (nothing listens; the kernel refuses the
connection, as for a down apiserver); a busy port is one this test holds open."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POLICY = str(REPO / "deploy" / "policy.example.yaml")


def gpusteward(*argv: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("GPUSTEWARD_") and k not in ("KUBECONFIG", "PROMETHEUS_URL")}
    return subprocess.run([sys.executable, "-m", "gpusteward", *argv], cwd=REPO,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path) -> tuple[Path, int]:
    """A kubeconfig whose API server (in the upstream kubeconfig v1 shape) refuses connections."""
    port = closed_port()
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path, port


def test_version_comes_from_the_installed_distribution() -> None:
    done = gpusteward("--version")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"gpusteward {version('gpusteward')}\n", "")


def test_version_names_the_revision_the_image_was_built_from() -> None:
    # The Dockerfile's REVISION build argument becomes GPUSTEWARD_REVISION in the image.
    done = gpusteward("--version", env={"GPUSTEWARD_REVISION": "93aa607c0ffee"})
    assert (done.returncode, done.stdout) == (
        0, f"gpusteward {version('gpusteward')} (revision 93aa607c0ffee)\n")


def test_report_with_an_unreachable_api_server_is_one_line_exit_1(
        unreachable_kubeconfig: tuple[Path, int]) -> None:
    kubeconfig, port = unreachable_kubeconfig
    done = gpusteward("report", "--kubeconfig", str(kubeconfig),
                      "--prometheus-url", f"http://127.0.0.1:{closed_port()}")
    assert done.returncode == 1
    assert done.stderr == (
        f"gpusteward report: cannot reach the API server at https://127.0.0.1:{port}: "
        f"Cannot connect to host 127.0.0.1:{port} ssl:default "
        f"[Connect call failed ('127.0.0.1', {port})]\n")
    assert done.stdout == ""


@pytest.mark.parametrize("command", [
    pytest.param(["reclaimer", "--policy", POLICY, "--once"], id="reclaimer-once"),
    pytest.param(["reclaimer", "restore", "ml/Deployment/train"], id="reclaimer-restore"),
])
def test_the_reclaimer_with_an_unreachable_api_server_is_one_line_exit_1(
        command: list[str], unreachable_kubeconfig: tuple[Path, int]) -> None:
    kubeconfig, port = unreachable_kubeconfig
    done = gpusteward(*command, "--kubeconfig", str(kubeconfig), "--log-level", "error",
                      env={"PROMETHEUS_URL": f"http://127.0.0.1:{closed_port()}"})
    assert (done.returncode, done.stderr) == (
        1, f"gpusteward reclaimer: cannot reach the API server: Cannot connect to host "
           f"127.0.0.1:{port} ssl:default [Connect call failed ('127.0.0.1', {port})]\n")


@pytest.mark.parametrize("command", [
    pytest.param(["extender", "--policy", POLICY, "--listen"], id="extender"),
    pytest.param(["extender", "--policy", POLICY, "--listen", f"127.0.0.1:{closed_port()}",
                  "--metrics-listen"], id="extender-metrics"),
    pytest.param(["reclaimer", "--policy", POLICY, "--metrics-listen"], id="reclaimer"),
])
def test_a_busy_port_is_one_line_exit_1(command: list[str], busy_port: int,
                                        unreachable_kubeconfig: tuple[Path, int]) -> None:
    kubeconfig, _ = unreachable_kubeconfig
    done = gpusteward(*command, f"127.0.0.1:{busy_port}", "--kubeconfig", str(kubeconfig),
                      "--prometheus-url", f"http://127.0.0.1:{closed_port()}",
                      "--log-level", "error")
    assert done.returncode == 1
    assert done.stderr == (f"gpusteward {command[0]}: cannot listen on "
                           f"127.0.0.1:{busy_port}: Address already in use\n")


def test_the_agent_on_a_busy_port_is_one_line_exit_1(busy_port: int) -> None:
    done = gpusteward("agent", "--node-name", "gpu-1", "--listen", f"127.0.0.1:{busy_port}",
                      "--on-missing-driver", "serve-error", "--kube-api", "off",
                      "--log-level", "error", env={"LD_LIBRARY_PATH": "/nonexistent"})
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"gpusteward agent: cannot listen on 127.0.0.1:{busy_port}: Address already in use")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("argv", "env", "line"), [
    pytest.param(["report", "--top", "-1"], {},
                 "gpusteward report: argument --top: expected a whole number >= 0, got '-1' "
                 "(see gpusteward report --help)", id="top-negative"),
    pytest.param(["report", "--currency", " "], {},
                 "gpusteward report: argument --currency: expected a symbol or code of 1 to 8 "
                 "characters, got ' ' (see gpusteward report --help)", id="currency-blank"),
    pytest.param(["sandbox", "up", "--extender-replicas", "0"], {},
                 "gpusteward sandbox up: argument --extender-replicas: expected a whole number "
                 ">= 1, got '0' (see gpusteward sandbox up --help)", id="extender-replicas-zero"),
    pytest.param(["sandbox", "up", "--with", "kueue,volcano"], {},
                 "gpusteward sandbox up: argument --with: unknown controller volcano (known: "
                 "kueue, kuberay, jobset, trainer, keda) (see gpusteward sandbox up --help)",
                 id="sandbox-with-unknown"),
    pytest.param(["report", "--window", "0s"], {},
                 "gpusteward report: argument --window: expected at least 1s, got '0s' "
                 "(see gpusteward report --help)", id="window-zero"),
    pytest.param(["extender", "--policy", POLICY, "--listen", "8888"], {},
                 "gpusteward extender: argument --listen: expected HOST:PORT, got '8888' "
                 "(see gpusteward extender --help)", id="listen-no-colon"),
    pytest.param(["extender", "--policy", POLICY, "--max-body-mb", "0"], {},
                 "gpusteward extender: argument --max-body-mb: expected a whole number of "
                 "MiB >= 1, got '0' (see gpusteward extender --help)", id="max-body-zero"),
    pytest.param(["reclaimer", "--log-format", "xml"], {},
                 "gpusteward reclaimer: argument --log-format: invalid choice: 'xml' (choose "
                 "from 'text', 'json') (see gpusteward reclaimer --help)", id="log-format"),
    pytest.param(["report"], {"GPUSTEWARD_TOP": "ten"},
                 "gpusteward report: $GPUSTEWARD_TOP='ten': expected a whole number >= 0, "
                 "got 'ten' (see gpusteward report --help)", id="env-top"),
    pytest.param(["report"], {"GPUSTEWARD_FORMAT": "xlsx"},
                 "gpusteward report: $GPUSTEWARD_FORMAT='xlsx': expected one of table, json, "
                 "csv (see gpusteward report --help)", id="env-choice"),
    pytest.param(["reclaimer", "--policy", POLICY], {"GPUSTEWARD_ONCE": "maybe"},
                 "gpusteward reclaimer: $GPUSTEWARD_ONCE='maybe': expected true or false "
                 "(see gpusteward reclaimer --help)", id="env-switch"),
    pytest.param(["report"], {},
                 "gpusteward report: no Prometheus URL (--prometheus-url, PROMETHEUS_URL or "
                 "the policy's telemetry.prometheusUrl)", id="no-prometheus"),
    pytest.param(["report", "--prometheus-url", "prometheus:9090"], {},
                 "gpusteward report: --prometheus-url 'prometheus:9090': expected "
                 "http://HOST[:PORT][/PATH] or https://...", id="prometheus-url-no-scheme"),
    pytest.param(["extender", "--policy", POLICY, "--tls-cert-file", "/nowhere/tls.crt"], {},
                 "gpusteward extender: TLS: --tls-cert-file and --tls-key-file go together",
                 id="tls-half"),
    pytest.param(["extender", "--policy", POLICY, "--tls-cert-file", "/nowhere/tls.crt",
                  "--tls-key-file", "/nowhere/tls.key"], {},
                 "gpusteward extender: TLS: cannot load /nowhere/tls.crt, /nowhere/tls.key: "
                 "No such file or directory", id="tls-missing"),
    pytest.param(["reclaimer", "--lease-duration", "-5"], {},
                 "gpusteward reclaimer: argument --lease-duration: expected a whole number of "
                 "seconds >= 2, got '-5' (see gpusteward reclaimer --help)", id="lease-negative"),
    pytest.param(["reclaimer", "restore", "train"], {},
                 "gpusteward reclaimer: expected NAMESPACE/KIND/NAME (KIND: Job, Deployment, "
                 "StatefulSet, ScaledObject, JobSet, TrainJob, PyTorchJob, RayCluster, RayJob, "
                 "Notebook, InferenceService, LLMInferenceService, LeaderWorkerSet, Workload) "
                 "or --list, got 'train'", id="restore-target"),
    pytest.param(["agent"], {},
                 "gpusteward agent: --node-name or $NODE_NAME is required (the Hostname label "
                 "must be the Kubernetes node name)", id="agent-no-node"),
])
def test_a_usage_error_is_one_line_exit_2(argv: list[str], env: dict[str, str],
                                          line: str) -> None:
    done = gpusteward(*argv, env=env)
    assert (done.returncode, done.stderr) == (2, line + "\n")


def test_a_missing_policy_file_names_the_file_exit_2() -> None:
    done = gpusteward("extender", "--policy", "/nowhere/policy.yaml")
    assert (done.returncode, done.stderr) == (
        2, "invalid policy /nowhere/policy.yaml:\n"
           "  - <root>: cannot read file: No such file or directory\n")


def test_a_directory_given_as_the_policy_file_is_named_exit_2(tmp_path: Path) -> None:
    done = gpusteward("policy", "check", str(tmp_path))
    assert (done.returncode, done.stderr) == (
        2, f"invalid policy {tmp_path}:\n  - <root>: cannot read file: Is a directory\n")


@pytest.mark.parametrize(("error", "expected"), [
    pytest.param(PermissionError(13, "Permission denied", "/srv/fleet.html"),
                 (1, "/srv/fleet.html: Permission denied"), id="unwritable-file"),
    pytest.param(TimeoutError(), (1, "TimeoutError"), id="timeout"),
    pytest.param("api-403", (1, "the API server answered HTTP 403 Forbidden"), id="api-403"),
    pytest.param(RuntimeError("a bug"), (1, None), id="bug-keeps-its-traceback"),
])
def test_the_error_boundary_maps_each_failure_to_a_code_and_a_line(
        error: Exception | str, expected: tuple[int, str | None]) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    from gpusteward.cli import failure

    if error == "api-403":  # kubernetes-asyncio's exception for a non-2xx answer
        error = ApiException(status=403, reason="Forbidden")
    assert failure(error) == expected  # type: ignore[arg-type]


def test_whatif_with_an_invalid_policy_exits_2_naming_the_field(tmp_path, capsys):
    from gpusteward.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("reclaim:\n  interval: soon\n")
    assert main(["whatif", "--policy", str(bad), "--prometheus-url", "http://127.0.0.1:9"]) == 2
    assert "reclaim.interval" in capsys.readouterr().err


def test_whatif_without_a_prometheus_url_exits_2(tmp_path, capsys, monkeypatch):
    from gpusteward.cli import main

    monkeypatch.delenv("PROMETHEUS_URL", raising=False)
    ok = tmp_path / "ok.yaml"
    ok.write_text("{}\n")
    assert main(["whatif", "--policy", str(ok)]) == 2
    assert "no Prometheus URL" in capsys.readouterr().err
