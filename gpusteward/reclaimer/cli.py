"""``gpusteward reclaimer [restore]``: its flags and the typed settings they make.

Wired into the main command by its ``gpusteward.cli.COMMANDS`` entry, which names
``add_reclaimer_flags`` and ``serve.run_reclaimer``; ``serve.build_reclaimer``, ``serve.serve``
and ``serve.restore`` take the settings. Flags and settings only (argparse, the core): loaded
only when the command line names this command.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpusteward.adapters.connectflags import (
    add_connection_flags,
    add_kube_flags,
    hostport,
    prometheus_connection,
    whole_number,
)
from gpusteward.adapters.errors import SettingsError
from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.core.policy import Policy, ReclaimMode
from gpusteward.core.reclaim.kinds import known_kinds

__all__ = ["ReclaimerSettings", "RestoreSettings", "add_reclaimer_flags"]

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
LEASE_NAME = "gpusteward-reclaimer"  # kustomize's, and the Helm chart's for a release "gpusteward"


def add_reclaimer_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="FILE",
                   help="policy YAML file (required unless restoring)")
    p.add_argument("--mode", choices=[m.value for m in ReclaimMode],
                   help="override the policy's reclaim.mode")
    p.add_argument("--once", action="store_true", help="run one cycle and exit (no Lease)")
    p.add_argument("--metrics-listen", type=hostport, default="0.0.0.0:8080",
                   metavar="HOST:PORT", help="/healthz and /metrics")
    add_lease_flags(p)
    # client-go's rule: the renew deadline (2/3 of it) must exceed 1.2 retry periods (>= 1 s)
    p.add_argument("--lease-duration", type=whole_number(2, "seconds"), default=15,
                   metavar="SECONDS",
                   help="a standby takes over this long after the leader stops renewing")
    add_connection_flags(p)
    sub = p.add_subparsers(dest="reclaimer_command")
    restore = sub.add_parser("restore", help="bring back a workload gpusteward stopped")
    restore.add_argument("target", metavar="NAMESPACE/KIND/NAME", nargs="?")
    restore.add_argument("--list", action="store_true",
                         help="list every workload gpusteward stopped, when, why and how to "
                              "bring it back")
    add_lease_flags(restore, after=True)
    add_kube_flags(restore)


def add_lease_flags(parser: argparse.ArgumentParser, after: bool = False) -> None:
    """The Lease and the records beside it: the reclaimer's, and where restore finds the stop
    record (``<name>-stops``) that it trusts. ``after``: the same flags after ``restore``
    (no defaults of their own there, so the ones given before it hold)."""
    unset = argparse.SUPPRESS if after else None
    parser.add_argument("--lease-namespace", default=unset,
                        help="namespace of the reclaimer's leader-election Lease and its "
                             "records (default: the pod's namespace, else $POD_NAMESPACE, else "
                             "default) [$GPUSTEWARD_LEASE_NAMESPACE]")
    parser.add_argument("--lease-name", default=unset or LEASE_NAME,
                        help="the leader-election Lease; ConfigMaps beside it: <name>-reclaims "
                             "(the last hour's reclaims), <name>-stops (what gpusteward "
                             f"stopped, which restore trusts) ... (default: {LEASE_NAME}) "
                             "[$GPUSTEWARD_LEASE_NAME]")


@dataclass(frozen=True)
class ReclaimerSettings:
    policy: Policy
    mode: ReclaimMode
    prometheus: PrometheusConnection
    # The ConfigMap beside the Lease that keeps the last hour's reclaims (``ledger_name``);
    # None keeps them in this process only (tests that do not need them to outlive it).
    ledger: str | None
    # ConfigMaps beside the Lease for snooze sightings and sent notifications (``records_name``);
    # None keeps them in this process only.
    snoozes: str | None = None
    notifications: str | None = None
    # The stop record beside the Lease, which restore trusts: always in the cluster (restore
    # runs in another process), so a test names its own or shares this one.
    stops: str = f"{LEASE_NAME}-stops"
    once: bool = False
    metrics_listen: tuple[str, int] = ("0.0.0.0", 8080)
    lease_namespace: str = "default"  # the Lease's, and the ledger's
    lease_name: str = LEASE_NAME
    lease_duration: int = 15
    kubeconfig: str | None = None
    context: str | None = None
    dra_driver: str = "gpu.nvidia.com"  # the DRA driver whose ResourceSlice devices are GPUs

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str]) -> ReclaimerSettings:
        """The checked settings; raises PolicyError or SettingsError naming what is wrong."""
        if not args.policy:
            raise SettingsError("--policy is required")
        policy = load_policy(args.policy)
        prometheus = prometheus_connection(args, policy.telemetry.prometheus_url, env)
        if prometheus is None:
            raise SettingsError("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or the "
                                "policy's telemetry.prometheusUrl): the reclaimer never acts "
                                "without telemetry")
        return cls(
            policy=policy, mode=ReclaimMode(args.mode or policy.reclaim.mode),
            prometheus=prometheus,
            once=args.once, metrics_listen=args.metrics_listen,
            lease_namespace=args.lease_namespace or default_namespace(env),
            lease_name=args.lease_name, lease_duration=args.lease_duration,
            ledger=ledger_name(args.lease_name),
            snoozes=records_name(args.lease_name, "snoozes"),
            notifications=records_name(args.lease_name, "notifications"),
            stops=records_name(args.lease_name, "stops"),
            kubeconfig=args.kubeconfig, context=args.context, dra_driver=args.dra_driver)


@dataclass(frozen=True)
class RestoreSettings:
    namespace: str = ""
    kind: str = ""
    name: str = ""
    list_stopped: bool = False  # --list: what gpusteward stopped, instead of restoring one
    policy: Policy | None = None  # --policy: its ownerActions.kinds switches, where it has any
    kubeconfig: str | None = None
    context: str | None = None
    # Where the reclaimer keeps its stop record, the only thing restore trusts (the Lease's
    # namespace and name, as the reclaimer is given them).
    lease_namespace: str = "default"
    lease_name: str = LEASE_NAME

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    @property
    def stops(self) -> str:
        return records_name(self.lease_name, "stops")

    @classmethod
    def from_args(cls, args: argparse.Namespace,
                  env: Mapping[str, str] = os.environ) -> RestoreSettings:
        common = {"kubeconfig": args.kubeconfig, "context": args.context,
                  "policy": load_policy(args.policy) if args.policy else None,
                  "lease_namespace": args.lease_namespace or default_namespace(env),
                  "lease_name": args.lease_name}
        if args.list:
            return cls(list_stopped=True, **common)
        try:
            namespace, kind, name = (args.target or "").split("/")
        except ValueError:
            raise SettingsError(f"expected NAMESPACE/KIND/NAME (KIND: {', '.join(known_kinds())})"
                                f" or --list, got {args.target!r}") from None
        return cls(namespace, kind, name, **common)


def ledger_name(lease_name: str) -> str:
    """The ConfigMap beside the Lease that keeps the last hour's reclaims."""
    return records_name(lease_name, "reclaims")


def records_name(lease_name: str, records: str) -> str:
    """A ConfigMap of the reclaimer's records beside its Lease (reclaims, snoozes, notifications,
    stops): RBAC names each one (deploy/)."""
    return f"{lease_name}-{records}"


def default_namespace(env: Mapping[str, str]) -> str:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip()
    except OSError:
        return env.get("POD_NAMESPACE", "default")
