"""The ``gpusteward_build_info`` metric every component serves (as kube-state-metrics and
dcgm-exporter serve theirs), so a dashboard can tell a rollout half done; its version label is
the one ``--version`` prints (``adapters.version``), its revision the git commit the image was
built from (``unknown`` outside the image)."""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from gpusteward.adapters.version import revision, version

NAME = "gpusteward_build_info"
HELP = "Always 1; the labels say which gpusteward version, revision and Python run."


def register(registry: CollectorRegistry) -> None:
    Gauge(NAME, HELP, ["version", "revision", "python_version"], registry=registry).labels(
        version(), revision(), platform.python_version()).set(1)


def exposition() -> str:
    """The metric alone in the text format, for an app that renders its own ``/metrics``."""
    registry = CollectorRegistry()
    register(registry)
    return generate_latest(registry).decode()
