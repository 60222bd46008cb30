"""Which gpusteward runs: the installed distribution's version, for ``--version`` and the
labels of the ``gpusteward_build_info`` metric (``buildinfo``, which loads prometheus_client;
this module loads only importlib.metadata)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version


def version() -> str:
    try:
        return distribution_version("gpusteward")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
