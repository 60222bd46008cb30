"""``gpusteward agent`` as a process: what the dynamic loader finds decides what happens.

These run the agent in a subprocess because the library pynvml loads is fixed per process:
none at all (the real ``CDLL`` failure, ``NVMLError_LibraryNotFound``) or an older library that
lacks ``nvmlDeviceGetComputeRunningProcesses_v3`` (the real ``NVMLLibraryMismatchError``).
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpusteward.sandbox.procs import free_port
from tests.agent.fakes import GIB, FakeGpu, FakeNvml

REPO = Path(__file__).resolve().parents[2]
A = "GPU-c89b14a3-ce7c-6725-8424-b55d37d9c332"


def agent_env(library_dir: Path, config: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "FAKENVML_CONFIG")}
    env["LD_LIBRARY_PATH"] = str(library_dir)
    env["PYTHONPATH"] = str(REPO)
    if config is not None:
        env["FAKENVML_CONFIG"] = str(config)
    return env



def agent(*flags: str) -> list[str]:
    return [sys.executable, "-m", "gpusteward", "agent", "--node-name", "gpu-node-1", *flags]


@contextmanager
def serving(flags: list[str], env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(agent("--listen", f"127.0.0.1:{port}", *flags), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    yield response.read().decode()
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    output = proc.communicate()[0]
                    raise AssertionError(f"agent did not serve:\n{output}") from None
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def no_nvml(tmp_path: Path) -> Path:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this host has a real libnvidia-ml; the loader would find it")
    empty = tmp_path / "empty"
    empty.mkdir()
    return empty


def test_without_the_library_the_agent_exits_non_zero_and_says_so(no_nvml: Path) -> None:
    done = subprocess.run(agent("--on-missing-driver", "exit"), env=agent_env(no_nvml),
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 1
    assert "NVML unavailable on gpu-node-1 (library_not_found)" in done.stderr


def test_without_the_library_serve_error_keeps_serving_the_error_metric(no_nvml: Path) -> None:
    with serving(["--on-missing-driver", "serve-error"], agent_env(no_nvml)) as text:
        pass

    assert 'gpusteward_agent_nvml_up{Hostname="gpu-node-1",error="library_not_found"} 0' in text


def test_an_older_library_without_a_v3_symbol_is_a_mismatch_not_a_crash(
    fakenvml_without_v3: Path, tmp_path: Path
) -> None:
    nvml = FakeNvml(tmp_path / "gpus.json")
    nvml.write([FakeGpu(A, util_gpu=64, processes=[{"pid": 1, "used_memory": GIB}])])
    env = agent_env(fakenvml_without_v3.parent, nvml.path)

    with serving(["--pod-resources-socket", str(tmp_path / "none.sock")], env) as text:
        pass

    assert 'gpusteward_agent_problem{problem="library_mismatch"} 1' in text
    assert f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{A}"' in text


def test_without_a_node_name_the_agent_refuses_to_start(tmp_path: Path) -> None:
    env = agent_env(tmp_path)
    done = subprocess.run([sys.executable, "-m", "gpusteward", "agent"], env=env,
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 2
    assert "--node-name or $NODE_NAME is required" in done.stderr
