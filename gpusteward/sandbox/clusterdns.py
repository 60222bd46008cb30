"""Cluster DNS for the pods of real nodes: CoreDNS, as clusters run it, serving ``cluster.local``
from the API server (its kubernetes plugin: Services, their endpoints, pods' A records).

Built from its Go module (sandbox/controllers/coredns, a main with just the plugins used here)
and run as one of the sandbox's processes on the host, bound to every real node's host end
(``10.251.S.1:53``), which each node's kubelet names as its ``clusterDNS``: a pod's resolv.conf
then holds that address and the usual ``<ns>.svc.cluster.local svc.cluster.local cluster.local``
search list. A cluster runs CoreDNS as pods behind the ``kube-dns`` Service (10.96.0.10); here
the kubelet points at it directly. Nothing else is answered (no forwarder): a name outside
``cluster.local`` gets REFUSED, so no pod looks past this machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpusteward.sandbox.controllers import ensure_controller
from gpusteward.sandbox.kubehttp import http_ok
from gpusteward.sandbox.procs import free_port

if TYPE_CHECKING:
    from gpusteward.sandbox.cluster import Sandbox

DOMAIN = "cluster.local"


def corefile(addresses: list[str], ready_port: int, kubeconfig: str) -> str:
    """The Corefile: one server block for the cluster domain, on the given addresses."""
    return (f"{DOMAIN}:53 {{\n"
            f"    bind {' '.join(addresses)}\n"
            f"    ready 127.0.0.1:{ready_port}\n"
            f"    errors\n"
            f"    kubernetes {DOMAIN} {{\n"
            f"        kubeconfig {kubeconfig}\n"
            f"    }}\n"
            f"}}\n")


def start_dns(box: Sandbox, addresses: list[str]) -> None:
    """Start CoreDNS on ``addresses``; returns once its kubernetes plugin has synced."""
    binary = ensure_controller("coredns", log=box.cfg.log)
    port = box.ports.setdefault("coredns-ready", free_port())
    config = box.dir / "Corefile"
    config.write_text(corefile(addresses, port, str(box.kubeconfig)))
    box.run_process("coredns", [str(binary), "-conf", str(config)],
                    lambda: http_ok(f"http://127.0.0.1:{port}/ready"))
