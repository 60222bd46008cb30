"""Which gpusteward runs: the package's version and, in the image, the git revision it was built
from, for ``--version`` and the labels of the ``gpusteward_build_info`` metric (``buildinfo``,
which loads prometheus_client; this module loads nothing).

The image's build stamps the revision into ``GPUSTEWARD_REVISION`` (the Dockerfile's
``REVISION`` build argument); an install from a wheel or a checkout has none and says so."""

from __future__ import annotations

import os

from gpusteward import __version__

REVISION_VARIABLE = "GPUSTEWARD_REVISION"


def version() -> str:
    """The version pyproject.toml gives the distribution (it reads ``__version__``)."""
    return __version__


def revision() -> str:
    """The git revision the image was built from; ``unknown`` outside the image."""
    return os.environ.get(REVISION_VARIABLE, "").strip() or "unknown"


def describe() -> str:
    """What ``--version`` prints after ``gpusteward``: the version, and the revision when known."""
    built_from = revision()
    return version() if built_from == "unknown" else f"{version()} (revision {built_from})"
