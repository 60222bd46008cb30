"""A run that reaches the e2e tier builds the Go-built tools in the background while the
earlier tiers run (gpusteward.sandbox.prebuild, at the lowest CPU priority); the build stops
with the session. GPUSTEWARD_PREBUILD=0 turns it off. Its log: <cache>/prebuild.log. Under
pytest-xdist only the first worker starts it; the others find its builds done, or wait on a
build's lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpusteward.sandbox.build import cache_root

E2E = Path(__file__).resolve().parents[1] / "e2e"
_BUILDER = pytest.StashKey[subprocess.Popen[bytes]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("GPUSTEWARD_PREBUILD", "1") == "0" or session.config.option.collectonly:
        return
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    if not any(Path(item.path).is_relative_to(E2E) for item in session.items):
        return
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "prebuild.log", "wb") as log:
        session.config.stash[_BUILDER] = subprocess.Popen(
            [sys.executable, "-m", "gpusteward.sandbox.prebuild"], stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    builder = session.config.stash.get(_BUILDER, None)
    if builder is None or builder.poll() is not None:
        return
    os.killpg(builder.pid, signal.SIGTERM)  # its go build too: one process group
    try:
        builder.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(builder.pid, signal.SIGKILL)
        builder.wait()
