"""Agent fixtures: the NVML test library (built once, loaded by soname) and a fake kubelet."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.agent.fakes import FakeKubelet, FakeNvml, build_fakenvml, preload


@pytest.fixture(scope="session")
def fakenvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builds the NVML test library and loads it into this process before pynvml looks.

    pynvml opens ``CDLL("libnvidia-ml.so.1")``; a library already loaded with that soname
    satisfies the lookup, so the real binding's ctypes calls land in fakenvml.c.
    """
    out = tmp_path_factory.mktemp("fakenvml")
    preload(build_fakenvml(out))
    return out


@pytest.fixture(scope="session")
def fakenvml_without_v3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library an older driver ships: no nvmlDeviceGetComputeRunningProcesses_v3 symbol."""
    return build_fakenvml(tmp_path_factory.mktemp("fakenvml-old"), "FAKENVML_NO_PROCESSES_V3")


@pytest.fixture
def fake_nvml(fakenvml_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    path = tmp_path / "fakenvml.json"
    monkeypatch.setenv("FAKENVML_CONFIG", str(path))
    nvml = FakeNvml(path)
    nvml.write([])
    return nvml


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths must fit in 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="gsa-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[FakeKubelet]:
    server = FakeKubelet(short_dir / "kubelet.sock")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    return root
