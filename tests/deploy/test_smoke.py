"""`helm test` for real: the chart's smoke-test script (files/smoke_test.py) runs against the
sandbox's extender (the one its kube-scheduler calls) and a real reclaimer holding its Lease in
the release namespace, authenticated as the test Pod's ServiceAccount with the chart's own
test Role (a TokenRequest token: what the kubelet would mount)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import KubeHTTP, wait_for
from gpusteward.sandbox.procs import Proc, free_port
from tests.deploy.conftest import REPO
from tests.deploy.manifests import NAMESPACE, Discovery

SCRIPT = REPO / "deploy/helm/gpusteward/files/smoke_test.py"
HOOK_KINDS = {"ServiceAccount", "Role", "RoleBinding"}


@pytest.fixture(scope="module")
def credentials(sandbox: Sandbox, rendered: dict[str, list[dict[str, Any]]],
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test hook's ServiceAccount, Role and RoleBinding applied; a token for it and the API
    server's CA in a directory laid out as the kubelet mounts them."""
    api = sandbox.api()
    api.apply(f"/api/v1/namespaces/{NAMESPACE}", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    discovery = Discovery(api)
    hooks = [o for o in rendered["helm-defaults"] if o["kind"] in HOOK_KINDS
             and (o["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    assert {o["kind"] for o in hooks} == HOOK_KINDS
    for obj in sorted(hooks, key=lambda o: o["kind"] != "ServiceAccount"):
        path = discovery.path(obj)
        assert path is not None
        api.apply(path, obj, manager="gpusteward-deploy-test")
    token = api.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/gpusteward-test/token",
                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600}})["status"]["token"]
    directory = tmp_path_factory.mktemp("serviceaccount")
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes((sandbox.dir / "pki" / "apiserver.crt").read_bytes())
    return directory


@pytest.fixture(scope="module")
def reclaimer(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory):
    """A real reclaimer (observe mode) leading through gpusteward/gpusteward-reclaimer."""
    port = free_port()
    argv = [a for a in sandbox.reclaimer_argv(port) if not a.startswith("--lease-namespace")]
    log = tmp_path_factory.mktemp("reclaimer") / "reclaimer.log"
    api = sandbox.api()
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpusteward-reclaimer"
    if api.exists(lease):  # test_rbac.py's, held by nobody that renews it
        api.delete(lease)
    proc = Proc("reclaimer", [*argv, f"--lease-namespace={NAMESPACE}", "--mode=observe"],
                log).start()
    try:
        wait_for("the reclaimer's Lease", lambda: _held(api, lease), timeout=90)
        yield proc
    finally:
        proc.stop()


def _held(api: KubeHTTP, path: str) -> bool:
    return api.exists(path) and bool(api.get(path)["spec"].get("renewTime"))


def _smoke(sandbox: Sandbox, credentials: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "EXTENDER_URL": sandbox.extender_url, "LEASE": "gpusteward-reclaimer",
               "POD_NAMESPACE": NAMESPACE, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(sandbox.ports["apiserver"]),
               "SERVICE_ACCOUNT_DIR": str(credentials), **env}
    return subprocess.run([sys.executable, str(SCRIPT)], env=environ, capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_smoke_test_passes_when_the_extender_answers_and_the_lease_is_held(
        sandbox: Sandbox, credentials: Path, reclaimer: Proc) -> None:
    result = _smoke(sandbox, credentials)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "ok", "")


def test_the_smoke_test_fails_naming_what_is_wrong(
        sandbox: Sandbox, credentials: Path, reclaimer: Proc) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = _smoke(sandbox, credentials, EXTENDER_URL=dead, LEASE="someone-else")
    assert result.returncode == 1
    assert "extender_answers: <urlopen error [Errno 111] Connection refused>" in result.stderr
    # the test Role may read only the release's Lease
    assert "lease_held: HTTP Error 403: Forbidden" in result.stderr
    assert result.stdout.strip() == "FAILED"
