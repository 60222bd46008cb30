"""Policy loading: defaults, the shipped example, and every error reported with its path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpusteward.cli import main
from gpusteward.core.policy import PolicyError, load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "policy.example.yaml"


def errors_of(data) -> dict[str, str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(data)
    return {e.path: e.message for e in info.value.errors}


def test_an_empty_policy_gets_safe_defaults():
    policy = parse_policy({})
    assert policy.reclaim.mode == "observe"
    assert policy.resources == ["nvidia.com/gpu"]
    assert policy.default_class in policy.classes


def test_the_shipped_example_is_valid():
    policy = load_policy(EXAMPLE)
    assert policy.classes["inference"].placement == "spread"
    assert float(policy.telemetry.stale_after) == 120


def test_durations_accept_go_style_text_and_seconds():
    policy = parse_policy({"telemetry": {"refresh": "1m30s", "staleAfter": 300}})
    assert float(policy.telemetry.refresh) == 90
    assert float(policy.telemetry.stale_after) == 300


def test_every_error_is_reported_at_once_with_its_path():
    errors = errors_of({
        "bogus": 1,
        "resources": ["gpu"],
        "telemetry": {"refresh": "soon"},
        "classes": {"batch": {"placement": "pack", "preferredTiers": ["gold"],
                              "weights": {"card": -1}}},
        "teams": {"vision": {"quotaGpus": "many"}},
    })
    assert set(errors) == {
        "bogus", "resources[0]", "telemetry.refresh", "classes.batch.placement",
        "classes.batch.weights.card", "classes.batch.preferredTiers[0]", "teams.vision.quotaGpus",
    }
    assert "binpack, spread" in errors["classes.batch.placement"]


@pytest.mark.parametrize(
    ("data", "path"),
    [
        pytest.param({"defaultClass": "nope"}, "defaultClass", id="default-class-must-exist"),
        pytest.param({"cardTiers": [{"name": "a", "products": ["x"]},
                                    {"name": "a", "products": ["y"]}]},
                     "cardTiers[1].name", id="tier-defined-twice"),
        pytest.param({"cardTiers": [{"name": "a", "products": ["has space"]}]},
                     "cardTiers[0].products", id="bad-card-pattern"),
        pytest.param({"teams": {"t": {"quotaByTier": {"gold": 1}}}},
                     "teams.t.quotaByTier.gold", id="quota-for-unknown-tier"),
        pytest.param({"reclaim": {"evictionGrace": 0}}, "reclaim.evictionGrace",
                     id="zero-grace-period-is-refused"),
        pytest.param({"classes": {"batch": {"weights": {"card": 0, "coolness": 0, "packing": 0,
                                                        "health": 0}}}},
                     "classes.batch.weights", id="all-weights-zero"),
        pytest.param({"reclaim": {"idle": {"thresholdPercent": 150}}},
                     "reclaim.idle.thresholdPercent", id="percent-over-100"),
        pytest.param({"cardTiers": [{"products": ["x"]}]}, "cardTiers[0].name",
                     id="required-field-missing"),
    ],
)
def test_invalid_fields_are_named(data, path):
    assert path in errors_of(data)


def test_policy_check_exits_0_for_a_valid_file(capsys):
    assert main(["policy", "check", str(EXAMPLE)]) == 0
    assert "valid" in capsys.readouterr().out


def test_policy_check_exits_2_naming_every_bad_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("resources: [gpu]\nreclaim:\n  mode: destroy\n")
    with pytest.raises(SystemExit) as info:
        main(["policy", "check", str(bad)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "resources[0]" in err and "reclaim.mode" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a: [", "not valid YAML", id="broken-yaml"),
        pytest.param("- 1\n- 2\n", "expected a mapping", id="not-a-mapping"),
    ],
)
def test_unreadable_policy_files_are_clear_errors(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(PolicyError, match=message):
        load_policy(bad)


def test_a_missing_policy_file_is_a_clear_error(tmp_path):
    with pytest.raises(PolicyError, match="cannot read file"):
        load_policy(tmp_path / "missing.yaml")


def test_the_scheduler_sends_the_extender_every_gpu_resource_the_policies_count():
    """kube-scheduler calls an extender with managedResources only for pods requesting one of
    them (`IsInterested`, k8s.io/kubernetes pkg/scheduler/extender.go): a MIG or shared-GPU
    resource missing there would never be placed by gpusteward."""
    config = yaml.safe_load((ROOT / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    managed = [r["name"] for r in config["extenders"][0]["managedResources"]]
    for path in (EXAMPLE, ROOT / "sandbox" / "policy.yaml"):
        assert load_policy(path).resources == managed, path
