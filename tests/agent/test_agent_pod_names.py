"""Pods sharing a GPU, named through the real API server (the session sandbox's).

A process's cgroup gives its pod's UID; PodResources gives names without UIDs. The agent joins
them by listing its node's pods; HOSTNAME, the fallback, is wrong for a pod that sets
``spec.hostname``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpusteward.agent.cli import AgentSettings
from gpusteward.sandbox.cluster import Sandbox
from tests.agent.fakes import FakeGpu, FakeKubelet, FakeNvml, Holder, write_proc
from tests.agent.test_agent_app import A, lines, scrape
from tests.e2e.kube import Namespace, gpu_pod

NODE = "l4-0"


def per_pod(text: str) -> dict[str, str]:
    """pod name (or uid:<uid> for a series without a name) -> utilization."""
    out = {}
    for line in lines(text, "gpusteward_pod_gpu_util"):
        labels = line.split("{", 1)[1].rsplit("}", 1)[0]
        pairs = {k: v.strip('"') for k, v in (p.split("=", 1) for p in labels.split(","))}
        out[pairs.get("pod") or f"uid:{pairs['pod_uid']}"] = line.rsplit(" ", 1)[1]
    return out


async def test_the_api_server_names_a_pod_whose_hostname_is_not_its_name(
    sandbox: Sandbox, ns: Namespace, fake_nvml: FakeNvml, kubelet: FakeKubelet, proc_root: Path
) -> None:
    trainer = gpu_pod("train-0", 1, node=NODE)
    trainer["spec"]["hostname"] = "trainer"
    ns.create_pod(trainer)
    ns.create_pod(gpu_pod("nb-1", 1, node=NODE))
    uid_train, uid_nb = (ns.running(name)["metadata"]["uid"] for name in ("train-0", "nb-1"))
    fake_nvml.write([FakeGpu(A, util_gpu=75, process_utilization=[
        {"pid": 101, "sm": 50}, {"pid": 202, "sm": 25}])])
    kubelet.holders = [Holder(ns.name, "train-0", "main", (f"{A}::0",)),
                       Holder(ns.name, "nb-1", "main", (f"{A}::1",))]
    write_proc(proc_root, 101, f"0::/kubepods/besteffort/pod{uid_train}/c\n", "trainer")
    write_proc(proc_root, 202, f"0::/kubepods/besteffort/pod{uid_nb}/c\n", "nb-1")
    base = AgentSettings(node=NODE, interval=3600, pod_resources_socket=str(kubelet.socket_path),
                         proc_root=proc_root, kubeconfig=str(sandbox.kubeconfig))

    named = await scrape(replace(base, kube_api=True))
    guessed = await scrape(replace(base, kube_api=False))

    assert per_pod(named) == {"train-0": "50", "nb-1": "25"}
    assert 'problem="pod_names_from_hostname"' not in named
    # From HOSTNAME alone the trainer's share has only its UID, and the agent says why.
    assert per_pod(guessed) == {f"uid:{uid_train}": "50", "nb-1": "25", "train-0": "0"}
    assert 'gpusteward_agent_problem{problem="pod_names_from_hostname"} 1' in guessed
