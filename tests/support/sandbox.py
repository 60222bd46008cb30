"""One sandbox per test session, shared by the e2e and deploy tiers: real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built from Go modules; kwok nodes; the DCGM
simulator; a real Prometheus.

The first run builds the control plane (about 6 minutes on 2 cores, cached afterwards). Nothing
here skips: a sandbox that cannot start fails the session loudly.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusteward.sandbox.cluster import Sandbox, SandboxConfig
from gpusteward.sandbox.kubehttp import KubeHTTP
from tests.e2e.kube import Namespace


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    state = Path(tmp_path_factory.mktemp("sandbox"))
    box = Sandbox(SandboxConfig(state_dir=state, with_extender=True)).start()
    try:
        yield box
    finally:
        box.stop()


@pytest.fixture
def api(sandbox: Sandbox) -> KubeHTTP:
    return sandbox.api()


@pytest.fixture
def ns(api: KubeHTTP) -> Iterator[Namespace]:
    """A fresh namespace; at teardown its pods are deleted and waited for, freeing their GPUs."""
    namespace = Namespace(api, f"e2e-{secrets.token_hex(3)}")
    namespace.create()
    yield namespace
    namespace.delete()
