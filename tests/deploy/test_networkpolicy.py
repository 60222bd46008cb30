"""Only the scheduler reaches the extender's port (issue 13, item 8).

NetworkPolicy semantics (k8s.io/api/networking/v1 ``NetworkPolicyIngressRule``): a rule whose
``from`` is empty or missing admits every source, and a port no rule lists is closed once a
policy selects the pod. The server-side dry run of every render is in test_render.py.
"""

from __future__ import annotations

from typing import Any

import pytest

SCHEDULER_RENDERS = ("kustomize-second-scheduler", "helm-defaults")
ALL_RENDERS = (*SCHEDULER_RENDERS, "kustomize-default-scheduler", "helm-variant")


def _of(rendered: list[dict[str, Any]], kind: str, component: str) -> list[dict[str, Any]]:
    return [o for o in rendered if o["kind"] == kind
            and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]


def _rules_for(policy: dict[str, Any], port: str) -> list[dict[str, Any]]:
    return [r for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r["ports"])]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("render", ALL_RENDERS)
def test_the_extender_port_admits_named_sources_only_and_metrics_stay_open(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered[render]
    [policy] = _of(objs, "NetworkPolicy", "extender")
    [deployment] = _of(objs, "Deployment", "extender")
    template = deployment["spec"]["template"]
    assert _selects(policy["spec"]["podSelector"]["matchLabels"], template["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert ports == {"http", "metrics"}
    for rule in _rules_for(policy, "http"):
        assert rule.get("from"), "a rule without sources admits everyone"
    assert [r.get("from") for r in _rules_for(policy, "metrics")] == [None]
    # Prometheus scrapes and the kubelet probes the metrics port, never the scheduler port.
    container = template["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert "--metrics-listen=0.0.0.0:9090" in container["args"]


@pytest.mark.parametrize("render", SCHEDULER_RENDERS)
def test_the_second_scheduler_is_the_one_admitted(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered[render]
    [policy] = _of(objs, "NetworkPolicy", "extender")
    [scheduler] = _of(objs, "Deployment", "scheduler")
    [extender] = _of(objs, "Deployment", "extender")
    [rule] = _rules_for(policy, "http")
    # besides the scheduler, only the `helm test` Pod (test_chart.py) may call the extender
    selectors = [s["podSelector"]["matchLabels"] for s in rule["from"] if "podSelector" in s
                 and s["podSelector"]["matchLabels"].get("app.kubernetes.io/component") != "test"]
    labels = scheduler["spec"]["template"]["metadata"]["labels"]
    assert selectors and all(_selects(s, labels) for s in selectors)
    assert not any(_selects(s, extender["spec"]["template"]["metadata"]["labels"])
                   for s in selectors)


def test_without_scheduler_addresses_helm_admits_no_one_to_the_extender_port(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    [policy] = _of(rendered["helm-variant"], "NetworkPolicy", "extender")  # defaultScheduler
    assert _rules_for(policy, "http") == []


def test_the_default_scheduler_overlay_names_an_address_block(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    [policy] = _of(rendered["kustomize-default-scheduler"], "NetworkPolicy", "extender")
    [rule] = _rules_for(policy, "http")
    assert {"ipBlock": {"cidr": "192.0.2.0/24"}} in rule["from"]


@pytest.mark.parametrize("render", ["kustomize-monitoring", "helm-variant"])
def test_the_extender_is_scraped_on_its_metrics_port(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    [monitor] = _of(rendered[render], "ServiceMonitor", "extender")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
