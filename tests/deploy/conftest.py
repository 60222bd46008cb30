"""Deployment tier: render the kustomize tree and the Helm chart with kustomize and helm built
from Go modules (gpusteward/sandbox/renderers.py), and check the result against the sandbox's real
kube-apiserver (the session `sandbox` fixture of tests/support/sandbox.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpusteward.sandbox.renderers import ensure_renderers
from tests.deploy.manifests import render_helm, render_kustomize

REPO = Path(__file__).resolve().parents[2]

#: Helm values that flip every switch away from its default.
HELM_VARIANT = [
    "--set", "schedulerSetup=defaultScheduler", "--set", "mode=enforce",
    "--set", "prometheusUrl=http://prometheus.monitoring.svc:9090",
    "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
    "--set", "grafanaDashboard.enabled=true", "--set", "agent.enabled=true",
    "--set", "reclaimer.replicas=1", "--set", "logLevel=debug", "--set", "nameOverride=steward",
    "--set", "logFormat=json", "--set", "extender.serviceAccount.name=steward-extender",
    "--set-string", "reclaimer.serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn="
    "arn:aws:iam::111122223333:role/gpusteward-reclaimer",
    "--set", "extender.priorityClassName=system-cluster-critical",
    "--set", "reclaimer.priorityClassName=system-cluster-critical",
    "--set-string", "extender.nodeSelector.node-role\\.kubernetes\\.io/infra=true",
    "--set-json", 'extender.tolerations=[{"key":"infra","operator":"Exists"}]',
    "--set-json", 'reclaimer.affinity={"nodeAffinity":{"preferredDuringSchedulingIgnoredDuring'
    'Execution":[{"weight":1,"preference":{"matchExpressions":[{"key":"infra",'
    '"operator":"Exists"}]}}]}}',
    "--set", "extender.podLabels.team=platform", "--set", "agent.podAnnotations.note=x",
    "--set", "reclaimer.extraArgs[0]=--lease-duration=20",
    "--set-json", 'policy={"resources":["nvidia.com/gpu","nvidia.com/mig-1g.10gb"]}',
    "--set", "extender.replicas=3", "--set", "tests.enabled=false",
    "--set", "extender.sessionAffinityTimeoutSeconds=600",
    "--set", "prometheusConnection.caSecret.name=prometheus-ca",
    "--set", "prometheusConnection.serviceAccountToken.enabled=true",
    "--set", "prometheusConnection.serviceAccountToken.audience=prometheus",
    "--set-string", "prometheusConnection.headers.X-Scope-OrgID=team-a",
    "--set", "report.enabled=true", "--set", "whatif.enabled=true",
    "--set-json", 'whatif.candidates={"longer-window":{"reclaim":{"idle":{"window":"2h"}}}}',
    "--set-json", 'agent.extraHostVolumes=[{"name":"driver","hostPath":"/run/nvidia/driver"}]',
    "--set-json", 'agent.extraVolumeMounts=[{"name":"driver","mountPath":"/driver"}]',
    "--set-json", 'agent.extraEnv=[{"name":"LD_LIBRARY_PATH","value":"/driver"}]',
]

#: ServiceAccounts and RBAC the cluster's admin made: the chart creates neither.
COMPONENTS = ("scheduler", "extender", "reclaimer", "agent", "report", "whatif")
#: Every component on, each with its own account.
ALL_COMPONENTS = ["--set", "agent.enabled=true", "--set", "report.enabled=true",
                  "--set", "whatif.enabled=true", "--set", "logFormat=json"]
HELM_EXISTING_ACCOUNTS = [
    "--set", "rbac.create=false", *ALL_COMPONENTS,
    *[arg for c in COMPONENTS for arg in (
        "--set", f"{c}.serviceAccount.create=false", "--set", f"{c}.serviceAccount.name=ops-{c}")],
]

#: A second release beside the first: cluster-scoped names must not collide.
HELM_SECOND_RELEASE = ("second", "gpusteward-second")

RENDERS = ("kustomize-base", "kustomize-second-scheduler", "kustomize-default-scheduler",
           "kustomize-monitoring", "kustomize-secured-prometheus", "kustomize-with-agent",
           "helm-defaults", "helm-variant", "helm-second-release", "helm-existing-accounts")


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
        "kustomize-with-agent": render_kustomize(bin_dir, kustomize / "overlays" / "with-agent"),
        "helm-defaults": render_helm(bin_dir, chart),
        "helm-variant": render_helm(bin_dir, chart, *HELM_VARIANT),
        "helm-second-release": render_helm(bin_dir, chart, "--set", "agent.enabled=true",
                                           release=HELM_SECOND_RELEASE),
        "helm-existing-accounts": render_helm(bin_dir, chart, *HELM_EXISTING_ACCOUNTS),
    }
