"""The sandbox is a development command: it runs from a checkout of the repository.

``gpusteward sandbox up`` builds the control plane from ``sandbox/go`` (with Go), the NVML test
library from ``sandbox/fakenvml`` (with a C compiler), starts Debian's Prometheus, configures
the scheduler from ``deploy/scheduler`` and reads ``sandbox/policy.yaml``. An installed package
has none of these, by design: the image (``.dockerignore`` leaves ``sandbox/`` and ``deploy/``
out) carries what runs in a cluster, and shipping the sources would not bring the toolchains.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["NEEDED", "REPO", "missing_from_checkout"]

REPO = Path(__file__).resolve().parents[2]  # the checkout's root, when run from one
# What `sandbox up` reads from the checkout (paths relative to its root).
NEEDED = (
    "sandbox/go/go.mod",
    "sandbox/fakenvml/fakenvml.c",
    "sandbox/policy.yaml",
    "deploy/scheduler/kube-scheduler-config.yaml",
    "deploy/scheduler/hami-scheduler-config.yaml",
)


def missing_from_checkout(root: Path | None = None) -> str | None:
    """One line saying why the sandbox cannot start here, or None in a checkout."""
    root = REPO if root is None else root
    absent = [p for p in NEEDED if not (root / p).is_file()]
    if not absent:
        return None
    return (f"a development command: run it from a checkout of the gpusteward repository "
            f"({root} has no {absent[0]}); installed packages and the image do not carry it")
