"""Operator surface: one log format (UTC, text or JSON lines), the reclaimer's decision lines
only when a decision changes, every flag documented with its default and settable from the
environment, and gpusteward_build_info on every component."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpusteward.adapters.connectflags import whole_number
from gpusteward.adapters.envflags import env_name
from gpusteward.adapters.logs import configure
from gpusteward.cli import _leaves, build_parser
from gpusteward.core.model import Pod
from gpusteward.core.policy import ReclaimMode, parse_policy
from gpusteward.core.reclaim.model import Action, Evidence, PastAction, Snapshot
from gpusteward.extender.metrics import ExtenderMetrics
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.reclaimer.metrics import ReclaimerMetrics

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
WINDOW = 1800.0  # the policy's default idle window
UTC_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs_are_one_object_per_line_in_utc_with_the_fields_logged(
        restore_logging) -> None:
    out = io.StringIO()
    configure("info", "json", out)
    log = logging.getLogger("gpusteward.reclaimer")
    log.info("action=%s pod=%s", "mark", "ml/a", extra={"pod": "ml/a", "team": "vision"})
    log.debug("not written at info")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("cycle failed")

    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert UTC_STAMP.match(first.pop("time"))
    assert first == {"level": "info", "logger": "gpusteward.reclaimer",
                     "message": "action=mark pod=ml/a", "pod": "ml/a", "team": "vision"}
    assert second["level"] == "error" and "ValueError: boom" in second["exception"]


def test_text_logs_start_with_a_utc_timestamp(restore_logging) -> None:
    out = io.StringIO()
    configure("warning", "text", out)
    logging.getLogger("aiohttp.server").warning("also ours: %d", 7)
    logging.getLogger("gpusteward").info("below the level")
    (line,) = out.getvalue().splitlines()
    stamp, rest = line.split(" ", 1)
    assert UTC_STAMP.match(stamp)
    assert rest == "WARNING aiohttp.server also ours: 7"


def test_every_component_logs_json_from_the_command_line() -> None:
    """A real run: the agent (no NVML library here) logs why it stops, as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTEWARD_")}
    done = subprocess.run(
        [sys.executable, "-m", "gpusteward", "agent", "--node-name", "gpu-1",
         "--kube-api", "off", "--log-format", "json"],
        cwd=REPO, env={**env, "LD_LIBRARY_PATH": "/nonexistent"}, capture_output=True,
        text=True, timeout=60)
    assert done.returncode == 1
    (entry,) = (json.loads(line) for line in done.stderr.splitlines())
    assert entry["logger"] == "gpusteward.agent" and entry["level"] == "error"
    assert entry["message"].startswith("NVML unavailable on gpu-1")


# -- the reclaimer's decision lines --------------------------------------------------------

def gpu_pod(name: str, uid: str) -> Pod:
    return Pod(namespace="ml", name=name, uid=uid, gpus=1, node="n1", phase="Running",
               created_at=NOW - 7200)


class Cluster:
    """A fake Reader (the reclaimer's protocol): the pods and their peak utilization."""

    def __init__(self) -> None:
        self.peaks: list[tuple[Pod, float]] = []

    async def read(self, recent: list[PastAction]) -> Snapshot:
        ev = {p.key: Evidence(window=WINDOW, peak_percent=peak, coverage=1.0, gpus_seen=1)
              for p, peak in self.peaks}
        return Snapshot(now=NOW, pods=tuple(p for p, _ in self.peaks), nodes={}, owners={},
                        namespace_labels={}, evidence={WINDOW: ev}, telemetry_ok=True,
                        telemetry_problem="", recent_actions=tuple(recent))


class NoWrites:
    async def apply(self, action: Action) -> str:
        raise AssertionError("observe mode writes nothing")


def logged(caplog: pytest.LogCaptureFixture, prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.INFO and r.getMessage().startswith(prefix)]


async def test_a_pods_decision_is_logged_once_while_it_does_not_change(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster()
    a, b = gpu_pod("a", "uid-a"), gpu_pod("b", "uid-b")
    cluster.peaks = [(a, 80.0), (b, 1.0)]
    reclaimer = Reclaimer(parse_policy({}), ReclaimMode.OBSERVE, cluster, NoWrites())
    caplog.set_level(logging.DEBUG, logger="gpusteward.reclaimer")

    await reclaimer.cycle()
    assert [line.split(" why=")[0] for line in logged(caplog, "decision ")] == [
        "decision pod=ml/a team=ml gpus=1 state=busy peak=80.0 coverage=1.00 window=1800s "
        "borrowed=False",
        "decision pod=ml/b team=ml gpus=1 state=idle peak=1.0 coverage=1.00 window=1800s "
        "borrowed=False"]
    assert [line.split(" msg=")[0] for line in logged(caplog, "action=")] == [
        "action=mark pod=ml/b team=ml reason=idle how=- mode=observe result=skipped"]
    caplog.clear()

    cluster.peaks = [(a, 75.0), (b, 2.0)]  # new figures, the same decisions
    await reclaimer.cycle()
    assert logged(caplog, "decision ") == [] and logged(caplog, "action=") == []
    (summary,) = logged(caplog, "cycle ")
    assert " pods=2 busy=1 idle=1 unknown=0 protected=0 decisions_changed=0 actions=1 " in summary
    caplog.clear()

    cluster.peaks = [(a, 3.0), (b, 2.0)]  # a went idle
    await reclaimer.cycle()
    assert [line.split(" peak=")[0] for line in logged(caplog, "decision ")] == [
        "decision pod=ml/a team=ml gpus=1 state=idle"]
    assert [line.split(" reason=")[0] for line in logged(caplog, "action=")] == [
        "action=mark pod=ml/a team=ml"]
    caplog.clear()

    a_again = gpu_pod("a", "uid-a2")  # deleted and recreated under the same name
    cluster.peaks = [(a_again, 3.0)]
    await reclaimer.cycle()
    assert [line.split(" peak=")[0] for line in logged(caplog, "decision ")] == [
        "decision pod=ml/a team=ml gpus=1 state=idle"]
    assert set(reclaimer.decisions.last) == {"uid-a2"}  # the gone pods are forgotten


# -- flags ---------------------------------------------------------------------------------

def all_options() -> list[tuple[argparse.ArgumentParser, argparse.Action]]:
    return [(leaf, a) for leaf in _leaves(build_parser(every_command=True))
            for a in leaf._actions if a.option_strings and a.dest != "help"]


def test_every_flag_has_help_showing_its_variable_and_default() -> None:
    for leaf, action in all_options():
        assert action.help, f"{leaf.prog} {action.option_strings[0]} has no help"
        shown = leaf._get_formatter()._expand_help(action)
        assert f"${env_name(action.dest)}" in shown, (leaf.prog, action.option_strings, shown)
        assert "default" in shown, (leaf.prog, action.option_strings, shown)
        assert shown in " ".join(leaf.format_help().split()) or len(shown) > 40


def test_the_reclaimer_metrics_port_is_not_prometheus_9090() -> None:
    args = build_parser().parse_args(["reclaimer"])
    assert args.metrics_listen == ("0.0.0.0", 8080)


def test_every_flag_can_be_set_by_its_environment_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSTEWARD_POLICY", "/etc/gpusteward/policy.yaml")  # required flag
    monkeypatch.setenv("GPUSTEWARD_LISTEN", "127.0.0.1:9999")
    monkeypatch.setenv("GPUSTEWARD_LOG_FORMAT", "json")
    monkeypatch.setenv("GPUSTEWARD_MAX_BODY_MB", "64")
    args = build_parser().parse_args(["extender"])
    assert (args.policy, args.listen, args.log_format, args.max_body_mb) == (
        "/etc/gpusteward/policy.yaml", ("127.0.0.1", 9999), "json", 64)
    args = build_parser().parse_args(["extender", "--listen", "127.0.0.1:7777"])
    assert args.listen == ("127.0.0.1", 7777)  # the flag wins

    monkeypatch.setenv("GPUSTEWARD_ONCE", "true")
    monkeypatch.setenv("GPUSTEWARD_MODE", "warn")
    args = build_parser().parse_args(["reclaimer"])
    assert (args.once, args.mode) == (True, "warn")

    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("GPUSTEWARD_INTERVAL", "5")
    args = build_parser().parse_args(["agent"])
    assert (args.node_name, args.interval) == ("gpu-7", 5.0)


@pytest.mark.parametrize(("text", "least", "ok"), [
    pytest.param("0", 0, True, id="zero-at-least-zero"),
    pytest.param("2", 2, True, id="at-the-least"),
    pytest.param("1", 2, False, id="below-the-least"),
    pytest.param("+3", 0, False, id="signed"),
    pytest.param(" 3", 0, False, id="spaced"),
    pytest.param("1_000", 0, False, id="underscored"),
    pytest.param("\u0663", 0, False, id="non-ascii-digit"),
])
def test_a_whole_number_flag_takes_plain_digits_only(text: str, least: int, ok: bool) -> None:
    parse = whole_number(least, "seconds")
    if ok:
        assert parse(text) == int(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError,
                           match=f"whole number of seconds >= {least}, got"):
            parse(text)


def test_a_bad_variable_of_another_command_does_not_stop_this_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSTEWARD_TOP", "many")  # only `report` has --top
    assert build_parser().parse_args(["policy", "check", "p.yaml"]).file == "p.yaml"


# -- build info ----------------------------------------------------------------------------

def build_info(text: str) -> dict[str, str]:
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "gpusteward_build_info"]
    (sample,) = family.samples
    assert sample.value == 1
    return sample.labels


@pytest.mark.parametrize("registry", [
    pytest.param(lambda: ExtenderMetrics().registry, id="extender"),
    pytest.param(lambda: ReclaimerMetrics().registry, id="reclaimer"),
])
def test_build_info_is_on_every_registry(registry) -> None:
    from prometheus_client import generate_latest

    labels = build_info(generate_latest(registry()).decode())
    assert labels == {"version": version("gpusteward"), "revision": "unknown",
                      "python_version": ".".join(map(str, sys.version_info[:3]))}
