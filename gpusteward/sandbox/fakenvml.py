"""The NVML test library: a C ``libnvidia-ml.so.1`` driven by a JSON file of GPUs.

Built from ``sandbox/fakenvml/fakenvml.c`` with the system C compiler. The agent tests load it in
process; the sandbox's agent mode points each agent process at it through ``LD_LIBRARY_PATH``
with its node's file in ``$FAKENVML_CONFIG``. The library re-reads that file on every
``nvmlDeviceGetCount_v2``, so a writer can change the GPUs (or lose one) while agents run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpusteward.sandbox.checkout import REPO
from gpusteward.sandbox.procs import SandboxError

SOURCE = REPO / "sandbox" / "fakenvml" / "fakenvml.c"
SONAME = "libnvidia-ml.so.1"
CONFIG_ENV = "FAKENVML_CONFIG"
MAX_GPUS = 16  # MAXN in fakenvml.c
GIB = 1 << 30

__all__ = ["CONFIG_ENV", "MAX_GPUS", "SONAME", "FakeGpu", "build_fakenvml", "config_text",
           "replace_file", "write_config"]


def build_fakenvml(out_dir: Path, *defines: str) -> Path:
    """Compile fakenvml.c into ``out_dir/libnvidia-ml.so.1`` (soname libnvidia-ml.so.1)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SandboxError("a C compiler (cc) is needed to build the NVML test library")
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / SONAME
    flags = [f"-D{d}" for d in defines]
    done = subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *flags,
         f"-Wl,-soname,{SONAME}", "-o", str(lib), str(SOURCE)],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise SandboxError(f"building {SOURCE.name} failed:\n{done.stderr}")
    return lib


@dataclass
class FakeGpu:
    """One GPU as the library reports it; ``errors`` maps an NVML function (or ``*``) to the
    NVML error it returns, e.g. ``{"*": "GPU_IS_LOST"}``. Each new ``xid_seq`` is one XID event
    with the value ``xid`` for event sets the GPU is registered with."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:07:00.0"
    util_gpu: int = 0
    util_memory: int = 0
    memory_total: int = 80 * GIB
    memory_used: int = 0
    temperature: int = 35
    power_mw: int = 70_000
    processes: list[dict[str, int]] = field(default_factory=list)
    mps_processes: list[dict[str, int]] = field(default_factory=list)  # MPS clients
    process_utilization: list[dict[str, int]] = field(default_factory=list)
    xid: int = 0
    xid_seq: int = 0
    errors: dict[str, str] = field(default_factory=dict)


def config_text(gpus: list[FakeGpu], *, driver_version: str = "550.90.07",
                init_error: str | None = None) -> str:
    if len(gpus) > MAX_GPUS:
        raise SandboxError(f"the NVML test library holds at most {MAX_GPUS} GPUs a node")
    config: dict[str, Any] = {"driver_version": driver_version,
                              "gpus": [asdict(g) for g in gpus]}
    if init_error:
        config["init_error"] = init_error
    return json.dumps(config)


def write_config(path: Path, gpus: list[FakeGpu], *, driver_version: str = "550.90.07",
                 init_error: str | None = None) -> None:
    replace_file(path, config_text(gpus, driver_version=driver_version, init_error=init_error))


def replace_file(path: Path, text: str) -> None:
    """Replace ``path`` atomically: the library never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
