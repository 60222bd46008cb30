"""Find and merge kubeconfig files the way kubectl does (client-go's clientcmd loading rules).

--kubeconfig FILE (it must exist), else the ``KUBECONFIG`` path list (missing entries skipped),
else ``~/.kube/config``, else the in-cluster service account. Several files merge as client-go
merges them: the first file to name a cluster, user or context wins it whole, the first to set
``current-context`` wins it, and relative paths inside a file resolve against that file's
folder. kubernetes-asyncio's own merger lets the *last* file's current-context win and writes
refreshed tokens back into the files, so it is not used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusteward.adapters.errors import KubeConfigError

SECTIONS = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))
# Fields holding file paths, resolved against the file that names them (client-go's
# ResolveLocalPaths covers the same cluster and user fields).
_PATH_FIELDS = {"cluster": ("certificate-authority",),
                "user": ("client-certificate", "client-key", "tokenFile")}


@dataclass(frozen=True)
class KubeconfigChoice:
    """Where the connection comes from: merged files, or (``files`` empty) in-cluster."""

    files: tuple[Path, ...]
    source: str  # where they were named, for error messages
    missing: str = ""  # why no file was found (``files`` empty)


def locate(flag: str | None, env: str | None, home: Path) -> KubeconfigChoice:
    """The kubeconfig files to merge, in precedence order."""
    if flag:
        path = Path(flag).expanduser()
        if not path.is_file():
            raise KubeConfigError(f"--kubeconfig {flag}: no such file")
        return KubeconfigChoice((path,), f"--kubeconfig {flag}")
    if env:
        listed = [Path(p).expanduser() for p in dict.fromkeys(env.split(os.pathsep)) if p]
        return KubeconfigChoice(tuple(p for p in listed if p.is_file()), f"KUBECONFIG={env}",
                                "none of its files exists")
    default = home / ".kube" / "config"
    return KubeconfigChoice((default,) if default.is_file() else (), str(default),
                            "no such file (KUBECONFIG is unset)")


def read_merged(files: tuple[Path, ...]) -> dict[str, Any]:
    return merge([(path, _read(path)) for path in files])


def merge(docs: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """One kubeconfig from several, first file wins per named entry and per current-context."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config",
                              **{section: [] for section, _ in SECTIONS}}
    for path, doc in docs:
        for section, body in SECTIONS:
            taken = {entry["name"] for entry in merged[section]}
            for entry in doc.get(section) or ():
                if isinstance(entry, dict) and entry.get("name") not in taken:
                    merged[section].append(_resolved(entry, body, path.parent))
                    taken.add(entry.get("name"))
        if doc.get("current-context") and "current-context" not in merged:
            merged["current-context"] = doc["current-context"]
    return merged


def pick_context(merged: dict[str, Any], context: str | None, where: str) -> str:
    """The context to use (--context, else current-context), checked to exist."""
    names = [c["name"] for c in merged["contexts"]]
    chosen = context or merged.get("current-context")
    if not chosen:
        raise KubeConfigError(f"{where} sets no current-context; pass --context "
                              f"(contexts: {', '.join(names) or 'none'})")
    if chosen not in names:
        raise KubeConfigError(f"context {chosen!r} is not in {where} "
                              f"(contexts: {', '.join(names) or 'none'})")
    return str(chosen)


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise KubeConfigError(f"kubeconfig {path}: cannot read: {e}") from e
    except yaml.YAMLError as e:
        raise KubeConfigError(f"kubeconfig {path}: not YAML: {_one_line(e)}") from e
    if doc is None:
        return {}  # an empty file is an empty config, as in client-go
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {path}: expected a mapping, got {type(doc).__name__}")
    return doc


def _resolved(entry: dict[str, Any], body: str, base: Path) -> dict[str, Any]:
    inner = entry.get(body)
    if not isinstance(inner, dict):
        return entry
    fixed = {k: str(base / v) if k in _PATH_FIELDS.get(body, ()) and isinstance(v, str)
             and v and not os.path.isabs(v) else v for k, v in inner.items()}
    return {**entry, body: fixed}


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
