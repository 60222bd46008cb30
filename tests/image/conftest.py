"""Image tier: the Dockerfile built by `make image` (gpusteward/sandbox/image.py) and run with
podman from gpusteward's own container storage. A missing tool fails the tier, never skips it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from gpusteward.sandbox.image import SIZE_BUDGET_MB, Built, ImageBuildError, ensure_image, podman

_BUILT: list[Built] = []


@pytest.fixture(scope="session")
def image() -> Built:
    try:
        built = ensure_image()
    except ImageBuildError as exc:
        pytest.fail(f"the image did not build: {exc}", pytrace=False)
    _BUILT.append(built)
    return built


RunImage = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_image(image: Built) -> RunImage:
    """``run_image(*argv, entrypoint=None, volumes=())``: the image run as the chart's pods run
    it (templates/_helpers.tpl containerSecurity: read-only root, every capability dropped, no
    privilege escalation), with no network, as its user."""

    def run(*argv: str, entrypoint: str | None = None,
            volumes: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        flags = ["--rm", "--read-only", "--read-only-tmpfs=false", "--network", "none",
                 "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        for volume in volumes:
            flags += ["-v", volume]
        if entrypoint:
            flags += ["--entrypoint", entrypoint]
        return podman("run", *flags, image.tag, *argv, check=False)

    return run


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for built in _BUILT:
        terminalreporter.write_line(
            f"image {built.tag}: {built.size_mb:.0f} MB (budget {SIZE_BUDGET_MB} MB), "
            f"version {built.version}, revision {built.revision}")
