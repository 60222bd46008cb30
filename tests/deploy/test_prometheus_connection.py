"""The Prometheus connection settings in the manifests: the Helm values and the kustomize
component set GPUSTEWARD_PROMETHEUS_* variables (the flags' environment variables) on both the
extender and the reclaimer, and every file a variable names is projected into the pod, from
the Secret or the ServiceAccount token it should come from. The dry-run apply of these
renders is in test_render.py (RENDERS)."""

from __future__ import annotations

from typing import Any

import pytest

from gpusteward.adapters.promconnection import parse_header
from tests.deploy.conftest import REPO
from tests.deploy.manifests import render_helm

FILE_SETTINGS = ("GPUSTEWARD_PROMETHEUS_CA_FILE", "GPUSTEWARD_PROMETHEUS_BEARER_TOKEN_FILE",
                 "GPUSTEWARD_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE")
DEPLOYMENTS = ("gpusteward-extender", "gpusteward-reclaimer")


def connection_of(objects: list[dict[str, Any]], deployment: str
                  ) -> tuple[dict[str, str], dict[str, str]]:
    """(environment incl. envFrom ConfigMaps, {mounted file: where it comes from})."""
    [dep] = [o for o in objects if o["kind"] == "Deployment"
             and o["metadata"]["name"] == deployment]
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objects
                   if o["kind"] == "ConfigMap"}
    for ref in container.get("envFrom", []):
        env |= config_maps[ref["configMapRef"]["name"]]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    files: dict[str, str] = {}
    for volume in pod["volumes"]:
        for source in volume.get("projected", {}).get("sources", []):
            at = mounts[volume["name"]]
            if "secret" in source:
                files |= {f"{at}/{item['path']}": f"secret {source['secret']['name']}"
                          for item in source["secret"]["items"]}
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[f"{at}/{token['path']}"] = f"token for {token['audience']}"
    return env, files


def named_files(env: dict[str, str]) -> dict[str, str]:
    return {name: env[name] for name in FILE_SETTINGS if name in env}


@pytest.mark.parametrize(("render", "ca_secret", "tenant"), [
    pytest.param("kustomize-secured-prometheus", "gpusteward-prometheus-ca", "gpu-fleet",
                 id="kustomize-component"),
    pytest.param("helm-variant", "prometheus-ca", "team-a", id="helm-values"),
])
def test_the_ca_token_and_tenant_header_reach_both_deployments(
        render: str, ca_secret: str, tenant: str,
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    for deployment in DEPLOYMENTS:
        env, files = connection_of(rendered[render], deployment)
        named = named_files(env)
        assert set(named.values()) == set(files), deployment  # all named are mounted, and back
        assert files[named["GPUSTEWARD_PROMETHEUS_CA_FILE"]] == f"secret {ca_secret}"
        assert files[named["GPUSTEWARD_PROMETHEUS_BEARER_TOKEN_FILE"]] == "token for prometheus"
        headers = [parse_header(line) for line in env["GPUSTEWARD_PROMETHEUS_HEADERS"]
                   .splitlines()]
        assert headers == [("X-Scope-OrgID", tenant)]
        assert "GPUSTEWARD_PROMETHEUS_INSECURE_SKIP_VERIFY" not in env


def test_helm_basic_auth_projects_the_password_secret(bin_dir) -> None:
    objects = render_helm(bin_dir, REPO / "deploy" / "helm" / "gpusteward",
                          "--set", "prometheusConnection.basicAuth.user=gpusteward",
                          "--set", "prometheusConnection.basicAuth.passwordSecret.name=prom-basic")
    for deployment in DEPLOYMENTS:
        env, files = connection_of(objects, deployment)
        assert env["GPUSTEWARD_PROMETHEUS_BASIC_AUTH_USER"] == "gpusteward"
        assert named_files(env) == {"GPUSTEWARD_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE":
                                    "/var/run/secrets/gpusteward/prometheus/password"}
        assert files == {"/var/run/secrets/gpusteward/prometheus/password": "secret prom-basic"}


@pytest.mark.parametrize("render", ["kustomize-second-scheduler", "helm-defaults"])
def test_by_default_nothing_is_mounted_and_tls_stays_verified(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    for deployment in DEPLOYMENTS:
        env, files = connection_of(rendered[render], deployment)
        assert [k for k in env if k.startswith("GPUSTEWARD_PROMETHEUS_")] == []
        assert files == {}
