"""Policy loading: defaults, the shipped example, and every error reported with its path."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from gpusteward.adapters.policyfile import load_policy
from gpusteward.cli import main
from gpusteward.core.policy import PolicyError, parse_policy

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
    bad.write_text("resources: [gpu]\nreclaim:\n  mode: destroy\n"
                   "classes:\n  batch:\n    placement: spraed\n")
    with pytest.raises(SystemExit) as info:
        main(["policy", "check", str(bad)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "resources[0]" in err
    assert "reclaim.mode: expected one of observe, warn, enforce, got 'destroy'" in err
    # A misspelt placement is an error, never a silent fallback to one of the two.
    assert "classes.batch.placement: expected one of binpack, spread, got 'spraed'" in err


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


def test_a_partial_section_keeps_the_defaults_of_the_fields_it_leaves_out():
    policy = parse_policy({"reclaim": {"idle": {"grace": "10m"}, "limits": {"maxPerHour": 3}},
                           "classes": {"training": {"placement": "spread"}, "batch": {}}})
    idle = policy.reclaim.idle
    assert (idle.threshold_percent, idle.window, idle.min_coverage, idle.grace) == \
        (5.0, 1800, 0.8, 600)
    assert (policy.reclaim.limits.max_per_cycle, policy.reclaim.limits.max_per_hour) == (5, 3)
    # A default class written in part keeps its own preferred tiers.
    assert policy.classes["training"].preferred_tiers == ["premium", "standard"]
    assert policy.classes["training"].placement == "spread"


def test_the_reclaim_idle_rule_cannot_be_unset():
    assert "reclaim.idle.grace" in errors_of({"reclaim": {"idle": {"grace": None}}})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(float("nan"), "finite", id="nan"),
        pytest.param(float("inf"), "finite", id="inf"),
        pytest.param(1e308, "outside 1s–1h", id="huge-float"),
        pytest.param(10**400, "finite", id="int-beyond-float"),
        pytest.param(-5, "negative", id="negative"),
        pytest.param(0, "outside 1s–1h", id="zero"),
        pytest.param("500ms", "outside 1s–1h", id="below-the-range"),
        pytest.param("2h", "outside 1s–1h", id="above-the-range"),
    ],
)
def test_durations_are_finite_and_within_their_range(value, message):
    errors = errors_of({"reclaim": {"interval": value}, "telemetry": {"refresh": value}})
    assert message in errors["reclaim.interval"]
    assert message in errors["telemetry.refresh"]


def test_numbers_are_finite():
    errors = errors_of({"classes": {"batch": {"weights": {"card": float("inf")}}},
                        "cardTiers": [{"name": "a", "products": ["x"],
                                       "costPerGpuHour": float("inf")}]})
    assert "<= 100" in errors["classes.batch.weights.card"]
    assert "finite" in errors["cardTiers[0].costPerGpuHour"]


def laughs(levels: int, fanout: int) -> str:
    """The "billion laughs" shape: each anchor is a list of aliases of the one before."""
    lines = ["l0: &l0 [lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


HOSTILE = [
    pytest.param(b"reclaim:\n  mode: observe\n  mode: enforce\n",
                 "duplicate key 'mode' on lines 2 and 3", id="duplicate-key"),
    pytest.param(b"reclaim:\n  interval: .nan\n", "reclaim.interval: expected a finite",
                 id="nan-interval"),
    pytest.param(b"telemetry:\n  refresh: .nan\n", "telemetry.refresh: expected a finite",
                 id="nan-refresh"),
    pytest.param(b"reclaim:\n  idle: {grace: 1.0e+308}\n", "reclaim.idle.grace: 1e+308s is "
                 "outside", id="huge-grace"),
    pytest.param(b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested more than 32 levels",
                 id="deeply-nested"),
    pytest.param(b"reclaim:\n  mode: \xff\xfe\n", "not UTF-8: byte 0xff on line 2",
                 id="not-utf-8"),
    pytest.param(laughs(9, 9).encode(), "expands to more than 100000 values",
                 id="billion-laughs"),
    pytest.param(("a: &a x\nb: [" + "*a, " * 65 + "]\n").encode(), "more than 64 aliases",
                 id="many-aliases"),
    pytest.param(b"a: &a [*a]\n", "an alias inside the value it names", id="recursive-alias"),
    pytest.param(b"# padding\n" * 200_000, "larger than 1048576 bytes", id="too-large"),
    pytest.param(b"a: [\n", "line 2", id="broken-yaml-names-its-line"),
]


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize(("content", "message"), HOSTILE)
@pytest.mark.parametrize("command", [
    ["policy", "check"], ["extender", "--policy"], ["reclaimer", "--policy"],
    ["report", "--policy"],
])
def test_hostile_policy_files_exit_2_naming_the_file_and_the_problem(
        tmp_path, capsys, content, message, command):
    bad = tmp_path / "hostile.yaml"
    bad.write_bytes(content)
    started = time.monotonic()
    assert exit_code([*command, str(bad)]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert f"invalid policy {bad}" in err and message in err
    assert "<unicode string>" not in err and "Traceback" not in err


def test_the_scheduler_sends_the_extender_every_gpu_resource_the_policies_count():
    """kube-scheduler calls an extender with managedResources only for pods requesting one of
    them (`IsInterested`, k8s.io/kubernetes pkg/scheduler/extender.go): a MIG or shared-GPU
    resource missing there would never be placed by gpusteward."""
    config = yaml.safe_load((ROOT / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    managed = [r["name"] for r in config["extenders"][0]["managedResources"]]
    for path in (EXAMPLE, ROOT / "sandbox" / "policy.yaml"):
        assert load_policy(path).resources == managed, path
