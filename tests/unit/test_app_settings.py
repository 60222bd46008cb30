"""Each app's flags become one checked, frozen settings object, and one build function wires the
app from it: the command and the tests build the same thing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from gpusteward.adapters.errors import SettingsError
from gpusteward.agent.cli import AgentSettings
from gpusteward.cli import build_parser
from gpusteward.core.policy import PolicyError
from gpusteward.extender.cli import ExtenderSettings
from gpusteward.extender.serve import build_extender
from gpusteward.reclaimer import cli as reclaimer_cli
from gpusteward.reclaimer.cli import ReclaimerSettings, RestoreSettings
from gpusteward.reclaimer.serve import build_reclaimer
from gpusteward.report.cli import ReportSettings
from gpusteward.report.run import build_usage_reader
from gpusteward.whatif.cli import WhatIfSettings

EXAMPLE = str(Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml")
NO_PROMETHEUS = {}  # no PROMETHEUS_URL and no GPUSTEWARD_PROMETHEUS_* variables


def parsed(*argv: str):
    return build_parser().parse_args(argv)


@pytest.fixture
def bare_policy(tmp_path: Path) -> str:
    """A valid policy that names no Prometheus (the built-in defaults)."""
    path = tmp_path / "policy.yaml"
    path.write_text("telemetry: {}\n")
    return str(path)


@pytest.fixture
async def api():
    api = client.ApiClient()  # never called: building wires adapters, it does not connect
    yield api
    await api.close()


def test_the_extender_settings_carry_every_flag_checked() -> None:
    settings = ExtenderSettings.from_args(parsed(
        "extender", "--policy", EXAMPLE, "--max-body-mb", "4", "--listen", "127.0.0.1:7000",
        "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem",
        "--prometheus-url", "http://prom:9090", "--first-byte-timeout", "3",
        "--header-timeout", "2"), NO_PROMETHEUS)
    assert settings.max_body_bytes == 4 << 20
    assert (settings.first_byte_timeout, settings.header_timeout) == (3, 2)
    assert settings.listen == ("127.0.0.1", 7000)
    assert (settings.tls.cert, settings.tls.key, settings.tls.client_ca) == (
        "c.pem", "k.pem", None)
    assert settings.prometheus is not None and settings.prometheus.url == "http://prom:9090"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.listen = ("0.0.0.0", 1)  # type: ignore[misc]


def test_an_invalid_policy_stops_the_settings(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("reclaim:\n  mode: destroy\n")
    with pytest.raises(PolicyError, match="reclaim.mode"):
        ExtenderSettings.from_args(parsed("extender", "--policy", str(bad)), NO_PROMETHEUS)


async def test_the_extender_without_prometheus_builds_with_neutral_telemetry(
        api, bare_policy: str) -> None:
    settings = ExtenderSettings.from_args(parsed("extender", "--policy", bare_policy),
                                          NO_PROMETHEUS)
    assert settings.prometheus is None
    extender = build_extender(settings, api)
    assert extender.telemetry is None and extender.evidence is None
    assert [w.kind for w in extender.watches] == ["nodes", "pods"]


def test_the_reclaimer_settings_resolve_mode_lease_and_ledger(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(reclaimer_cli, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "absent"))
    args = parsed("reclaimer", "--policy", EXAMPLE, "--prometheus-url", "http://prom:9090",
                  "--lease-name", "rec", "--mode", "observe")
    settings = ReclaimerSettings.from_args(args, {"POD_NAMESPACE": "gpu-ops"})
    assert settings.mode == "observe"  # the flag overrides the policy's reclaim.mode
    assert (settings.lease_namespace, settings.lease_name, settings.ledger) == (
        "gpu-ops", "rec", "rec-reclaims")
    plain = parsed("reclaimer", "--policy", EXAMPLE, "--prometheus-url", "http://p:9090")
    by_policy = ReclaimerSettings.from_args(plain, {})
    assert by_policy.mode == by_policy.policy.reclaim.mode
    assert by_policy.lease_namespace == "default"  # no service account, no $POD_NAMESPACE
    account = tmp_path / "namespace"  # in a pod: the service account's namespace wins
    account.write_text("gpusteward\n")
    monkeypatch.setattr(reclaimer_cli, "SERVICE_ACCOUNT_NAMESPACE", str(account))
    assert ReclaimerSettings.from_args(plain, {"POD_NAMESPACE": "x"}).lease_namespace == \
        "gpusteward"


def test_the_reclaimer_refuses_settings_it_cannot_act_on(bare_policy: str) -> None:
    with pytest.raises(SettingsError, match="--policy is required"):
        ReclaimerSettings.from_args(parsed("reclaimer"), NO_PROMETHEUS)
    with pytest.raises(SettingsError, match="no Prometheus URL .* never acts without telemetry"):
        ReclaimerSettings.from_args(parsed("reclaimer", "--policy", bare_policy), NO_PROMETHEUS)


def test_a_restore_target_is_split_or_refused() -> None:
    settings = RestoreSettings.from_args(parsed("reclaimer", "restore", "ml/Deployment/train"))
    assert (settings.namespace, settings.kind, settings.name) == ("ml", "Deployment", "train")
    with pytest.raises(SettingsError, match="expected NAMESPACE/KIND/NAME"):
        RestoreSettings.from_args(parsed("reclaimer", "restore", "train"))


@pytest.mark.parametrize("argv", [
    pytest.param(("reclaimer", "restore", "ml/Job/t", "--lease-namespace=gpu-ops",
                  "--lease-name=r"), id="after-restore"),
    pytest.param(("reclaimer", "--lease-namespace=gpu-ops", "--lease-name=r", "restore",
                  "ml/Job/t"), id="before-restore-as-the-reclaimer-takes-them"),
])
def test_restore_finds_the_stop_record_beside_the_reclaimers_lease(argv) -> None:
    settings = RestoreSettings.from_args(parsed(*argv), {})
    assert (settings.lease_namespace, settings.stops) == ("gpu-ops", "r-stops")


def test_restore_looks_for_the_stop_record_where_the_manifests_put_the_reclaimer() -> None:
    settings = RestoreSettings.from_args(parsed("reclaimer", "restore", "--list"),
                                         {"POD_NAMESPACE": "gpusteward"})
    assert (settings.lease_namespace, settings.stops) == (
        "gpusteward", "gpusteward-reclaimer-stops")


async def test_build_reclaimer_keeps_the_ledger_beside_the_lease(api) -> None:
    settings = ReclaimerSettings.from_args(
        parsed("reclaimer", "--policy", EXAMPLE, "--prometheus-url", "http://prom:9090",
               "--lease-namespace", "gpu-ops", "--mode", "warn"), NO_PROMETHEUS)
    reclaimer = build_reclaimer(settings, api)
    assert reclaimer.mode == "warn"
    assert reclaimer.ledger is not None
    assert reclaimer.ledger.where == "ConfigMap gpu-ops/gpusteward-reclaimer-reclaims"
    assert reclaimer.stops.where == "ConfigMap gpu-ops/gpusteward-reclaimer-stops"
    assert reclaimer.selfservice.restorer.stops is reclaimer.stops  # one record, one truth
    in_memory = build_reclaimer(dataclasses.replace(settings, ledger=None), api)
    assert in_memory.ledger is None


async def test_the_report_settings_resolve_the_step_and_build_the_reader(api) -> None:
    settings = ReportSettings.from_args(
        parsed("report", "--window", "7d", "--prometheus-url", "http://prom:9090"),
        NO_PROMETHEUS)
    assert settings.window == 7 * 86_400
    # 7 days in at most 2,000 slots: coarser than the default 30 s scrape interval
    assert settings.step == 303
    reader = build_usage_reader(settings, api)
    assert reader.policy is settings.policy


def test_the_whatif_settings_name_each_policy_and_the_window(tmp_path: Path,
                                                             bare_policy: str) -> None:
    other = tmp_path / "b" / "policy.yaml"  # the same file name: columns become the paths
    other.parent.mkdir()
    other.write_text("telemetry: {}\n")
    settings = WhatIfSettings.from_args(parsed(
        "whatif", "--policy", bare_policy, "--policy", str(other), "--window", "2d",
        "--end", "2026-12-01T00:00:00Z", "--format", "json", "--top", "3",
        "--prometheus-url", "http://prom:9090"), NO_PROMETHEUS)
    assert [name for name, _ in settings.policies] == [bare_policy, str(other)]
    assert settings.end == 1796083200.0 and settings.end - settings.start == 2 * 86400
    assert (settings.format, settings.top, settings.prometheus.url) == (
        "json", 3, "http://prom:9090")
    with pytest.raises(SettingsError, match="no Prometheus URL"):
        WhatIfSettings.from_args(parsed("whatif", "--policy", bare_policy), NO_PROMETHEUS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.top = 1  # type: ignore[misc]


def test_the_agent_settings_carry_every_flag_and_need_a_node_name() -> None:
    settings = AgentSettings.from_args(parsed(
        "agent", "--node-name", "gpu-7", "--listen", "127.0.0.1:9500", "--interval", "5",
        "--xid-hold", "60", "--kube-api", "off", "--on-missing-driver", "serve-error"))
    assert (settings.node, settings.listen, settings.interval, settings.xid_hold) == (
        "gpu-7", ("127.0.0.1", 9500), 5.0, 60.0)
    assert (settings.kube_api, settings.on_missing_driver) == (False, "serve-error")
    with pytest.raises(SettingsError, match="--node-name or \\$NODE_NAME is required"):
        AgentSettings.from_args(parsed("agent"))
