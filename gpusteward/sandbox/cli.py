"""`gpusteward sandbox up|down|status|env`: a local cluster of real Kubernetes components.

Flags only, loaded only when the command line names `sandbox`; ``sandbox.commands.run``
runs them.
"""

from __future__ import annotations

import argparse

from gpusteward.adapters.connectflags import whole_number

# What `--with` offers: the keys of sandbox.controllers.CONTROLLERS, which builds them (a test
# holds the two equal; that module loads the build machinery, which a flag should not).
CONTROLLER_NAMES = ("kueue", "kuberay", "jobset", "trainer", "keda")


def _controllers(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in CONTROLLER_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown controller {', '.join(unknown)} (known: "
                                         f"{', '.join(CONTROLLER_NAMES)})")
    return names


def add_sandbox_flags(sb: argparse.ArgumentParser) -> None:
    sb_sub = sb.add_subparsers(dest="sandbox_command", required=True)
    up = sb_sub.add_parser("up", help="build what is missing and start the sandbox")
    up.add_argument("--fleet", help="fleet YAML file (default: a mixed H100/A100/L4 fleet)")
    up.add_argument("--with-extender", action="store_true",
                    help="run the extender behind the real kube-scheduler")
    up.add_argument("--extender-replicas", type=whole_number(1), default=1, metavar="N",
                    help="run N extender processes behind one loopback address with ClientIP "
                         "affinity, as a Service with sessionAffinity reaches them (default 1)")
    up.add_argument("--with-reclaimer", action="store_true", help="run the reclaimer too")
    up.add_argument("--real-nodes", type=whole_number(0), default=0, metavar="N",
                    help="also run N real nodes (kubelet, containerd, runc, CNI) that run pods "
                         "from the locally built image, beside the simulated GPU nodes "
                         "(needs root; builds the image on first use)")
    up.add_argument("--with", dest="controllers", type=_controllers, default=(),
                    metavar="NAME[,NAME]", help="start workload controllers too, built from Go "
                    "modules on first use: kueue, kuberay, jobset, trainer (brings jobset), "
                    "keda")
    up.add_argument("--no-preemption", action="store_true",
                    help="disable the scheduler's DefaultPreemption (on by default, as in real "
                         "clusters): waiting pods are left to queue enforcement alone")
    up.add_argument("--telemetry", choices=("simulator", "agent"), default="simulator",
                    help="GPU metrics from the DCGM simulator (default) or from a real "
                         "`gpusteward agent` per node over the NVML test library")
    up.add_argument("--honor-labels", action="store_true",
                    help="scrape GPU metrics with honor_labels: true (default false, like "
                         "dcgm-exporter's ServiceMonitor): the exporter's pod labels win")
    up.add_argument("--policy", help="policy for the extender/reclaimer (default: the example)")
    up.add_argument("--state-dir", help="where the sandbox keeps its files and logs")
    for name, text in (("down", "stop every process the sandbox started"),
                       ("status", "show what runs"),
                       ("env", "print export lines for KUBECONFIG and PROMETHEUS_URL")):
        p = sb_sub.add_parser(name, help=text)
        p.add_argument("--state-dir", help="the sandbox's state directory")
