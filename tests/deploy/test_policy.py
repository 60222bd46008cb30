"""The policy every rendering ships passes `gpusteward policy check` (parse_policy)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpusteward.core.policy import parse_policy
from tests.deploy.conftest import RENDERS, REPO


def _policies(objects: list[dict[str, Any]]) -> list[str]:
    return [o["data"]["policy.yaml"] for o in objects
            if o["kind"] == "ConfigMap" and "policy.yaml" in o.get("data", {})]


@pytest.mark.parametrize("render", [r for r in RENDERS if r != "kustomize-monitoring"])
def test_the_policy_in_the_configmap_passes_policy_check(
        render: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    [text] = _policies(rendered[render])
    parse_policy(yaml.safe_load(text), f"{render} ConfigMap")
    if render != "helm-variant":  # the variant's policy is a mapping in the values
        assert "# gpusteward policy" in text  # the commented example, comments kept


def test_the_helm_default_policy_passes_policy_check() -> None:
    text = (REPO / "deploy/helm/gpusteward/files/policy.yaml").read_text()
    parse_policy(yaml.safe_load(text), "files/policy.yaml")
