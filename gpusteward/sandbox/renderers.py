"""Build (or reuse) the manifest renderers, ``kustomize`` and ``helm``, from Go modules.

They come from the small Go module in ``deploy/tools/go`` (its own go.mod/go.sum, separate from
``sandbox/go``), which pins them with ``tool`` directives, and are built with the machine's
``go`` the way :mod:`gpusteward.sandbox.build` builds the sandbox: into a cache directory keyed
by a hash of go.mod, go.sum, ``go version`` and the flags::

    ${GPUSTEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpusteward}/deploy-tools/<key>/

built in a temporary directory renamed into place on success, under a file lock. A cold build
(modules already downloaded) took 2 min 49 s on two cores, 1.0 GB peak RSS; a cache hit takes
milliseconds.

Run ``python -m gpusteward.sandbox.renderers`` to build and print the bin dir.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gpusteward.sandbox.build import SandboxBuildError, _locked, cache_root, go_build_into

BINARIES = ("kustomize", "helm")
PACKAGES = ("sigs.k8s.io/kustomize/kustomize/v5", "helm.sh/helm/v4/cmd/helm")
SOURCE = Path(__file__).resolve().parents[2] / "deploy" / "tools" / "go"
_RECIPE = "1"


class RendererBuildError(RuntimeError):
    """kustomize or helm could not be built; the message names the build log."""


def _pinned(go_mod: str, module: str) -> str:
    match = re.search(rf"^\s*{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    if match is None:
        raise RendererBuildError(f"deploy/tools/go/go.mod does not require {module}")
    return match.group(1)


def _ldflags(go_mod: str) -> str:
    # Helm reports a hard-coded "v4.3" unless stamped; kustomize reads its module version.
    helm = _pinned(go_mod, "helm.sh/helm/v4")
    return f"-s -w -X helm.sh/helm/v4/internal/version.version={helm}"


def _key(go_version: str, ldflags: str) -> str:
    digest = hashlib.sha256()
    for part in (_RECIPE, go_version, ldflags, " ".join(PACKAGES),
                 (SOURCE / "go.mod").read_text(), (SOURCE / "go.sum").read_text()):
        digest.update(f"{len(part)}\0{part}".encode())
    return digest.hexdigest()[:16]


def _complete(bin_dir: Path) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in BINARIES)


def ensure_renderers() -> Path:
    """Return the directory holding ``kustomize`` and ``helm``, building them if needed."""
    go = os.environ.get("GPUSTEWARD_GO") or shutil.which("go")
    if go is None:
        raise RendererBuildError("`go` was not found on PATH; it builds kustomize and helm")
    go_version = subprocess.run([go, "version"], check=True, capture_output=True, text=True,
                                timeout=120).stdout.strip()
    ldflags = _ldflags((SOURCE / "go.mod").read_text())
    root = cache_root() / "deploy-tools"
    bin_dir = root / _key(go_version, ldflags)
    if _complete(bin_dir):
        return bin_dir
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        if not _complete(bin_dir):
            shutil.rmtree(bin_dir, ignore_errors=True)
            _build(go, go_version, ldflags, bin_dir)
    return bin_dir


def _build(go: str, go_version: str, ldflags: str, bin_dir: Path) -> None:
    print(f"building kustomize and helm ({go_version}) into {bin_dir}; about 3 min on 2 cores",
          file=sys.stderr, flush=True)
    try:
        go_build_into(go, SOURCE, list(PACKAGES), ldflags, bin_dir, list(BINARIES),
                      "kustomize/helm")
    except SandboxBuildError as e:
        raise RendererBuildError(str(e)) from e


def main() -> int:
    try:
        print(ensure_renderers())
    except (RendererBuildError, OSError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
