"""The sandbox: real etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from
Go modules), kwok for fake GPU nodes, the DCGM simulator, a real Prometheus, and optionally the
extender behind the scheduler — all on loopback, all stopped by `stop()` or `sandbox down`.

GPU telemetry comes from one of two sources (``SandboxConfig.telemetry``): ``simulator``, the
DCGM simulator's own dcgm-exporter endpoint, or ``agent``, one real ``gpusteward agent`` per GPU
node reading the NVML test library and a kubelet PodResources socket that the simulator keeps
true to the same GPUs (``gpusteward.sandbox.gpuhosts``). Prometheus scrapes whichever is chosen
the way a Prometheus Operator ServiceMonitor does: one target per node's exporter, labelled with
the exporter pod's namespace/service/pod/container/endpoint/job (``gpusteward.sandbox.scrape``),
``honor_labels`` false unless ``SandboxConfig.honor_labels``.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from gpusteward.core.model import CLASS_KEY, TEAM_LABEL
from gpusteward.sandbox import dra
from gpusteward.sandbox.build import ensure_binaries
from gpusteward.sandbox.checkout import REPO
from gpusteward.sandbox.clusterdns import start_dns
from gpusteward.sandbox.controllers import STARTERS, prometheus_binaries, with_needs
from gpusteward.sandbox.fakenvml import CONFIG_ENV, build_fakenvml
from gpusteward.sandbox.fleet import DEFAULT_FLEET, Fleet, Pool, node_objects
from gpusteward.sandbox.gpuhosts import config_path, socket_path
from gpusteward.sandbox.hamimon import HAMI_MONITOR
from gpusteward.sandbox.ksm import scrape_job as ksm_scrape_job
from gpusteward.sandbox.kubehttp import KubeHTTP, http_ok, node_ready, wait_for
from gpusteward.sandbox.podresources import check_socket_path
from gpusteward.sandbox.procs import Proc, SandboxError, free_port, stop_pid
from gpusteward.sandbox.realnode import (
    SERVICE_CIDR,
    RealNode,
    Slot,
    node_images,
    route_services,
    start_node,
    teardown,
)
from gpusteward.sandbox.scrape import (
    AGENT,
    DCGM_EXPORTER,
    hami_monitor_path,
    scrape_config,
    simulator_path,
)

SCHEDULER_CONFIG = REPO / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
HAMI_SCHEDULER_CONFIG = REPO / "deploy" / "scheduler" / "hami-scheduler-config.yaml"
SANDBOX_POLICY = REPO / "sandbox" / "policy.yaml"
OPEN_PATHS = "/healthz,/readyz,/livez,/metrics"  # loopback only: no auth on health and metrics
# The Workload API's gates (SandboxConfig.workload_api): GangScheduling needs GenericWorkload.
WORKLOAD_GATES = ("GenericWorkload", "GangScheduling")
PROMETHEUS_USER = "gpusteward-sandbox:prometheus"  # its service discovery on real nodes
STOP_ORDER = ("reclaimer", "kueue", "kuberay", "trainer", "jobset", "keda", "scheduler",
              "extender", "noopextender", "prometheus", "agent", "simulator", "ksm", "coredns",
              "node", "kwok", "controller-manager", "apiserver", "etcd")
AGENT_INTERVAL_S = 1  # NVML reads a second, like the simulator's 1 s scrapes
# The simulator's XIDs last as long as a node's label; its GPU hosts repeat the event every
# 0.5 s meanwhile, so a 2 s hold shows the XID exactly that long (+2 s).
AGENT_XID_HOLD_S = 2
# The simulator's gauge keeps the last XID, as dcgm-exporter's does; the sandbox enables the
# exporter's windowed DCGM_EXP_XID_ERRORS_COUNT, so a node heals once its label goes.
EXPORTER_XID_COUNT_WINDOW_S = 2
# The pod labels kube-state-metrics is told to keep (--metric-labels-allowlist): team and class.
KSM_LABELS = (TEAM_LABEL, CLASS_KEY)
AGENT_PREFIX = "agent/"  # process names "agent/<node>", stopped in the "agent" slot
REPLICA_PREFIX = "extender/"  # extender replicas behind the "extender" proxy, same stop slot


def stop_order(names: list[str]) -> list[str]:
    """Process names in STOP_ORDER, each agent in the "agent" slot. A name it does not know
    comes first, with the API server's other clients: one left out would never be stopped."""
    slot = {name: i for i, name in enumerate(STOP_ORDER)}
    return sorted(names, key=lambda n: slot.get(n.split("/")[0], -1))


@dataclass
class SandboxConfig:
    state_dir: Path
    fleet: Fleet = DEFAULT_FLEET
    with_extender: bool = False
    # More than one: that many extender processes behind one loopback address, reached through
    # gpusteward.sandbox.affinity as kube-proxy reaches a Service's pods, with this affinity.
    extender_replicas: int = 1
    extender_affinity: str = "ClientIP"
    with_reclaimer: bool = False
    # Optional workload controllers (gpusteward.sandbox.controllers), built on first use.
    with_controllers: tuple[str, ...] = ()
    policy: Path = SANDBOX_POLICY
    node_cache_capable: bool = True
    # The scheduler's DefaultPreemption, on as in real clusters; off leaves waiting pods to
    # gpusteward's queue enforcement alone. preempt_verb: whether the extender steers it.
    preemption: bool = True
    preempt_verb: bool = True
    # The extender's managedResources: kube-scheduler sends only pods that ask one of them.
    # Off, it sends every pod, so pods whose GPUs come from DRA claims alone reach it too.
    managed_resources: bool = True
    scrape_interval: str = "1s"
    # The URL the scheduler calls as its extender: gpusteward's (None) or another one, such as
    # the benchmark's protocol floor (start_protocol_floor).
    scheduler_extender_url: str | None = None
    # kube-scheduler --feature-gates, e.g. {"OpportunisticBatching": False}.
    scheduler_feature_gates: dict[str, bool] = field(default_factory=dict)
    # The Workload API of the pinned release (alpha in 1.36, pkg/features/kube_features.go):
    # the GenericWorkload and GangScheduling gates on every component, scheduling.k8s.io/
    # v1alpha2 served (PodGroup, Workload), and so the scheduler's GangScheduling plugin in its
    # default profile (pkg/scheduler/apis/config/v1/default_plugins.go), beside the extender.
    workload_api: bool = False
    reclaimer_mode: str | None = None  # None: the policy's reclaim.mode
    telemetry: str = "simulator"  # or "agent": NVML agents per node (see the module docstring)
    # The ServiceMonitor's honorLabels: false (dcgm-exporter's chart default) stores the
    # workload's pod labels as exported_*; true keeps them, and puts the exporter's own pod on
    # GPUs no pod holds.
    honor_labels: bool = False
    # True for `sandbox up`: the processes outlive the command. Otherwise they die with it,
    # so a killed test run or demo leaves nothing behind.
    detach: bool = False
    # Real nodes (gpusteward.sandbox.realnode) beside the kwok ones: kubelet, containerd, runc
    # and CNI running pods from the locally built image; named real-0, real-1, ...
    real_nodes: int = 0
    log: Any = print


@dataclass
class Sandbox:
    cfg: SandboxConfig
    procs: dict[str, Proc] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    real_nodes: dict[str, RealNode] = field(default_factory=dict)
    scrapes: list[dict[str, Any]] = field(default_factory=list)  # beyond telemetry and KSM

    # --- paths and endpoints ------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.cfg.state_dir

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['extender']}"

    @property
    def simulator_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['simulator']}"

    @property
    def hosts_dir(self) -> Path:
        return self.dir / "gpuhosts"

    def agent_urls(self) -> dict[str, str]:
        """Each GPU node's agent (agent telemetry only)."""
        return {name.removeprefix(AGENT_PREFIX): f"http://127.0.0.1:{port}"
                for name, port in self.ports.items() if name.startswith(AGENT_PREFIX)}

    def gpu_nodes(self) -> list[str]:
        return [name for pool in self.cfg.fleet.pools if pool.gpus > 0
                for name in pool.node_names()]

    def telemetry_scrape(self) -> dict[str, Any]:
        """Prometheus's job over every GPU node's exporter: the simulator's per-node endpoint,
        or the node's agent."""
        if self.cfg.telemetry == "agent":
            targets = {node: (url.removeprefix("http://"), "/metrics")
                       for node, url in self.agent_urls().items()}
            return scrape_config(AGENT, targets, self.cfg.honor_labels)
        address = f"127.0.0.1:{self.ports['simulator']}"
        return scrape_config(DCGM_EXPORTER, {n: (address, simulator_path(n))
                                             for n in self.gpu_nodes()}, self.cfg.honor_labels)

    def hami_scrape(self) -> list[dict[str, Any]]:
        """HAMi's vGPU monitors on the HAMi nodes, if any, with the ``node`` target label a
        ServiceMonitor relabeling of ``__meta_kubernetes_pod_node_name`` adds (docs/install.md,
        "HAMi"): no monitor pod runs here for its name to say where it is."""
        nodes = [n for pool in self.cfg.fleet.pools if pool.hami for n in pool.node_names()]
        if not nodes:
            return []
        address = f"127.0.0.1:{self.ports['simulator']}"
        job = scrape_config(HAMI_MONITOR, {n: (address, hami_monitor_path(n)) for n in nodes},
                            self.cfg.honor_labels)
        for target, node in zip(job["static_configs"], sorted(nodes), strict=True):
            target["labels"]["node"] = node
        return [job]

    def api(self) -> KubeHTTP:
        return KubeHTTP(self.api_url, self.token)

    def env_lines(self) -> list[str]:
        return [f"export KUBECONFIG={self.kubeconfig}",
                f"export PROMETHEUS_URL={self.prometheus_url}"]

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> Sandbox:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        started = time.monotonic()
        self.bin = ensure_binaries(log=self.cfg.log)
        for sub in ("logs", "pki", "etcd"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in
                      ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler",
                       "simulator", "ksm", "prometheus", "extender", "reclaimer")}
        self._write_credentials()
        self._start_etcd()
        self._start_apiserver()
        self._start_controller_manager()
        self._start_kwok()
        self.create_fleet(self.cfg.fleet)
        self._start_real_nodes()
        self._start_simulator()
        self._start_ksm()
        if self.cfg.telemetry == "agent":
            self._start_agents()
        self.start_prometheus()
        if self.cfg.with_extender:
            self.start_extender()
        self.start_scheduler()
        for name in with_needs(self.cfg.with_controllers):
            STARTERS[name](self)
        if self.cfg.with_reclaimer:
            self.start_reclaimer()
        self.save()
        self.cfg.log(f"sandbox up in {time.monotonic() - started:.1f}s (state: {self.dir})")

    def stop(self) -> None:
        for node in list(self.real_nodes.values()):
            teardown(node.slot)
            self.real_nodes.pop(node.name)
        for name in stop_order(list(self.procs)):
            self.procs.pop(name).stop()
        state = self.dir / "state.json"
        if state.exists():
            state.unlink()

    def save(self) -> None:
        state = {"token": self.token, "ports": self.ports,
                 "pids": {name: p.pid for name, p in self.procs.items()},
                 "kubeconfig": str(self.kubeconfig),
                 "real_nodes": {name: node.slot.index for name, node in self.real_nodes.items()},
                 "prometheus_url": self.prometheus_url if "prometheus" in self.ports else None}
        (self.dir / "state.json").write_text(json.dumps(state, indent=2))

    # --- components ---------------------------------------------------------------------
    def run_process(self, name: str, argv: list[str], ready, timeout: float = 90.0,
                    env: dict[str, str] | None = None) -> Proc:
        return self._run(name, argv, ready, timeout, env)

    def _run(self, name: str, argv: list[str], ready, timeout: float = 90.0,
             env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.dir / "logs" / f"{name}.log",
                    die_with_parent=not self.cfg.detach, env=env or {})
        self.procs[name] = proc.start()
        self.save()  # on record at once: `sandbox down` stops what was started after `up` too
        proc.wait_ready(ready, timeout)
        return proc

    def _k8s(self, *args: str) -> list[str]:
        return [str(self.bin / "k8s"), *args]

    def real_node_names(self) -> list[str]:
        return [f"real-{i}" for i in range(self.cfg.real_nodes)]

    def _node_token(self, name: str) -> str:
        """The kubelet's bearer token: user system:node:NAME in system:nodes, so the Node
        authorizer gives it what a kubelet may do, and no more."""
        return hashlib.sha256(f"{self.token}/{name}".encode()).hexdigest()[:32]

    def prometheus_sd_token(self) -> str:
        return self._node_token(PROMETHEUS_USER)

    def _write_credentials(self) -> None:
        lines = [f'{self.token},admin,admin-uid,"system:masters"']
        lines += [f'{self._node_token(n)},system:node:{n},node-{n},"system:nodes"'
                  for n in self.real_node_names()]
        if self.cfg.real_nodes:  # bound to system:node-proxier by the API server's defaults
            lines.append(f"{self._node_token('kube-proxy')},system:kube-proxy,kube-proxy")
            # Prometheus's service discovery of the pods on real nodes (gpusteward.sandbox.chart
            # binds it the rights kube-prometheus gives its Prometheus).
            lines.append(f"{self.prometheus_sd_token()},{PROMETHEUS_USER},prometheus")
        (self.dir / "tokens.csv").write_text("\n".join(lines) + "\n")
        key = self.dir / "pki" / "sa.key"
        if not key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True,
                           capture_output=True)
        self.kubeconfig.write_text(yaml.safe_dump(self._kubeconfig_dict()))

    def _kubeconfig_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "sandbox",
            "clusters": [{"name": "sandbox", "cluster": {
                "server": f"https://127.0.0.1:{self.ports['apiserver']}",
                "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "admin"}}],
        }

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._run("etcd", self._k8s(
            "etcd", "--name=sandbox", f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=sandbox={peer}", "--unsafe-no-fsync=true",
            "--log-level=warn"), lambda: http_ok(f"{client}/health"))

    def _start_apiserver(self) -> None:
        key = self.dir / "pki" / "sa.key"
        self._run("apiserver", self._k8s(
            "apiserver", f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}", f"--cert-dir={self.dir / 'pki'}",
            f"--token-auth-file={self.dir / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={key}", f"--service-account-signing-key-file={key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            # Real nodes' names resolve nowhere: logs and exec dial their InternalIP.
            "--kubelet-preferred-address-types=InternalIP",
            "--endpoint-reconciler-type=none", *self._admission(),
            "--enable-priority-and-fairness=false", "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0", "-v=1", *self._workload_api(runtime=True)),
            lambda: http_ok(f"{self.api_url}/readyz", self.token), timeout=120)
        wait_for("namespace default", lambda: self.api().exists("/api/v1/namespaces/default"))

    def _admission(self) -> list[str]:
        """Without real nodes no pod runs, and ServiceAccount admission would refuse pods made
        before the namespace's default ServiceAccount: off. Real nodes' pods need their
        ServiceAccount's token for in-cluster config: on."""
        return [] if self.cfg.real_nodes else ["--disable-admission-plugins=ServiceAccount"]

    def _start_controller_manager(self) -> None:
        port = self.ports["controller-manager"]
        self._run("controller-manager", self._k8s(
            "controller-manager", f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--service-account-private-key-file={self.dir / 'pki' / 'sa.key'}",
            f"--root-ca-file={self.dir / 'pki' / 'apiserver.crt'}",
            "--use-service-account-credentials=false", "--controllers=*,-nodeipam",
            # The default 20 QPS lifts the not-ready taint off ~4 new nodes a second.
            "--kube-api-qps=300", "--kube-api-burst=600",
            f"--authorization-always-allow-paths={OPEN_PATHS}",
            "--concurrent-gc-syncs=5", "-v=1", *self._workload_api()),
            lambda: http_ok(f"https://127.0.0.1:{port}/healthz"))

    def _workload_api(self, runtime: bool = False) -> list[str]:
        if not self.cfg.workload_api:
            return []
        return [f"--feature-gates={','.join(f'{g}=true' for g in WORKLOAD_GATES)}",
                *(["--runtime-config=scheduling.k8s.io/v1alpha2=true"] if runtime else [])]

    def _kwok_stages(self) -> Path:
        """kwokctl's default Stages without pod-complete: in the sandbox a Job's GPU pod runs
        until it is suspended or deleted, like a training run that would last for hours."""
        text = subprocess.run([str(self.bin / "kwok"), "default-stages", "--lease"], check=True,
                              capture_output=True, text=True).stdout
        docs = [d for d in text.split("\n---\n") if "name: pod-complete" not in d]
        path = self.dir / "kwok-stages.yaml"
        path.write_text("\n---\n".join(docs))
        return path

    def _start_kwok(self) -> None:
        self._run("kwok", [
            str(self.bin / "kwok"), f"--kubeconfig={self.kubeconfig}",
            f"--config={self._kwok_stages()}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--manage-nodes-with-label-selector=", "--manage-single-node=",
            "--cidr=10.244.0.1/16", "--node-ip=10.0.0.1", "--node-lease-duration-seconds=40",
        ], lambda: True)

    def create_fleet(self, fleet: Fleet) -> None:
        api = self.api()
        for obj in node_objects(fleet):
            api.apply(f"/api/v1/nodes/{obj['metadata']['name']}", obj)
        names = {obj["metadata"]["name"] for obj in node_objects(fleet)}
        self._publish_dra(fleet)

        def all_ready() -> bool:
            ready = {n["metadata"]["name"] for n in api.get("/api/v1/nodes")["items"]
                     if node_ready(n) and not _not_ready_taint(n)}
            return names <= ready

        # Ready (kwok) and untainted (the node lifecycle controller lifts not-ready a few
        # seconds later): only then will the scheduler place pods there.
        wait_for("the fleet to be Ready and schedulable", all_ready, timeout=180)

    def _publish_dra(self, fleet: Fleet) -> None:
        """The DRA pools' ResourceSlices, and NVIDIA's DeviceClasses once there is one."""
        slices = dra.fleet_slices(fleet)
        api = self.api()
        for obj in dra.device_classes() if slices else ():
            api.apply(f"{dra.RESOURCE_API}/deviceclasses/{obj['metadata']['name']}", obj)
        for obj in slices:
            api.apply(f"{dra.RESOURCE_API}/resourceslices/{obj['metadata']['name']}", obj)

    def _start_real_nodes(self) -> None:
        if not self.cfg.real_nodes:
            return
        started = time.monotonic()
        pause, archives = node_images(self.cfg.log)
        for name in self.real_node_names():
            start_node(self, name, self._node_token(name), self._node_token("kube-proxy"),
                       pause, archives)
        first = self.real_nodes[self.real_node_names()[0]]
        self._publish_api_endpoint(first.slot.host_ip)
        start_dns(self, [node.slot.host_ip for node in self.real_nodes.values()])
        if not route_services(first):
            self.cfg.log(f"the host cannot reach this sandbox's ClusterIPs: another sandbox's "
                         f"real nodes hold the route for {SERVICE_CIDR}")
        self.cfg.log(f"{self.cfg.real_nodes} real node(s) Ready in "
                     f"{time.monotonic() - started:.1f}s")

    def _publish_api_endpoint(self, address: str) -> None:
        """The kubernetes Service's endpoint, which --endpoint-reconciler-type=none leaves to
        us: the relay on the first real node's host end, so in-cluster clients reach the API
        server at 10.96.0.1:443 through kube-proxy."""
        self.api().apply(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes", {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes", "namespace": "default", "labels": {
                    "kubernetes.io/service-name": "kubernetes",
                    "endpointslice.kubernetes.io/managed-by": "gpusteward-sandbox"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": self.ports["apiserver"],
                           "protocol": "TCP"}]})

    def _start_simulator(self) -> None:
        port = self.ports["simulator"]
        argv = [sys.executable, "-m", "gpusteward.sandbox.simulator",
                f"--kubeconfig={self.kubeconfig}", f"--listen=127.0.0.1:{port}",
                f"--xid-count-window={EXPORTER_XID_COUNT_WINDOW_S}"]
        if self.cfg.telemetry == "agent":
            longest = max((n for pool in self.cfg.fleet.pools for n in pool.node_names()),
                          key=len, default="")
            check_socket_path(socket_path(self.hosts_dir, longest))
            argv.append(f"--hosts-dir={self.hosts_dir}")
        self._run("simulator", argv, lambda: http_ok(f"{self.simulator_url}/health"))

    def _start_ksm(self) -> None:
        """The kube-state-metrics stand-in (pod series for ``gpusteward whatif``)."""
        self._run("ksm", [sys.executable, "-m", "gpusteward.sandbox.ksm",
                          f"--kubeconfig={self.kubeconfig}",
                          f"--listen=127.0.0.1:{self.ports['ksm']}",
                          f"--metric-labels-allowlist=pods=[{','.join(KSM_LABELS)}]"],
                  lambda: http_ok(f"http://127.0.0.1:{self.ports['ksm']}/healthz"))

    def _start_agents(self) -> None:
        """One `gpusteward agent` per GPU node, all started before any is waited for."""
        # MIG pools have no agent: it reads whole GPUs (docs/agent.md); dcgm-exporter serves MIG.
        nodes = [name for pool in self.cfg.fleet.pools if pool.gpus > 0 and pool.mig is None
                 for name in pool.node_names()]
        self.procs["simulator"].wait_ready(
            lambda: all(config_path(self.hosts_dir, n).exists()
                        and socket_path(self.hosts_dir, n).exists() for n in nodes), timeout=30)
        library = build_fakenvml(self.hosts_dir / "lib")
        started = []
        for node in nodes:
            name = AGENT_PREFIX + node
            port = self.ports[name] = free_port()
            proc = Proc(name, [
                sys.executable, "-m", "gpusteward", "agent", f"--node-name={node}",
                f"--listen=127.0.0.1:{port}", f"--interval={AGENT_INTERVAL_S}",
                f"--xid-hold={AGENT_XID_HOLD_S}",
                f"--kubeconfig={self.kubeconfig}",
                f"--pod-resources-socket={socket_path(self.hosts_dir, node)}",
            ], self.dir / "logs" / f"agent-{node}.log", die_with_parent=not self.cfg.detach,
                env={"LD_LIBRARY_PATH": str(library.parent),
                     CONFIG_ENV: str(config_path(self.hosts_dir, node))})
            self.procs[name] = proc.start()
            self.save()  # on record at once, as _run does
            started.append((proc, f"http://127.0.0.1:{port}/healthz"))
        for proc, health in started:
            proc.wait_ready(partial(http_ok, health))

    def _write_prometheus_config(self) -> Path:
        config = self.dir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": self.cfg.scrape_interval,
                       "evaluation_interval": self.cfg.scrape_interval},
            "scrape_configs": [self.telemetry_scrape(), *self.hami_scrape(),
                               ksm_scrape_job(f"127.0.0.1:{self.ports['ksm']}"),
                               *self.scrapes],
        }))
        return config

    def add_pool(self, pool: Pool) -> None:
        """More GPU nodes in a running sandbox (simulator telemetry): created, Ready, and their
        exporters scraped (Prometheus reloads its config on SIGHUP)."""
        self.cfg.fleet = Fleet(pools=[*self.cfg.fleet.pools, pool])
        self.create_fleet(Fleet(pools=[pool]))
        self._reload_prometheus()

    def remove_pool(self, name: str) -> None:
        pool = next(p for p in self.cfg.fleet.pools if p.name == name)
        self.cfg.fleet = Fleet(pools=[p for p in self.cfg.fleet.pools if p is not pool])
        api = self.api()
        for node in pool.node_names():
            api.delete(f"/api/v1/nodes/{node}")
        for name in dra.pool_slice_names(pool):
            api.delete(f"{dra.RESOURCE_API}/resourceslices/{name}")
        if pool.dra and not any(p.dra for p in self.cfg.fleet.pools):
            # The last DRA pool gone, its DeviceClasses go too: the GPU class's
            # extendedResourceName would go on steering nvidia.com/gpu pods through DRA's
            # extended-resource path, where a HAMi pod's gpucores fit no node (install.md, HAMi).
            for obj in dra.device_classes():
                api.delete(f"{dra.RESOURCE_API}/deviceclasses/{obj['metadata']['name']}")
        self._reload_prometheus()

    def add_scrapes(self, jobs: list[dict[str, Any]]) -> None:
        """More scrape jobs (pods on real nodes, found through the API server), replacing
        any of the same name."""
        names = {job["job_name"] for job in jobs}
        self.scrapes = [job for job in self.scrapes if job["job_name"] not in names] + jobs
        self._reload_prometheus()

    def _reload_prometheus(self) -> None:
        self._write_prometheus_config()
        os.kill(self.procs["prometheus"].pid, signal.SIGHUP)

    def start_prometheus(self) -> None:
        config = self._write_prometheus_config()
        prometheus, _ = prometheus_binaries(log=self.cfg.log)  # 3 unless GPUSTEWARD_PROMETHEUS
        self._run("prometheus", [
            prometheus, f"--config.file={config}",
            f"--storage.tsdb.path={self.dir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.ports['prometheus']}",
            "--storage.tsdb.retention.time=2d", "--log.level=warn",
            # new targets (a pool added, a SIGHUP) scraped after 1 s, not 5 s, on 3.x (a hidden
            # flag, also accepted by 2.42; tests/support/prometheus.py)
            "--scrape.discovery-reload-interval=1s",
        ], lambda: http_ok(f"{self.prometheus_url}/-/ready"))

    def start_extender(self) -> None:
        if self.cfg.extender_replicas == 1:
            # No Service in front of one extender: nothing to hand over to, so no drain.
            self._start_extender("extender", self.ports["extender"], shutdown_delay=0)
            return
        for i in range(self.cfg.extender_replicas):
            port = self.ports.setdefault(f"{REPLICA_PREFIX}{i}", free_port())
            self._start_extender(f"{REPLICA_PREFIX}{i}", port, shutdown_delay=2)
        self._run("extender", [
            sys.executable, "-m", "gpusteward.sandbox.affinity",
            f"--listen=127.0.0.1:{self.ports['extender']}",
            f"--affinity={self.cfg.extender_affinity}",
            *(f"--backend=127.0.0.1:{port}" for port in self.replica_ports()),
        ], lambda: http_ok(f"{self.extender_url}/readyz"))

    def replica_ports(self) -> list[int]:
        return [self.ports[f"{REPLICA_PREFIX}{i}"] for i in range(self.cfg.extender_replicas)]

    def _start_extender(self, name: str, port: int, shutdown_delay: int) -> None:
        self._run(name, [
            sys.executable, "-m", "gpusteward", "extender", f"--policy={self.cfg.policy}",
            f"--listen=127.0.0.1:{port}", f"--kubeconfig={self.kubeconfig}",
            f"--prometheus-url={self.prometheus_url}", f"--shutdown-delay={shutdown_delay}",
            # Each prioritize answer in the log (app.ranking): why a pod went where it did.
            "--log-level=debug",
        ], lambda: http_ok(f"http://127.0.0.1:{port}/readyz"))

    def stop_component(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            proc.stop()
            self.save()

    def scheduler_config(self) -> dict[str, Any]:
        config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        config["clientConnection"] = {"kubeconfig": str(self.kubeconfig), "qps": 500,
                                      "burst": 1000}
        config["leaderElection"] = {"leaderElect": False}
        if not self.cfg.preemption:  # waiting pods left to queue enforcement alone
            config["profiles"] = [{"schedulerName": "default-scheduler", "plugins": {
                "postFilter": {"disabled": [{"name": "DefaultPreemption"}]}}}]
        if self.cfg.with_extender:
            for ext in config["extenders"]:
                ext["urlPrefix"] = self.cfg.scheduler_extender_url or self.extender_url
                ext["nodeCacheCapable"] = self.cfg.node_cache_capable
                if not self.cfg.preempt_verb:
                    ext.pop("preemptVerb", None)
                if not self.cfg.managed_resources:
                    ext.pop("managedResources", None)
        else:
            config.pop("extenders", None)
        return config

    def start_scheduler(self) -> None:
        path = self.dir / "scheduler.yaml"
        path.write_text(yaml.safe_dump(self.scheduler_config()))
        port = self.ports["scheduler"]
        wanted = {**(dict.fromkeys(WORKLOAD_GATES, True) if self.cfg.workload_api else {}),
                  **self.cfg.scheduler_feature_gates}
        gates = ",".join(f"{gate}={str(on).lower()}" for gate, on in wanted.items())
        self._run("scheduler", self._k8s(
            "scheduler", f"--config={path}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", f"--authorization-always-allow-paths={OPEN_PATHS}", "-v=1",
            *([f"--feature-gates={gates}"] if gates else [])),
            lambda: http_ok(f"https://127.0.0.1:{port}/readyz"))

    def hami_scheduler_config(self, hami_url: str) -> dict[str, Any]:
        """deploy/scheduler/hami-scheduler-config.yaml, pointed at this sandbox."""
        config = yaml.safe_load(HAMI_SCHEDULER_CONFIG.read_text())
        config["clientConnection"] = {"kubeconfig": str(self.kubeconfig)}
        config["leaderElection"] = {"leaderElect": False}
        ours, theirs = config["extenders"]
        ours["urlPrefix"] = self.extender_url
        theirs.update(urlPrefix=hami_url, enableHTTPS=False)
        theirs.pop("tlsConfig")
        return config

    def start_hami_scheduler(self) -> None:
        """HAMi's scheduler as its chart runs it: a kube-scheduler of its own (profile
        ``hami-scheduler``) calling gpusteward's extender, then HAMi's (here the stand-in,
        gpusteward.sandbox.hamisched)."""
        for name in ("hami-extender", "hami-scheduler"):
            self.ports.setdefault(name, free_port())
        url = f"http://127.0.0.1:{self.ports['hami-extender']}"
        self._run("hami-extender", [sys.executable, "-m", "gpusteward.sandbox.hamisched",
                                    f"--server={self.api_url}", f"--listen={url[7:]}"],
                  lambda: http_ok(f"{url}/healthz"), env={"TOKEN": self.token})
        path = self.dir / "hami-scheduler.yaml"
        path.write_text(yaml.safe_dump(self.hami_scheduler_config(url)))
        port = self.ports["hami-scheduler"]
        self._run("hami-scheduler", self._k8s(
            "scheduler", f"--config={path}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", f"--authorization-always-allow-paths={OPEN_PATHS}", "-v=1"),
            lambda: http_ok(f"https://127.0.0.1:{port}/readyz"))

    def stop_hami_scheduler(self) -> None:
        for name in ("hami-scheduler", "hami-extender"):
            self.stop_component(name)

    def start_protocol_floor(self) -> str:
        """Start the no-op Go extender (sandbox/go/cmd/noopextender); return its URL."""
        port = self.ports.setdefault("noopextender", free_port())
        url = f"http://127.0.0.1:{port}"
        self._run("noopextender", [str(self.bin / "noopextender"), f"--listen=127.0.0.1:{port}"],
                  lambda: http_ok(f"{url}/readyz"))
        return url

    @property
    def scheduler_metrics_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['scheduler']}/metrics"

    def restart_scheduler(self, *, node_cache_capable: bool | None = None,
                          with_extender: bool | None = None, preemption: bool | None = None,
                          preempt_verb: bool | None = None,
                          managed_resources: bool | None = None) -> None:
        if node_cache_capable is not None:
            self.cfg.node_cache_capable = node_cache_capable
        if preemption is not None:
            self.cfg.preemption = preemption
        if preempt_verb is not None:
            self.cfg.preempt_verb = preempt_verb
        if with_extender is not None:
            self.cfg.with_extender = with_extender
        if managed_resources is not None:
            self.cfg.managed_resources = managed_resources
        self.stop_component("scheduler")
        self.start_scheduler()
        self.save()

    @property
    def reclaimer_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['reclaimer']}"

    def reclaimer_argv(self, metrics_port: int, name: str = "gpusteward-reclaimer") -> list[str]:
        argv = [sys.executable, "-m", "gpusteward", "reclaimer", f"--policy={self.cfg.policy}",
                f"--kubeconfig={self.kubeconfig}", f"--prometheus-url={self.prometheus_url}",
                f"--metrics-listen=127.0.0.1:{metrics_port}", "--lease-namespace=kube-system",
                f"--lease-name={name}", "--lease-duration=6"]
        if self.cfg.reclaimer_mode:
            argv.append(f"--mode={self.cfg.reclaimer_mode}")
        return argv

    def start_reclaimer(self) -> None:
        self._run("reclaimer", self.reclaimer_argv(self.ports["reclaimer"]),
                  lambda: http_ok(f"{self.reclaimer_url}/healthz"))


def stop_from_state(state_dir: Path) -> bool:
    """`sandbox down`: stop what a previous `sandbox up` (or `KEEP=1 make demo`) left running,
    waiting for each to exit. One that outlives SIGKILL stays on record, for `down` again, and
    raises SandboxError: "stopped" is said only of a sandbox with nothing left."""
    state_file = state_dir / "state.json"
    if not state_file.exists():
        return False
    state = json.loads(state_file.read_text())
    pids = state.get("pids", {})
    for slot in state.get("real_nodes", {}).values():
        teardown(Slot(int(slot)))
    left = {name: pids[name] for name in stop_order(list(pids)) if not stop_pid(int(pids[name]))}
    if left:
        state["pids"] = left
        state_file.write_text(json.dumps(state, indent=2))
        raise SandboxError("still running after SIGKILL: " + ", ".join(
            f"{name} (pid {pid})" for name, pid in left.items()))
    state_file.unlink()
    return True


def _not_ready_taint(node: dict[str, Any]) -> bool:
    return any(t.get("key") == "node.kubernetes.io/not-ready"
               for t in node.get("spec", {}).get("taints") or [])
