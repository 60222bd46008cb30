"""Kubernetes label selectors (meta/v1 LabelSelector) as the API server matches them
(k8s.io/apimachinery pkg/apis/meta/v1/helpers.go LabelSelectorAsSelector): matchLabels and
matchExpressions ANDed; an empty selector matches everything, a null one nothing (how
policy/v1 PodDisruptionBudget reads both)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy the selector, in its wire form (camelCase keys)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_holds(e, labels) for e in selector.get("matchExpressions") or ())


def _holds(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = expression["key"], expression["operator"]
    values = expression.get("values") or ()
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    # An operator the API server would have refused: it selects, so that a budget gpusteward
    # cannot read still protects.
    return True
