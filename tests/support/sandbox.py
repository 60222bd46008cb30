"""One sandbox per test session, shared by the e2e and deploy tiers: real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built from Go modules; kwok nodes; the DCGM
simulator; a real Prometheus. Plus ``reclaimer``: in-process reclaimers wired to a sandbox.

The first run builds the control plane (about 6 minutes on 2 cores, cached afterwards). Nothing
here skips: a sandbox that cannot start fails the session loudly.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusteward.adapters.kube import connect
from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.core.policy import Policy, ReclaimMode
from gpusteward.reclaimer.cli import ReclaimerSettings
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.reclaimer.serve import build_reclaimer
from gpusteward.sandbox.cluster import Sandbox, SandboxConfig
from gpusteward.sandbox.kubehttp import KubeHTTP
from tests.e2e.kube import RECLAIMER_NAMESPACE, Namespace


def started(tmp_path_factory: pytest.TempPathFactory, name: str,
            **config: Any) -> Iterator[Sandbox]:
    """A sandbox for a fixture to yield, stopped after; ``config``: SandboxConfig fields."""
    state = Path(tmp_path_factory.mktemp(name))
    box = Sandbox(SandboxConfig(state_dir=state, with_extender=True, **config)).start()
    try:
        yield box
    finally:
        box.stop()


def fresh_namespace(api: KubeHTTP, prefix: str = "e2e",
                    owners: tuple[str, ...] = ()) -> Iterator[Namespace]:
    """A fresh namespace; at teardown its pods are deleted and waited for, freeing their GPUs.
    ``owners``: collection paths under the namespace (``/apis/ray.io/v1/.../rayclusters`` with
    ``{ns}`` for its name) deleted first, whose controllers would recreate the pods."""
    namespace = Namespace(api, f"{prefix}-{secrets.token_hex(3)}")
    namespace.create()
    yield namespace
    for path in owners:
        api.delete(path.format(ns=namespace.name), {"propagationPolicy": "Background"})
    namespace.delete()


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "sandbox")


# A test on the sandbox that fails carries the tails of these components' logs: CI keeps only
# its output, and the sandbox's state directory is gone with the machine.
LOGGED, TAIL_LINES, LINE_CHARS = ("scheduler", "extender", "controller-manager"), 15, 400


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    box = getattr(item, "funcargs", {}).get("sandbox")
    if report.when != "call" or not report.failed or not isinstance(box, Sandbox):
        return
    for name in LOGGED:
        path = box.dir / "logs" / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:] if path.exists() else []
        report.sections.append((f"sandbox {name} log, last {TAIL_LINES} lines",
                                "\n".join(line[:LINE_CHARS] for line in lines)))


@pytest.fixture
def scheduler_with(sandbox: Sandbox) -> Callable[..., None]:
    """scheduler_with(preemption=, preempt_verb=, node_cache_capable=): restart the shared
    sandbox's scheduler with these settings unless it already runs with them. A test states
    what it needs; the next one that needs otherwise restarts it again."""

    def ensure(**wanted: bool) -> None:
        if any(getattr(sandbox.cfg, k) != v for k, v in wanted.items()):
            sandbox.restart_scheduler(**wanted)

    return ensure


@pytest.fixture
def api(sandbox: Sandbox) -> KubeHTTP:
    return sandbox.api()


@pytest.fixture
def ns(api: KubeHTTP) -> Iterator[Namespace]:
    yield from fresh_namespace(api)


MakeReclaimer = Callable[..., Awaitable[Reclaimer]]


@pytest.fixture
async def reclaimer(sandbox: Sandbox) -> AsyncIterator[MakeReclaimer]:
    """reclaimer(mode, box=sandbox, policy=None, ledger=None, prometheus_url=None, snoozes=None,
    kubeconfig=None) -> a Reclaimer wired to a sandbox by the command's own ``build_reclaimer``
    (``ledger``, ``snoozes``: ConfigMaps in kube-system, else the records live in memory;
    ``prometheus_url``: another Prometheus than the sandbox's; ``kubeconfig``: another way to
    the API server, e.g. through tests.support.apiproxy); each test steps its cycles itself.
    Every one keeps its stops in the stop record kube-system/gpusteward-reclaimer-stops, where
    ``tests.e2e.kube.restore`` reads it (tests keep apart by namespace)."""
    clients = []

    async def make(mode: str = "enforce", box: Sandbox = sandbox, policy: Policy | None = None,
                   ledger: str | None = None, prometheus_url: str | None = None,
                   snoozes: str | None = None, kubeconfig: Path | None = None) -> Reclaimer:
        settings = ReclaimerSettings(
            policy=policy or load_policy(box.cfg.policy), mode=ReclaimMode(mode),
            prometheus=PrometheusConnection(prometheus_url or box.prometheus_url),
            lease_namespace=RECLAIMER_NAMESPACE, ledger=ledger, snoozes=snoozes,
            kubeconfig=str(kubeconfig or box.kubeconfig))
        api = await connect(settings.kubeconfig)
        clients.append(api)
        return build_reclaimer(settings, api, prometheus_attempts=1)

    yield make
    for api in clients:
        await api.close()
