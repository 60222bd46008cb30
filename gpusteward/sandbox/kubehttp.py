"""A small synchronous JSON client for the sandbox's API server (orchestration and e2e tests).

The apps use kubernetes-asyncio; scripts that only create objects and wait for them read more
plainly without an event loop.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class KubeHTTPError(RuntimeError):
    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body or {}


class KubeHTTP:
    def __init__(self, server: str, token: str, timeout: float = 30.0):
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._ssl = ssl.create_default_context()
        self._ssl.check_hostname = False
        self._ssl.verify_mode = ssl.CERT_NONE  # the sandbox's self-signed serving cert

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = {"message": raw[:300].decode(errors="replace")}
            raise KubeHTTPError(e.code, payload.get("message", ""), payload) from e
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def get_text(self, path: str) -> str:
        """A plain-text GET, such as a pod's ``/log``."""
        req = urllib.request.Request(self.server + path)
        req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, context=self._ssl, timeout=self.timeout) as resp:
            return resp.read().decode(errors="replace")

    def watch(self, path: str, resource_version: str, seconds: int = 2) -> list[dict[str, Any]]:
        """The watch events on ``path`` since ``resource_version``, gathered for ``seconds``:
        the API server replays what its watch cache still holds, then closes the stream."""
        sep = "&" if "?" in path else "?"
        req = urllib.request.Request(f"{self.server}{path}{sep}watch=1&resourceVersion="
                                     f"{resource_version}&timeoutSeconds={seconds}")
        req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, context=self._ssl, timeout=self.timeout + seconds) as r:
            return [json.loads(line) for line in r.read().splitlines() if line.strip()]

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.request("POST", path, obj)

    def apply(self, path: str, obj: dict[str, Any], manager: str = "gpusteward-sandbox",
              dry_run: bool = False) -> Any:
        """Server-side apply (PATCH application/apply-patch+yaml; JSON is valid YAML)."""
        query = f"?fieldManager={manager}&force=true" + ("&dryRun=All" if dry_run else "")
        return self.request("PATCH", path + query, obj, "application/apply-patch+yaml")

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return self.request("DELETE", path, body)
        except KubeHTTPError as e:
            if e.status != 404:
                raise
            return None

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
            return True
        except KubeHTTPError as e:
            if e.status == 404:
                return False
            raise


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0,
             interval: float = 0.2) -> T:
    """Poll until check() returns something truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (KubeHTTPError, OSError) as e:
            last_error = e
        time.sleep(interval)
    suffix = f" (last error: {last_error})" if last_error else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{suffix}")


_INSECURE = ssl.create_default_context()
_INSECURE.check_hostname = False
_INSECURE.verify_mode = ssl.CERT_NONE  # the sandbox's self-signed serving certificates


def http_ok(url: str, token: str | None = None) -> bool:
    """Whether ``url`` answers 200 (a component's /healthz or /readyz) within 2 s."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=_INSECURE) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def node_ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions", []))
