"""Real nodes beside the kwok GPU nodes: a kubelet from the pinned Kubernetes release (the
sandbox's own ``k8s kubelet``), Debian's containerd, runc and CNI plugins, running pods from
images imported locally (``localhost/pause``, ``localhost/gpusteward:dev``; nothing is pulled).

Each node lives in a network namespace and a private mount namespace that one holder process
(``unshare --mount --net sleep infinity``) keeps; containerd and the kubelet join both with
``nsenter``. So:

* every address is the sandbox's own: a veth pair per node, ``10.251.S.1/30`` on the host's
  end and the node's InternalIP ``10.251.S.2`` inside; pods on a CNI bridge in
  ``10.252.S.0/24``, with a host route to them over the pair (it goes with the link). The node
  namespace has no default route, so nothing in it reaches past this machine. The API server
  and Prometheus listen on loopback only; a relay (gpusteward.sandbox.relay) on the host's end
  of the pair forwards to them;
* the host's sysctls are never changed: the kubelet insists on ``vm.overcommit_memory=1``,
  ``kernel.panic=10`` and ``kernel.panic_on_oops=1`` (``protectKernelDefaults``), so files
  holding those values are bind-mounted over the /proc/sys entries inside the node's mount
  namespace only; the bridge plugin's ``ip_forward`` and the CNI's iptables rules land in the
  node's network namespace;
* inside, the node has the upstream paths (containerd's socket and state in /run/containerd,
  the CNI library's cache in /var/lib/cni, the kubelet's root in /var/lib/kubelet, pod logs in
  /var/log/pods): its /run and /var/lib are its own tmpfs, and /var/lib/kubelet,
  /var/lib/containerd and /var/log are bind mounts of directories in the node's directory,
  where its CNI configuration and IPAM state lie too. Nothing is written to the host's paths;
* every process of the node -- holder, relay, containerd, its shims, the kubelet and the pods
  (``cgroupRoot``) -- lives under one cgroup, ``/gpusteward-nodeS`` in each hierarchy: teardown
  kills what is in it and removes it, and with the last process the namespaces, their mounts,
  the veth pair and its route go too. A node whose holder died (a killed test run) is reaped
  the same way when the next real node is claimed.

The slot ``S`` is claimed by creating that cgroup (mkdir is atomic), so sandboxes on one
machine never share addresses.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpusteward.sandbox.clusterdns import DOMAIN as DNS_DOMAIN
from gpusteward.sandbox.image import IMAGE, ImageBuildError, archive, ensure_image, ensure_pause
from gpusteward.sandbox.kubehttp import http_ok, node_ready
from gpusteward.sandbox.procs import SandboxError, pid_alive

if TYPE_CHECKING:
    from gpusteward.sandbox.cluster import Sandbox

__all__ = ["LABEL", "SERVICE_CIDR", "TOOLS", "RealNode", "Slot", "missing_tools", "reap_orphans",
           "route_services", "start_node", "teardown"]

#: Label on every real node: pods that must run for real select it.
LABEL = "gpusteward.io/sandbox-node"
#: Debian's containerd (ctr), runc and containernetworking-plugins; util-linux; iproute2.
TOOLS = ("containerd", "ctr", "runc", "unshare", "nsenter", "ip")
CNI_BIN = Path("/usr/lib/cni")
CGROUP_FS = Path("/sys/fs/cgroup")
_SLOTS = 256
#: A claimed slot whose holder has not joined yet is not an orphan for this long.
_CLAIM_GRACE_S = 120
#: The values the kubelet's protectKernelDefaults requires (pkg/kubelet/cm, setupKernelTunables).
_KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                    "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                    "kernel/keys/root_maxbytes": "25000000"}
_KUBELET_PORT = 10250
#: The API server's --service-cluster-ip-range; its first address is the kubernetes Service.
SERVICE_CIDR = "10.96.0.0/16"
#: Every real node's veth pair lies in here (and its pods in 10.252.0.0/16).
NODE_NET = "10.251.0.0/16"
POD_NET = "10.252.0.0/16"
#: Upstream paths inside a node and the directory of node.dir that holds each: the kubelet's
#: root (pods' volumes, its sockets, checkpoints), containerd's root (images, snapshots) and
#: /var/log (the kubelet's container logs, /var/log/pods and /var/log/containers).
_NODE_PATHS = {"/var/lib/kubelet": "kubelet", "/var/lib/containerd": "containerd",
               "/var/log": "log"}
#: containerd's socket inside the node (its /run is the node's own tmpfs).
_CONTAINERD_SOCKET = "/run/containerd/containerd.sock"


@dataclass(frozen=True)
class Slot:
    """One real node's share of the machine: its addresses, links and cgroup."""

    index: int

    @property
    def host_ip(self) -> str:
        return f"10.251.{self.index}.1"

    @property
    def node_ip(self) -> str:
        return f"10.251.{self.index}.2"

    @property
    def pod_cidr(self) -> str:
        return f"10.252.{self.index}.0/24"

    @property
    def host_link(self) -> str:
        return f"gsw{self.index}h"

    @property
    def node_link(self) -> str:
        return f"gsw{self.index}n"

    @property
    def cgroup(self) -> str:
        return f"gpusteward-node{self.index}"


@dataclass
class RealNode:
    name: str
    slot: Slot
    dir: Path
    holder_pid: int = 0



def missing_tools() -> list[str]:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if not (CNI_BIN / "bridge").is_file():
        missing.append(f"{CNI_BIN}/bridge (containernetworking-plugins)")
    return missing


# --- cgroups ------------------------------------------------------------------------------
def _hierarchies() -> list[Path]:
    """The cgroup hierarchies a node's cgroup is made in: the one unified tree, or each v1
    controller's (a hybrid host's unified tree too)."""
    if (CGROUP_FS / "cgroup.controllers").is_file():
        return [CGROUP_FS]
    return sorted(path for path in CGROUP_FS.iterdir()
                  if path.is_dir() and (path / "cgroup.procs").is_file())


def _claim_tree() -> Path:
    """The hierarchy whose directory claims a slot: pids (every process is in it)."""
    trees = _hierarchies()
    return next((tree for tree in trees if tree.name == "pids"), trees[0])


def _inherit_cpuset(directory: Path) -> None:
    """A new v1 cpuset cgroup has no CPUs and no memory nodes, and takes no process until
    given its parent's."""
    for key in ("cpuset.cpus", "cpuset.mems"):
        mine, parents = directory / key, directory.parent / key
        if mine.is_file() and not mine.read_text().strip():
            mine.write_text(parents.read_text())


def pids_in(slot: Slot) -> set[int]:
    pids: set[int] = set()
    for tree in _hierarchies():
        root = tree / slot.cgroup
        if not root.is_dir():
            continue
        # os.walk, not rglob: the kubelet removes pod cgroups while we look, and a directory
        # gone mid-walk must be skipped, not raised (rglob raises FileNotFoundError).
        for directory, _, files in os.walk(root):
            if "cgroup.procs" not in files:
                continue
            try:
                text = Path(directory, "cgroup.procs").read_text()
                pids.update(int(line) for line in text.split())
            except (OSError, ValueError):
                continue
    return pids


def _remove_cgroups(slot: Slot) -> list[Path]:
    left = []
    for tree in _hierarchies():
        root = tree / slot.cgroup
        if not root.is_dir():
            continue
        for directory in sorted((p for p in root.rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True) + [root]:
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                left.append(directory)
    return left


def _claim_slot() -> Slot:
    reap_orphans()
    tree = _claim_tree()
    for index in range(_SLOTS):
        slot = Slot(index)
        if _link_exists(slot.host_link):
            continue
        try:
            (tree / slot.cgroup).mkdir()
        except FileExistsError:
            continue
        for other in _hierarchies():
            for directory in (other / slot.cgroup, other / slot.cgroup / "node"):
                directory.mkdir(exist_ok=True)
                _inherit_cpuset(directory)
        return slot
    raise SandboxError(f"no free real-node slot: {_SLOTS} in use under {tree}")


def reap_orphans(grace_s: float = _CLAIM_GRACE_S) -> list[int]:
    """Tear down every real node whose holder is gone (its sandbox was killed), but not one
    claimed less than ``grace_s`` ago (its holder may not have joined yet); the slots."""
    tree = _claim_tree()
    reaped = []
    for root in tree.glob("gpusteward-node*"):
        suffix = root.name.removeprefix("gpusteward-node")
        if not suffix.isdigit() or time.time() - root.stat().st_ctime < grace_s:
            continue
        holders = [pid for pid in pids_in(Slot(int(suffix))) if _is_holder(pid)]
        if not holders:
            teardown(Slot(int(suffix)))
            reaped.append(int(suffix))
    return reaped


def _is_holder(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep",
                                                                              b"infinity"]
    except OSError:
        return False


def teardown(slot: Slot, timeout: float = 30.0) -> None:
    """Kill every process of the node, remove its cgroups, and check its link is gone."""
    deadline = time.monotonic() + timeout
    while pids := pids_in(slot):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        if time.monotonic() > deadline:
            raise SandboxError(f"real node slot {slot.index}: processes outlive SIGKILL: "
                               f"{sorted(pids)}")
        time.sleep(0.1)
    while _remove_cgroups(slot):
        if time.monotonic() > deadline:
            raise SandboxError(f"real node slot {slot.index}: cgroups left: "
                               f"{[str(p) for p in _remove_cgroups(slot)]}")
        time.sleep(0.1)
    # The veth pair goes with the namespace's last process; the kernel frees it shortly after.
    while _link_exists(slot.host_link):
        if time.monotonic() > deadline:
            subprocess.run(["ip", "link", "del", slot.host_link], check=False,
                           capture_output=True)
            break
        time.sleep(0.1)


# --- namespaces and links -----------------------------------------------------------------
def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise SandboxError(f"{shlex.join(argv)} failed: {done.stderr.strip()}")


def _enter(holder: int, *argv: str) -> list[str]:
    """``argv`` run inside the node's network and mount namespaces."""
    return ["nsenter", f"--target={holder}", "--mount", "--net", "--", *argv]


def _in_cgroup(slot: Slot, argv: list[str]) -> list[str]:
    """``argv`` started inside the node's cgroup (each hierarchy), so teardown finds it and
    every process it forks."""
    files = " ".join(shlex.quote(str(tree / slot.cgroup / "node" / "cgroup.procs"))
                     for tree in _hierarchies())
    script = f'for f in {files}; do echo $$ > "$f" || exit 1; done; exec "$@"'
    return ["sh", "-c", script, "gpusteward-node", *argv]


def _wire(node: RealNode) -> None:
    slot, pid = node.slot, str(node.holder_pid)
    _run("ip", "link", "add", slot.host_link, "type", "veth", "peer", "name", slot.node_link,
         "netns", pid)
    _run("ip", "addr", "add", f"{slot.host_ip}/30", "dev", slot.host_link)
    _run("ip", "link", "set", slot.host_link, "up")
    inside = ["nsenter", f"--target={pid}", "--net", "--", "ip"]
    _run(*inside, "addr", "add", f"{slot.node_ip}/30", "dev", slot.node_link)
    _run(*inside, "link", "set", slot.node_link, "up")
    _run(*inside, "link", "set", "lo", "up")
    _run("ip", "route", "add", slot.pod_cidr, "via", slot.node_ip, "dev", slot.host_link)
    # Every node's host end (the API server's relay is on the first one's), and ClusterIPs,
    # which kube-proxy rewrites in the node before they leave it.
    _run(*inside, "route", "add", NODE_NET, "via", slot.host_ip)
    _run(*inside, "route", "add", SERVICE_CIDR, "via", slot.host_ip)


def route_services(node: RealNode) -> bool:
    """Route the host's packets for ClusterIPs through ``node``, whose kube-proxy rewrites them,
    as a cluster's nodes reach Services. One sandbox on a machine can have that route; False
    when another's real nodes hold it."""
    done = subprocess.run(["ip", "route", "add", SERVICE_CIDR, "via", node.slot.node_ip,
                           "dev", node.slot.host_link], capture_output=True, text=True,
                          timeout=30, check=False)
    return done.returncode == 0


def _mount_inside(node: RealNode) -> None:
    sysctl_dir = node.dir / "sysctl"
    sysctl_dir.mkdir(exist_ok=True)
    commands = []
    for key, value in _KUBELET_SYSCTLS.items():
        fake = sysctl_dir / key.replace("/", ".")
        fake.write_text(f"{value}\n")
        commands.append(f"mount --bind {shlex.quote(str(fake))} /proc/sys/{key}")
    # Inside, the node has the upstream paths; outside, all of it is in node.dir.
    commands += ["mount -t tmpfs -o mode=0755 tmpfs /run",
                 "mount -t tmpfs -o mode=0755 tmpfs /var/lib"]
    for inside, outside in _NODE_PATHS.items():
        (node.dir / outside).mkdir(exist_ok=True)
        commands += [f"mkdir -p {inside}",
                     f"mount --bind {shlex.quote(str(node.dir / outside))} {inside}"]
    _run("nsenter", f"--target={node.holder_pid}", "--mount", "--", "sh", "-c",
         " && ".join(commands))


# --- configuration ------------------------------------------------------------------------
_CONTAINERD_SETTINGS = {
    'sandbox_image = "registry.k8s.io/pause:3.6"': "sandbox_image = {pause}",
    # The machine cannot lower OOM scores, and has no AppArmor.
    "restrict_oom_score_adj = false": "restrict_oom_score_adj = true",
    "disable_apparmor = false": "disable_apparmor = true",
    'bin_dir = "/opt/cni/bin"': "bin_dir = {cni_bin}",
    'conf_dir = "/etc/cni/net.d"': "conf_dir = {cni_conf}",
    "netns_mounts_under_state_dir = false": "netns_mounts_under_state_dir = true",
}


def _containerd_config(node: RealNode, pause: str) -> Path:
    default = subprocess.run(["containerd", "config", "default"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    values = {"pause": pause, "cni_bin": CNI_BIN, "cni_conf": node.dir / "cni"}
    text = default
    for upstream, ours in _CONTAINERD_SETTINGS.items():
        if upstream not in text:
            raise SandboxError(f"containerd's default config has no `{upstream}`: this "
                               "containerd is not the one the sandbox was written for (1.6)")
        text = text.replace(upstream, ours.format(**{k: f'"{v}"' for k, v in values.items()}))
    path = node.dir / "containerd.toml"
    path.write_text(text)
    return path


def _cni_config(node: RealNode) -> None:
    conf = node.dir / "cni"
    conf.mkdir(exist_ok=True)
    (conf / "10-gpusteward.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "gpusteward-pods", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
             "hairpinMode": True, "ipam": {
                 "type": "host-local", "ranges": [[{"subnet": node.slot.pod_cidr}]],
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(node.dir / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=1))


def _kubelet_config(node: RealNode) -> Path:
    resolv = node.dir / "resolv.conf"
    resolv.write_text("")  # no upstream DNS: nothing in the node may look past this machine
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # Kubernetes >= 1.35 refuses cgroup v1 unless told; this machine's is a v1 hybrid.
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{node.slot.cgroup}",
        "containerRuntimeEndpoint": f"unix://{_CONTAINERD_SOCKET}",
        # The API server reaches the kubelet without a client certificate (logs, exec); only
        # this machine can reach the node's address.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "protectKernelDefaults": True, "failSwapOn": False,
        "address": node.slot.node_ip, "port": _KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": node.slot.node_ip, "healthzPort": 10248,
        "resolvConf": str(resolv),
        # The sandbox's CoreDNS on this node's host end (gpusteward.sandbox.clusterdns).
        "clusterDNS": [node.slot.host_ip], "clusterDomain": DNS_DOMAIN,
        # The sandbox shares the machine's disk with everything else: evict only when full.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "maxPods": 50, "serializeImagePulls": False,
    }
    path = node.dir / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _proxy_config(node: RealNode, kubeconfig: Path) -> Path:
    slot = node.slot
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)}, "mode": "iptables",
        "hostnameOverride": node.name, "bindAddress": slot.node_ip,
        "healthzBindAddress": f"{slot.node_ip}:10256",
        "metricsBindAddress": f"{slot.node_ip}:10249", "clusterCIDR": POD_NET,
        # No br_netfilter here (modules cannot be loaded), so a pod reaching a Service whose
        # backend shares its bridge would get the answer from the wrong address: masquerading
        # every Service connection sends the answer back through the rewrite.
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
        # 0: leave the conntrack sysctls as they are (they are not the node's own).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": [f"{slot.node_ip}/32"],
    }
    path = node.dir / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _kubeconfig(node: RealNode, api_port: int, token: str, user: str = "kubelet") -> Path:
    path = node.dir / f"{user}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "node",
        "clusters": [{"name": "sandbox", "cluster": {
            "server": f"https://{node.slot.host_ip}:{api_port}",
            "insecure-skip-tls-verify": True}}],
        "users": [{"name": node.name, "user": {"token": token}}],
        "contexts": [{"name": "node", "context": {"cluster": "sandbox", "user": node.name}}]}))
    return path


# --- start --------------------------------------------------------------------------------
def node_images(log: Any) -> tuple[str, list[Path]]:
    """The pause image's tag and the archives every real node imports (built if needed)."""
    try:
        ensure_image(log=log)
        pause = ensure_pause(log=log)
        return pause, [archive(pause), archive(IMAGE)]
    except ImageBuildError as exc:
        raise SandboxError(f"real nodes need the images: {exc}") from exc


def start_node(sb: Sandbox, name: str, token: str, proxy_token: str, pause: str,
               archives: list[Path]) -> RealNode:
    """Claim a slot and bring up ``name``: holder, wiring, relay, containerd with the images,
    the kubelet and kube-proxy; returns once the Node is Ready. Raises SandboxError."""
    missing = missing_tools()
    if missing:
        raise SandboxError(f"real nodes need {', '.join(missing)}: run `make system-deps`")
    slot = _claim_slot()
    node = RealNode(name=name, slot=slot, dir=sb.dir / "nodes" / name)
    sb.real_nodes[name] = node
    sb.save()
    node.dir.mkdir(parents=True, exist_ok=True)
    prefix = f"node/{name}"
    holder = sb.run_process(
        f"{prefix}/holder",
        _in_cgroup(slot, ["unshare", "--mount", "--net", "--propagation", "private",
                          "sleep", "infinity"]),
        lambda: _joined(sb.procs[f"{prefix}/holder"].pid), timeout=30)
    node.holder_pid = holder.pid
    _wire(node)
    _mount_inside(node)
    ports = [sb.ports["apiserver"], sb.ports["prometheus"]]
    sb.run_process(f"{prefix}/relay", _in_cgroup(slot, [
        sys.executable, "-m", "gpusteward.sandbox.relay",
        *(f"{slot.host_ip}:{port}=127.0.0.1:{port}" for port in ports)]),
        lambda: _listening(slot.host_ip, ports[0]), timeout=30)
    config = _containerd_config(node, pause)
    sb.run_process(f"{prefix}/containerd", _in_cgroup(slot, _enter(
        node.holder_pid, "containerd", f"--config={config}")),
        lambda: _ctr(node, "version").returncode == 0, timeout=60)
    for path in archives:
        import_archive(node, path)
    _cni_config(node)
    kubelet = _kubelet_config(node)
    kubeconfig = _kubeconfig(node, sb.ports["apiserver"], token)
    sb.run_process(f"{prefix}/kubelet", _in_cgroup(slot, _enter(
        node.holder_pid, str(sb.bin / "k8s"), "kubelet", f"--config={kubelet}",
        f"--kubeconfig={kubeconfig}", f"--hostname-override={name}",
        f"--node-ip={slot.node_ip}", f"--node-labels={LABEL}=real", "-v=1")),
        lambda: _node_ready(sb, name), timeout=90)
    proxy = _proxy_config(node, _kubeconfig(node, sb.ports["apiserver"], proxy_token,
                                            user="kube-proxy"))
    sb.run_process(f"{prefix}/kube-proxy", _in_cgroup(slot, _enter(
        node.holder_pid, str(sb.bin / "k8s"), "proxy", f"--config={proxy}", "-v=1")),
        lambda: http_ok(f"http://{slot.node_ip}:10256/healthz"), timeout=60)
    return node


def _joined(pid: int) -> bool:
    """Whether ``pid`` has its own network namespace yet (unshare has run)."""
    if not pid_alive(pid):
        return False
    return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def import_archive(node: RealNode, path: Path) -> None:
    """Import one more image archive into a running node's containerd."""
    done = _ctr(node, "images", "import", str(path), timeout=300)
    if done.returncode != 0:
        raise SandboxError(f"ctr images import {path} failed: {done.stderr.strip()}")


def _ctr(node: RealNode, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``ctr`` against the node's containerd, from inside its mount namespace (the socket is
    in the node's own /run)."""
    return subprocess.run(["nsenter", f"--target={node.holder_pid}", "--mount", "--", "ctr",
                           f"--address={_CONTAINERD_SOCKET}", "--namespace=k8s.io", *argv],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _node_ready(sb: Sandbox, name: str) -> bool:
    api = sb.api()
    return api.exists(f"/api/v1/nodes/{name}") and node_ready(api.get(f"/api/v1/nodes/{name}"))
