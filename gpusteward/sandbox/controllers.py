"""Optional workload controllers for the sandbox (``gpusteward sandbox up --with kueue``), off by
default so a plain sandbox stays fast.

Each is built from its Go module with the machine's Go, pinned in ``sandbox/controllers/<name>``
(its own go.mod/go.sum, separate from ``sandbox/go`` and from each other), and cached like the
control plane::

    ${GPUSTEWARD_CACHE}/controllers/<key>/<binary>

keyed by go.mod, go.sum, ``go version`` and the package; a build goes to a temporary directory
and is renamed into place only when it succeeded; builds are serialised with a file lock. The
CRDs are installed from the same module version (the module cache's copy of its
``config/components/crd/bases``).

Kueue runs out of cluster, as the sandbox's other components do: no leader election, its
internal certificate management on (it keeps its CA in a Secret it expects to find, writes its
serving certificate into the state directory and injects the CA into the conversion webhooks of
its CRDs, which point at it on 127.0.0.1). No admission webhook configuration is registered, so
the API server never calls Kueue to admit a Job: Jobs are created suspended, as Kueue's docs
allow without its webhook (its cert rotator skips webhook configurations that do not exist).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from gpusteward.sandbox.build import SandboxBuildError, _locked, cache_root, go_build_into
from gpusteward.sandbox.checkout import REPO
from gpusteward.sandbox.kubehttp import KubeHTTP, wait_for
from gpusteward.sandbox.procs import free_port

SOURCES = REPO / "sandbox" / "controllers"


class Controller(NamedTuple):
    module: str
    package: str  # its main package
    binary: str
    source: Path  # the Go module that pins it
    tags: str = ""  # build tags its own build uses


CONTROLLERS = {
    "kueue": Controller("sigs.k8s.io/kueue", "sigs.k8s.io/kueue/cmd/kueue", "kueue",
                        SOURCES / "kueue"),
    "kuberay": Controller("github.com/ray-project/kuberay/ray-operator",
                          "github.com/ray-project/kuberay/ray-operator", "ray-operator",
                          SOURCES / "kuberay"),
    "jobset": Controller("sigs.k8s.io/jobset", "sigs.k8s.io/jobset", "jobset",
                         SOURCES / "jobset"),
    "trainer": Controller("github.com/kubeflow/trainer/v2",
                          "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
                          "trainer-controller-manager", SOURCES / "trainer"),
    "keda": Controller("github.com/kedacore/keda/v2", "github.com/kedacore/keda/v2/cmd/operator",
                       "operator", SOURCES / "keda"),
}
#: Controllers another needs running first: Trainer runs every TrainJob as a JobSet.
NEEDS = {"trainer": ("jobset",)}
#: Built the same way but not a controller (not offered by `sandbox up --with`): Thanos's
#: sidecar and querier, the horizontally scaled PromQL backend of benchmarks/bench_telemetry.py.
BENCH_TOOLS = {
    # slicelabels: Thanos casts Prometheus's labels to its own as slices (its .promu.yml builds
    # with the tag); without it the sidecar panics encoding its first gRPC answer.
    "thanos": Controller("github.com/thanos-io/thanos", "github.com/thanos-io/thanos/cmd/thanos",
                         "thanos", SOURCES / "thanos", tags="slicelabels"),
}
_RECIPE = "1"
KUEUE_NAMESPACE = "kueue-system"
# Kueue's default (apis/config/v1beta2: InternalCertManagement.WebhookSecretName).
KUEUE_WEBHOOK_SECRET = "kueue-webhook-server-cert"
# CRDs Kueue's cert rotator injects its CA into (pkg/util/cert/cert.go).
KUEUE_CONVERTED = {"localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters"}


def _go() -> str:
    go = os.environ.get("GPUSTEWARD_GO") or shutil.which("go")
    if go is None:
        raise SandboxBuildError("`go` was not found on PATH; it builds the sandbox's "
                                   "optional controllers")
    return go


def _key(go_version: str, c: Controller) -> str:
    digest = hashlib.sha256()
    parts = (_RECIPE, go_version, c.package, (c.source / "go.mod").read_text(),
             (c.source / "go.sum").read_text(), *((c.tags,) if c.tags else ()))
    for part in parts:
        digest.update(f"{len(part)}\0{part}".encode())
    return digest.hexdigest()[:16]


def ensure_controller(name: str, log: Any = print) -> Path:
    """The controller's binary, built on first use."""
    go = _go()
    c = {**CONTROLLERS, **BENCH_TOOLS}[name]
    go_version = subprocess.run([go, "version"], check=True, capture_output=True, text=True,
                                timeout=120).stdout.strip()
    root = cache_root() / "controllers"
    bin_dir = root / _key(go_version, c)
    if os.access(bin_dir / c.binary, os.X_OK):
        return bin_dir / c.binary
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        if not os.access(bin_dir / c.binary, os.X_OK):
            shutil.rmtree(bin_dir, ignore_errors=True)
            log(f"building {name} from Go modules into {bin_dir} (first use only)")
            took = go_build_into(go, c.source, [c.package], "-s -w", bin_dir, [c.binary], name,
                                 tags=c.tags)
            log(f"built {name} in {took:.0f}s")
    return bin_dir / c.binary


def module_dir(name: str) -> Path:
    """The module cache's copy of the controller's pinned module (downloaded if needed)."""
    c = CONTROLLERS[name]
    out = subprocess.run([_go(), "mod", "download", "-json", c.module], cwd=c.source, check=True,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=readonly"})
    return Path(json.loads(out.stdout)["Dir"])


def kueue_crds(webhook_port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs from the pinned module; those its cert rotator injects its CA into convert
    through its webhook, as its own kustomize patches make them."""
    bases = module_dir("kueue") / "config" / "components" / "crd" / "bases"
    crds = [yaml.safe_load(p.read_text()) for p in sorted(bases.glob("*.yaml"))]
    for crd in crds:
        if crd["spec"]["names"]["plural"] in KUEUE_CONVERTED:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": f"https://127.0.0.1:{webhook_port}/convert"}}}
    return crds


def kueue_config(state: Path, health_port: int, webhook_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port,
                    "certDir": str(state / "kueue-certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }


def install_kueue_objects(api: KubeHTTP, webhook_port: int) -> None:
    """Its namespace, CRDs, and the Secret its cert rotator writes into."""
    namespace(api, KUEUE_NAMESPACE)
    for crd in kueue_crds(webhook_port):
        api.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                  f"{crd['metadata']['name']}", crd)
    api.apply(f"/api/v1/namespaces/{KUEUE_NAMESPACE}/secrets/{KUEUE_WEBHOOK_SECRET}", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": KUEUE_WEBHOOK_SECRET, "namespace": KUEUE_NAMESPACE}})
    wait_for("Kueue's API to be served",
             lambda: api.exists("/apis/kueue.x-k8s.io/v1beta2/workloads"), timeout=60)


def start_kueue(box: Any) -> None:
    """Build (first use), install and start Kueue against the sandbox ``box``."""
    binary = ensure_controller("kueue", box.cfg.log)
    health, webhook, visibility = free_port(), free_port(), free_port()
    box.ports.update({"kueue-health": health, "kueue-webhook": webhook})
    install_kueue_objects(box.api(), webhook)
    config = box.dir / "kueue.yaml"
    config.write_text(yaml.safe_dump(kueue_config(box.dir, health, webhook)))
    certs = box.dir / "kueue-certs"
    api = box.api()

    def ready() -> bool:
        return _mount_secret(api, certs) and _ready(f"http://127.0.0.1:{health}/readyz")

    box.run_process("kueue", [str(binary), f"--config={config}",
                              f"--kubeconfig={box.kubeconfig}",
                              f"--visibility-server-port={visibility}"], ready, timeout=180)


def _mount_secret(api: KubeHTTP, certs: Path, namespace: str = KUEUE_NAMESPACE,
                  secret: str = KUEUE_WEBHOOK_SECRET) -> bool:
    """Do what the kubelet does for a controller's pod: put its Secret's serving certificate,
    once its cert rotator has written it there, into the directory it serves from (the
    rotator waits for the files, as for a mounted Secret volume)."""
    if (certs / "tls.crt").exists():
        return True
    data = api.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}").get("data") or {}
    if not {"tls.crt", "tls.key"} <= data.keys():
        return False
    certs.mkdir(parents=True, exist_ok=True)
    (certs / "tls.key").write_bytes(base64.b64decode(data["tls.key"]))
    (certs / "tls.crt").write_bytes(base64.b64decode(data["tls.crt"]))
    return True


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start_kuberay(box: Any) -> None:
    """Build (first use), install and start KubeRay's operator against the sandbox ``box``:
    its CRDs from the pinned module (config/crd/bases), no leader election, no webhooks (its
    default: ENABLE_WEBHOOKS unset)."""
    binary, _ = installed(box, "kuberay", "config/crd/bases", "/apis/ray.io/v1/rayclusters")
    probe, metrics = free_port(), free_port()
    box.run_process("kuberay", [str(binary), f"--kubeconfig={box.kubeconfig}",
                                f"--health-probe-bind-address=127.0.0.1:{probe}",
                                f"--metrics-addr=127.0.0.1:{metrics}",
                                "--enable-leader-election=false"],
                    lambda: _ready(f"http://127.0.0.1:{probe}/readyz"), timeout=180)


def apply_crds(api: KubeHTTP, bases: Path, served: str) -> None:
    """Every CRD under bases (a module's own), then wait for ``served`` to be listed."""
    for path in sorted(bases.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd and crd.get("kind") == "CustomResourceDefinition":
            api.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                      f"{crd['metadata']['name']}", crd)
    wait_for(f"{served} to be served", lambda: api.exists(served), timeout=60)


def installed(box: Any, name: str, crds: str, served: str, ns: str = "") -> tuple[Path, KubeHTTP]:
    """The controller's binary (built on first use) and an API client, once its CRDs (the
    pinned module's own, under ``crds``) are served at ``served`` and its namespace exists."""
    binary = ensure_controller(name, box.cfg.log)
    api = box.api()
    apply_crds(api, module_dir(name) / crds, served)
    if ns:
        namespace(api, ns)
    return binary, api


def namespace(api: KubeHTTP, name: str) -> None:
    api.apply(f"/api/v1/namespaces/{name}", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def self_signed(certs: Path) -> None:
    """A serving certificate for 127.0.0.1 (tls.crt and tls.key), for a webhook server whose
    configurations the sandbox registers with this certificate as their CA bundle."""
    if (certs / "tls.crt").exists():
        return
    certs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(certs / "tls.key"), "-out", str(certs / "tls.crt")],
                   check=True, capture_output=True, timeout=60)


def jobset_webhooks(webhook_port: int, ca: bytes) -> list[dict[str, Any]]:
    """JobSet's admission webhooks as its kustomize build makes them (config/components/webhook:
    manifests.yaml with its patches, which limit the pod webhooks to JobSet's pods, and the
    jobset- name prefix), pointed at its webhook server on 127.0.0.1. Its controller relies on
    them: the defaulting webhook sets what reconcile dereferences (spec.network)."""
    src = module_dir("jobset") / "config" / "components" / "webhook"
    configs = {c["kind"]: c for c in yaml.safe_load_all((src / "manifests.yaml").read_text())
               if c}
    for kind, patch in (("MutatingWebhookConfiguration", "mutating-patch.yaml"),
                        ("ValidatingWebhookConfiguration", "validating-patch.yaml")):
        for op in yaml.safe_load((src / "patches" / patch).read_text()):
            assert op["op"] == "replace" and op["path"].startswith("/webhooks/"), op
            configs[kind]["webhooks"][int(op["path"].rpartition("/")[2])] = op["value"]
    for config in configs.values():
        config["metadata"]["name"] = f"jobset-{config['metadata']['name']}"
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}{path}",
                                    "caBundle": base64.b64encode(ca).decode()}
    return list(configs.values())


def start_jobset(box: Any) -> None:
    """Build (first use), install and start JobSet's controller: its CRD from the pinned module
    (config/components/crd/bases), its config file with no leader election and internal
    certificate management off (config.jobset.x-k8s.io/v1alpha1: then it waits for no cert
    rotator), its webhook server on 127.0.0.1 with a self-signed certificate, and its webhook
    configurations registered once it serves."""
    binary, api = installed(box, "jobset", "config/components/crd/bases",
                            "/apis/jobset.x-k8s.io/v1alpha2/jobsets")
    health, webhook = free_port(), free_port()
    certs = box.dir / "jobset-certs"
    self_signed(certs)
    config = box.dir / "jobset.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(certs)},
        "internalCertManagement": {"enable": False}}))
    box.run_process("jobset", [str(binary), f"--config={config}",
                               f"--kubeconfig={box.kubeconfig}"],
                    lambda: _ready(f"http://127.0.0.1:{health}/readyz"), timeout=180)
    for hooks in jobset_webhooks(webhook, (certs / "tls.crt").read_bytes()):
        plural = f"{hooks['kind'].lower()}s"
        api.apply(f"/apis/admissionregistration.k8s.io/v1/{plural}/{hooks['metadata']['name']}",
                  hooks)


TRAINER_NAMESPACE = "kubeflow-system"  # pkg/util/cert: its namespace outside a pod
TRAINER_WEBHOOK_SECRET = "kubeflow-trainer-webhook-cert"  # its --webhook-secret-name default
# Its cert rotator waits for the certificate here, where its pod mounts the Secret
# (pkg/util/cert/cert.go certDir; not configurable in v2.0.0).
TRAINER_CERTS = Path("/tmp/k8s-webhook-server/serving-certs")


def start_trainer(box: Any) -> None:
    """Build (first use), install and start Kubeflow Trainer's controller manager: its CRDs
    from the pinned module (manifests/base/crds), the namespace and Secret its cert rotator
    writes into, the Secret's certificate put where it waits for it; no webhook configuration
    is registered, so the API server never calls it. JobSet's controller must run (NEEDS)."""
    binary, api = installed(box, "trainer", "manifests/base/crds",
                            "/apis/trainer.kubeflow.org/v1alpha1/trainjobs", TRAINER_NAMESPACE)
    probe, webhook = free_port(), free_port()
    api.apply(f"/api/v1/namespaces/{TRAINER_NAMESPACE}/secrets/{TRAINER_WEBHOOK_SECRET}", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": TRAINER_WEBHOOK_SECRET, "namespace": TRAINER_NAMESPACE}})

    def ready() -> bool:
        return (_mount_secret(api, TRAINER_CERTS, TRAINER_NAMESPACE, TRAINER_WEBHOOK_SECRET)
                and _ready(f"http://127.0.0.1:{probe}/readyz"))

    box.run_process("trainer", [str(binary), f"--kubeconfig={box.kubeconfig}",
                                f"--health-probe-bind-address=127.0.0.1:{probe}",
                                "--metrics-bind-address=0", "--leader-elect=false",
                                f"--webhook-server-port={webhook}"], ready, timeout=180)


KEDA_NAMESPACE = "keda"  # its cluster object namespace (KEDA_CLUSTER_OBJECT_NAMESPACE)


def start_keda(box: Any) -> None:
    """Build (first use), install and start KEDA's operator: its CRDs from the pinned module
    (config/crd/bases), no leader election, no cert rotation (its default), its gRPC metrics
    service on 127.0.0.1 with a self-signed certificate. Not its metrics API server: the HPAs
    KEDA makes read no metrics here, which the tests do not need (they pause a ScaledObject,
    which KEDA carries out itself: it scales the target and stops autoscaling it)."""
    binary, _ = installed(box, "keda", "config/crd/bases", "/apis/keda.sh/v1alpha1/scaledobjects",
                          KEDA_NAMESPACE)
    probe, grpc = free_port(), free_port()
    certs = box.dir / "keda-certs"
    self_signed(certs)
    shutil.copyfile(certs / "tls.crt", certs / "ca.crt")
    (box.dir / "keda-ca").mkdir(exist_ok=True)
    box.run_process("keda", [str(binary), f"--kubeconfig={box.kubeconfig}",
                             f"--health-probe-bind-address=127.0.0.1:{probe}",
                             "--metrics-bind-address=0",
                             f"--metrics-service-bind-address=127.0.0.1:{grpc}",
                             f"--cert-dir={certs}", f"--ca-dir={box.dir / 'keda-ca'}"],
                    lambda: _ready(f"http://127.0.0.1:{probe}/readyz"), timeout=180,
                    env={"WATCH_NAMESPACE": "", "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
                         "POD_NAMESPACE": KEDA_NAMESPACE})


STARTERS = {"kueue": start_kueue, "kuberay": start_kuberay, "jobset": start_jobset,
            "trainer": start_trainer, "keda": start_keda}


def with_needs(names: tuple[str, ...]) -> tuple[str, ...]:
    """The controllers to start, in order: each one's NEEDS before it, each once."""
    order: list[str] = []
    for name in names:
        for n in (*NEEDS.get(name, ()), name):
            if n not in order:
                order.append(n)
    return tuple(order)
