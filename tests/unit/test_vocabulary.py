"""The telemetry vocabulary (core/vocabulary.py): each concept under both dcgm-exporter
generations' names, each converted from its own unit, and the policy's telemetry.metrics.
Names and units: DCGM's dcgm_fields.h and go-dcgm's alias table (pkg/dcgm/fields.go)."""

from __future__ import annotations

import pytest

from gpusteward.core.policy import PolicyError, parse_policy
from gpusteward.core.vocabulary import SOURCE_LABEL, Concept, Unit, Vocabulary, factor, fallback


@pytest.mark.parametrize(("source", "target", "expected"), [
    (Unit.PERCENT, Unit.RATIO, 0.01), (Unit.RATIO, Unit.PERCENT, 100.0),
    (Unit.BYTES, Unit.MIB, 2.0 ** -20), (Unit.MIB, Unit.BYTES, 2.0 ** 20),
    (Unit.CELSIUS, Unit.CELSIUS, 1.0),
])
def test_units_convert_within_their_family(source, target, expected):
    assert factor(source, target) == expected


def test_units_of_different_families_do_not_convert():
    with pytest.raises(ValueError, match="does not convert"):
        factor(Unit.MIB, Unit.PERCENT)


def test_a_union_reads_every_name_in_the_callers_unit_and_marks_it():
    promql = Vocabulary().union(Concept.UTILIZATION, Unit.RATIO, matchers='GPU_I_ID=""')
    assert promql == (
        '(label_replace((DCGM_FI_DEV_GPU_UTIL{GPU_I_ID=""}) * 0.01, "gpusteward_metric", '
        '"DCGM_FI_DEV_GPU_UTIL", "", "") or label_replace(DCGM_FI_DEV_GPU_UTIL_RATIO'
        '{GPU_I_ID=""}, "gpusteward_metric", "DCGM_FI_DEV_GPU_UTIL_RATIO", "", ""))')


def test_memory_in_bytes_is_scaled_by_the_exact_power_of_two():
    promql = Vocabulary().union(Concept.MEMORY_USED, Unit.MIB)
    assert "(DCGM_FI_DEV_FB_USED_BYTES) * 9.5367431640625e-07" in promql


def test_the_fallback_ignores_which_name_a_series_came_under():
    assert fallback("a", "b") == f"(a or ignoring({SOURCE_LABEL}) b)"


def test_the_policy_replaces_a_concepts_names():
    policy = parse_policy({"telemetry": {"metrics": {"utilization": [
        {"name": "gpu_busy_ratio", "unit": "ratio"}]}}})
    words = policy.telemetry.vocabulary()
    assert words.names(Concept.UTILIZATION) == ("gpu_busy_ratio",)
    assert words.names(Concept.MEMORY_USED) == ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES")


def test_a_bad_metrics_entry_names_every_bad_field():
    with pytest.raises(PolicyError) as caught:
        parse_policy({"telemetry": {"metrics": {
            "utilization": [{"name": "x", "unit": "MiB"}], "power": [],
            "fanSpeed": [{"name": "y", "unit": "ratio"}]}}})
    text = str(caught.value)
    assert "telemetry.metrics.utilization[0].unit: utilization is not measured in MiB" in text
    assert "telemetry.metrics.power: name at least one metric" in text
    assert "telemetry.metrics.fanSpeed: unknown concept" in text
