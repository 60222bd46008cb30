"""The agent's ``/metrics`` text: dcgm-exporter's families, printed by its own renderer, + ours.

Every DCGM series comes from ``gpusteward.core.dcgm.render_exposition`` (the renderer the
component and e2e tests already check against real dcgm-exporter output), one GPU at a time, so
names, label order and value formats cannot drift. This module only merges the per-GPU texts
family by family, leaves out what a GPU could not report, adds the ``error`` label, and appends
the agent's own families:

* ``gpusteward_pod_gpu_util`` -- a pod's SM utilization on a shared GPU (%), labelled like
  ``DCGM_FI_DEV_GPU_UTIL`` plus ``pod_uid``;
* ``gpusteward_agent_gpu_error`` -- 1 for each GPU NVML could not read, ``error`` says why;
* ``gpusteward_agent_nvml_up`` -- 1 when NVML answered; 0 with ``error`` when it could not;
* ``gpusteward_agent_problem`` -- 1 per degraded part (``pod_resources_unavailable``, ...).
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from gpusteward.agent.collect import AgentGpu, AgentView
from gpusteward.core.dcgm import DEFAULT_NODE_LABEL, SimGpu, render_exposition

__all__ = ["render"]

XID_FAMILY = "DCGM_FI_DEV_XID_ERRORS"
UTIL_FAMILY = "DCGM_FI_DEV_GPU_UTIL"
POD_UTIL_FAMILY = "gpusteward_pod_gpu_util"

_AGENT_FAMILIES = {
    POD_UTIL_FAMILY: "SM utilization of one pod's processes on a shared GPU (in %).",
    "gpusteward_agent_gpu_error": "A GPU NVML could not read in the last collection.",
    "gpusteward_agent_nvml_up": "1 when NVML answered the last collection.",
    "gpusteward_agent_problem": "A degraded part of the last collection.",
}

Families = dict[str, list[str]]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _with_labels(line: str, labels: dict[str, str]) -> str:
    """Append labels to one rendered series line ``name{...} value``."""
    head, _, value = line.rpartition("} ")
    extra = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{head},{extra}}} {value}"


def _split(text: str) -> Families:
    """Rendered exposition -> series lines by family name, in the text's order."""
    families: Families = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = families.setdefault(line.split(" ", 3)[2], [])
        elif line and not line.startswith("#"):
            current.append(line)
    return families


def _render_one(gpu: AgentGpu, driver: str, node_label: str) -> Families:
    # AgentGpu has every attribute the renderer reads (uuid and pci_bus_id as NVML reports them).
    one = cast(SimGpu, gpu)
    return _split(render_exposition([one], driver_version=driver, node_label=node_label))


def _gpu_series(gpu: AgentGpu, driver: str, node_label: str) -> Families:
    rendered = _render_one(gpu, driver, node_label)
    if gpu.error is not None:
        return {XID_FAMILY: [_with_labels(x, {"error": gpu.error}) for x in rendered[XID_FAMILY]]}
    return {name: lines for name, lines in rendered.items() if name not in gpu.missing}


def _pod_util_lines(gpu: AgentGpu, driver: str, node_label: str) -> list[str]:
    lines = []
    for share in gpu.pod_utils:
        one = replace(gpu, pod=share.pod, util_percent=share.util_percent, pod_utils=())
        (line,) = _render_one(one, driver, node_label)[UTIL_FAMILY]
        line = POD_UTIL_FAMILY + line.removeprefix(UTIL_FAMILY)
        lines.append(_with_labels(line, {"pod_uid": share.pod_uid}) if share.pod_uid else line)
    return lines


def _agent_lines(view: AgentView, node_label: str) -> Families:
    errors = [
        f'gpusteward_agent_gpu_error{{gpu="{g.index}",UUID="{_escape(g.uuid)}",'
        f'device="nvidia{g.index}",{node_label}="{_escape(view.node)}",'
        f'error="{_escape(g.error)}"}} 1'
        for g in view.gpus
        if g.error is not None
    ]
    if view.nvml_error is None:
        up = [f'gpusteward_agent_nvml_up{{{node_label}="{_escape(view.node)}"}} 1']
    else:
        up = [
            f'gpusteward_agent_nvml_up{{{node_label}="{_escape(view.node)}",'
            f'error="{_escape(view.nvml_error)}"}} 0'
        ]
    problems = [f'gpusteward_agent_problem{{problem="{_escape(p)}"}} 1' for p in view.problems]
    return {
        "gpusteward_agent_gpu_error": errors,
        "gpusteward_agent_nvml_up": up,
        "gpusteward_agent_problem": problems,
    }


def render(view: AgentView, node_label: str = DEFAULT_NODE_LABEL) -> str:
    """One scrape of the agent's ``/metrics`` (text format 0.0.4)."""
    driver = view.driver_version
    skeleton = render_exposition([], driver_version=driver, node_label=node_label).splitlines()
    families: Families = {line.split(" ", 3)[2]: [] for line in skeleton if line[:7] == "# HELP "}
    for gpu in view.gpus:
        for name, lines in _gpu_series(gpu, driver, node_label).items():
            families[name] += lines
    helps = {line.split(" ", 3)[2]: line for line in skeleton if line.startswith("# HELP ")}
    out: list[str] = []
    for name, lines in families.items():
        out += [helps[name], f"# TYPE {name} gauge", *lines]
    pod_lines = [line for g in view.gpus for line in _pod_util_lines(g, driver, node_label)]
    agent = {POD_UTIL_FAMILY: pod_lines, **_agent_lines(view, node_label)}
    for name, lines in agent.items():
        out += [f"# HELP {name} {_AGENT_FAMILIES[name]}", f"# TYPE {name} gauge", *lines]
    return "\n".join(out) + "\n"
