"""Render manifests, find each object's REST path by discovery, and call the API server as a
ServiceAccount (impersonation with the sandbox's admin token)."""

from __future__ import annotations

import http.client
import json
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from gpusteward.sandbox.kubehttp import KubeHTTP

NAMESPACE = "gpusteward"
RELEASE = "gpusteward"


def _load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stderr}"
    return result.stdout


def render_kustomize(bin_dir: Path, path: Path) -> list[dict[str, Any]]:
    return _load_all(_run([str(bin_dir / "kustomize"), "build", str(path)]))


def render_helm(bin_dir: Path, chart: Path, *args: str,
                release: tuple[str, str] = (RELEASE, NAMESPACE)) -> list[dict[str, Any]]:
    name, namespace = release
    return _load_all(_run([str(bin_dir / "helm"), "template", name, str(chart),
                           "--namespace", namespace, *args]))


def name_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']}/{meta.get('namespace', '-')}/{meta['name']}"


class Discovery:
    """apiVersion + kind -> (plural, namespaced), read from the API server itself."""

    def __init__(self, api: KubeHTTP):
        self.api = api
        self._groups: dict[str, dict[str, tuple[str, bool]] | None] = {}

    def resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        if api_version not in self._groups:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                listing = self.api.get(base)
            except Exception:  # the group is not served (a CRD that is not installed)
                self._groups[api_version] = None
            else:
                self._groups[api_version] = {
                    r["kind"]: (r["name"], r["namespaced"])
                    for r in listing["resources"] if "/" not in r["name"]}
        kinds = self._groups[api_version]
        return None if kinds is None else kinds.get(kind)

    def path(self, obj: dict[str, Any]) -> str | None:
        """The object's own REST path, or None when the server does not serve its kind."""
        found = self.resource(obj["apiVersion"], obj["kind"])
        if found is None:
            return None
        plural, namespaced = found
        version = obj["apiVersion"]
        base = "/api/v1" if version == "v1" else f"/apis/{version}"
        meta = obj["metadata"]
        if namespaced:
            return f"{base}/namespaces/{meta.get('namespace', NAMESPACE)}/{plural}/{meta['name']}"
        return f"{base}/{plural}/{meta['name']}"


class ServiceAccountClient:
    """Raw calls as system:serviceaccount:<ns>:<name>: returns (status, body)."""

    def __init__(self, api: KubeHTTP, name: str, namespace: str = NAMESPACE):
        self.api = api
        self.headers = [
            ("Impersonate-User", f"system:serviceaccount:{namespace}:{name}"),
            ("Impersonate-Group", "system:serviceaccounts"),
            ("Impersonate-Group", f"system:serviceaccounts:{namespace}"),
            ("Impersonate-Group", "system:authenticated"),
        ]

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> tuple[int, Any]:
        # http.client, not urllib: Impersonate-Group must be sent once per group.
        url = urllib.parse.urlsplit(self.api.server)
        conn = http.client.HTTPSConnection(url.hostname or "127.0.0.1", url.port,
                                           context=self.api._ssl, timeout=30)
        data = None if body is None else json.dumps(body).encode()
        try:
            conn.putrequest(method, path)
            headers = [("Authorization", f"Bearer {self.api.token}"),
                       ("Accept", "application/json"), *self.headers]
            if data is not None:
                headers += [("Content-Type", content_type), ("Content-Length", str(len(data)))]
            for key, value in headers:
                conn.putheader(key, value)
            conn.endheaders(data)
            resp = conn.getresponse()
            raw, status = resp.read(), resp.status
        finally:
            conn.close()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:  # a watch stream: one JSON event per line
            return status, raw.decode(errors="replace")
