"""The agent's ``/metrics`` text: dcgm-exporter's families, built by the core's builder, + ours.

Every DCGM series comes from ``gpusteward.core.dcgm.sample`` (the builder the sandbox's DCGM
simulator uses, checked by the component and e2e tests against real dcgm-exporter output), so
names, label order and value formats cannot drift. This module only leaves out what a GPU could
not report, adds the ``error`` label, and adds the agent's own families:

* ``gpusteward_pod_gpu_util`` -- a pod's SM utilization on a shared GPU (%), labelled like
  ``DCGM_FI_DEV_GPU_UTIL`` plus ``pod_uid``;
* ``gpusteward_agent_gpu_error`` -- 1 for each GPU NVML could not read, ``error`` says why;
* ``gpusteward_agent_nvml_up`` -- 1 when NVML answered; 0 with ``error`` when it could not;
* ``gpusteward_agent_problem`` -- 1 per degraded part (``pod_resources_unavailable``, ...).
"""

from __future__ import annotations

from dataclasses import replace

from gpusteward.agent.collect import AgentGpu, AgentView
from gpusteward.core.dcgm import (
    DCGM_FIELDS,
    DEFAULT_NODE_LABEL,
    GPU_UTIL,
    XID_ERRORS,
    Family,
    Field,
    Sample,
    render_text,
    sample,
)

__all__ = ["render"]

POD_UTIL_FAMILY = "gpusteward_pod_gpu_util"
_UTIL_FIELD = next(f for f in DCGM_FIELDS if f.name == GPU_UTIL)


def _dcgm_sample(field: Field, gpu: AgentGpu, driver: str, node_label: str) -> Sample | None:
    """What the exporter would print; a GPU NVML could not read prints its XID, with why."""
    if (gpu.error is not None and field.name != XID_ERRORS) or field.name in gpu.missing:
        return None
    printed = sample(field, gpu, driver_version=driver, node_label=node_label)
    if printed is not None and gpu.error is not None:
        return printed.with_labels(error=gpu.error)
    return printed


def _dcgm_families(view: AgentView, node_label: str) -> list[Family]:
    driver = view.driver_version
    return [
        Family(field.name, field.help, tuple(
            s for g in view.gpus if (s := _dcgm_sample(field, g, driver, node_label))))
        for field in DCGM_FIELDS
    ]


def _pod_utils(view: AgentView, node_label: str) -> tuple[Sample, ...]:
    """Per pod sharing a GPU, its utilization labelled as the GPU's, for that pod."""
    out = []
    for gpu in view.gpus:
        for share in gpu.pod_utils:
            one = replace(gpu, pod=share.pod, util_percent=share.util_percent, pod_utils=())
            s = sample(_UTIL_FIELD, one, driver_version=view.driver_version,
                       node_label=node_label)
            if s is not None:  # always: the agent reads whole GPUs, never MIG instances
                out.append(s.with_labels(pod_uid=share.pod_uid) if share.pod_uid else s)
    return tuple(out)


def _agent_families(view: AgentView, node_label: str) -> list[Family]:
    errors = tuple(
        Sample((("gpu", str(g.index)), ("UUID", g.uuid), ("device", f"nvidia{g.index}"),
                (node_label, view.node), ("error", g.error)), "1")
        for g in view.gpus
        if g.error is not None
    )
    node = ((node_label, view.node),)
    if view.nvml_error is None:
        up = Sample(node, "1")
    else:
        up = Sample((*node, ("error", view.nvml_error)), "0")
    problems = tuple(Sample((("problem", p),), "1") for p in view.problems)
    return [
        Family(POD_UTIL_FAMILY, "SM utilization of one pod's processes on a shared GPU (in %).",
               _pod_utils(view, node_label)),
        Family("gpusteward_agent_gpu_error",
               "A GPU NVML could not read in the last collection.", errors),
        Family("gpusteward_agent_nvml_up", "1 when NVML answered the last collection.", (up,)),
        Family("gpusteward_agent_problem", "A degraded part of the last collection.", problems),
    ]


def render(view: AgentView, node_label: str = DEFAULT_NODE_LABEL) -> str:
    """One scrape of the agent's ``/metrics`` (text format 0.0.4)."""
    return render_text(_dcgm_families(view, node_label) + _agent_families(view, node_label))
