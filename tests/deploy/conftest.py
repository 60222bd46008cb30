"""Deployment tier: render the kustomize tree and the Helm chart with kustomize and helm built
from Go modules (tests/deploy/renderers.py), and check the result against the sandbox's real
kube-apiserver (the session `sandbox` fixture of tests/support/sandbox.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import render_helm, render_kustomize
from tests.deploy.renderers import ensure_renderers

REPO = Path(__file__).resolve().parents[2]

#: Helm values that flip every switch away from its default.
HELM_VARIANT = [
    "--set", "schedulerSetup=defaultScheduler", "--set", "mode=enforce",
    "--set", "prometheusUrl=http://prometheus.monitoring.svc:9090",
    "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
    "--set", "grafanaDashboard.enabled=true", "--set", "agent.enabled=false",
    "--set", "extender.replicas=3", "--set", "reclaimer.leaseName=rec-lease",
    "--set", "prometheusConnection.caSecret.name=prometheus-ca",
    "--set", "prometheusConnection.serviceAccountToken.enabled=true",
    "--set", "prometheusConnection.serviceAccountToken.audience=prometheus",
    "--set-string", "prometheusConnection.headers.X-Scope-OrgID=team-a",
]

RENDERS = ("kustomize-base", "kustomize-second-scheduler", "kustomize-default-scheduler",
           "kustomize-monitoring", "kustomize-secured-prometheus", "helm-defaults",
           "helm-variant")


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return ensure_renderers()


@pytest.fixture(scope="session")
def rendered(bin_dir: Path) -> dict[str, list[dict[str, Any]]]:
    kustomize = REPO / "deploy" / "kustomize"
    chart = REPO / "deploy" / "helm" / "gpusteward"
    return {
        "kustomize-base": render_kustomize(bin_dir, kustomize / "base"),
        "kustomize-second-scheduler":
            render_kustomize(bin_dir, kustomize / "overlays" / "second-scheduler"),
        "kustomize-default-scheduler":
            render_kustomize(bin_dir, kustomize / "overlays" / "default-scheduler"),
        "kustomize-monitoring": render_kustomize(bin_dir, kustomize / "monitoring"),
        "kustomize-secured-prometheus":
            render_kustomize(bin_dir, kustomize / "overlays" / "secured-prometheus"),
        "helm-defaults": render_helm(bin_dir, chart),
        "helm-variant": render_helm(bin_dir, chart, *HELM_VARIANT),
    }
