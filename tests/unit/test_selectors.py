"""Label selectors as the API server matches them (k8s.io/apimachinery v0.36 pkg/apis/meta/v1
helpers.go LabelSelectorAsSelector; pkg/labels selector.go Requirement.Matches), in the wire
form a policy/v1 PodDisruptionBudget's spec.selector has."""

from __future__ import annotations

import pytest

from gpusteward.core.selectors import matches

POD = {"app": "train", "rank": "0"}


@pytest.mark.parametrize(("selector", "want"), [
    pytest.param(None, False, id="null-selects-nothing"),
    pytest.param({}, True, id="empty-selects-everything"),
    pytest.param({"matchLabels": {"app": "train"}}, True, id="labels"),
    pytest.param({"matchLabels": {"app": "train", "rank": "1"}}, False, id="labels-all-anded"),
    pytest.param({"matchExpressions": [{"key": "app", "operator": "In",
                                        "values": ["serve", "train"]}]}, True, id="in"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]},
                 False, id="in-without-the-key"),
    pytest.param({"matchExpressions": [{"key": "app", "operator": "NotIn",
                                        "values": ["train"]}]}, False, id="notin"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "NotIn",
                                        "values": ["a"]}]}, True, id="notin-without-the-key"),
    pytest.param({"matchExpressions": [{"key": "rank", "operator": "Exists"}]}, True,
                 id="exists"),
    pytest.param({"matchExpressions": [{"key": "rank", "operator": "DoesNotExist"}]}, False,
                 id="does-not-exist"),
    pytest.param({"matchLabels": {"app": "train"},
                  "matchExpressions": [{"key": "rank", "operator": "DoesNotExist"}]}, False,
                 id="labels-and-expressions-anded"),
    # an operator the API server refuses to store: a budget gpusteward cannot read protects
    pytest.param({"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["1"]}]},
                 True, id="unknown-operator-selects"),
])
def test_a_selector_matches_as_the_api_server_does(selector, want):
    assert matches(selector, POD) is want
