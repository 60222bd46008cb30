"""A bounded, fixed-seed fuzz of `gpusteward policy check` (issue 13).

Mutations of the shipped example: values swapped for other types, NaN, ±Inf, huge and negative
numbers, deleted and unknown keys, deep nesting, and on the text: duplicated lines, random bytes,
cut files and alias bombs. Each case must finish within a time bound and either exit 2 naming the
file and a field path, or exit 0 with a policy that builds the extender's view and the reclaimer's
rules and runs one pure reclaim decision without an exception.
"""

from __future__ import annotations

import math
import random
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusteward.adapters.policyfile import load_policy
from gpusteward.cli import main
from gpusteward.core.fleet import FleetStore
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import Evidence, Snapshot
from gpusteward.core.reclaim.rules import rule_for, windows
from gpusteward.extender.view import PlacementView
from tests.factories import NOW, node, pod

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml"
SEED = 13
DATA_CASES = 240
TEXT_CASES = 120
# A parse that hangs (alias expansion, deep recursion) fails here: an unbounded alias bomb of a
# few hundred bytes runs for minutes. A case takes well under a second; 5 s was missed on two
# cores shared with a CI run's sandboxes, so the bound leaves room for load, not for a hang.
CASE_SECONDS = 20

ODD_VALUES: list[Any] = [
    math.nan, math.inf, -math.inf, 1e308, -1e308, 10**30, -1, -0.5, 0, 0.0, "", "x" * 300,
    True, None, [], {}, [1, "a"], {"a": 1}, "1e308", "-5m", "10m", "1h30m", ".nan", "٣",
]


def paths(data: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from paths(v, (*prefix, i))


def replace(data: Any, path: tuple, change) -> Any:
    """A copy of data with change(old value) at path (change returns ... to delete the key)."""
    if not path:
        return change(data)
    out = dict(data) if isinstance(data, dict) else list(data)
    new = replace(data[path[0]], path[1:], change)
    if new is ...:
        del out[path[0]]
    else:
        out[path[0]] = new
    return out


def nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def mutate_data(rng: random.Random, base: dict) -> str:
    data = base
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(list(paths(data))[1:])
        kind = rng.choice(["swap", "swap", "number", "delete", "unknown", "nest"])
        if kind == "swap":
            value = rng.choice(ODD_VALUES)
            data = replace(data, path, lambda _, v=value: v)
        elif kind == "number":
            scale = rng.choice([-1e9, -1, 1e-9, 1e6, 1e300])
            data = replace(data, path, lambda _, s=scale: rng.random() * s)
        elif kind == "delete":
            data = replace(data, path, lambda _: ...)
        elif kind == "unknown":
            data = replace(data, path,
                           lambda v: {**v, "surprise": 1} if isinstance(v, dict) else v)
        else:
            depth = rng.randint(2, 40)
            data = replace(data, path, lambda v, d=depth: nest(v, d))
    return yaml.safe_dump(data, sort_keys=False)


def mutate_text(rng: random.Random, text: str) -> bytes:
    lines = text.splitlines(keepends=True)
    kind = rng.choice(["duplicate", "bytes", "cut", "bomb", "deep", "swap-lines"])
    if kind == "duplicate":
        i = rng.randrange(len(lines))
        lines.insert(i + rng.randint(0, 3), lines[i])
        return "".join(lines).encode()
    raw = text.encode()
    if kind == "bytes":
        at = rng.randrange(len(raw))
        return raw[:at] + rng.randbytes(rng.randint(1, 8)) + raw[at:]
    if kind == "deep":
        depth = rng.randint(30, 5000)
        return raw + b"deep: " + b"[" * depth + b"]" * depth + b"\n"
    if kind == "cut":
        return raw[:rng.randrange(len(raw))]
    if kind == "bomb":
        fanout, levels = rng.randint(2, 12), rng.randint(3, 12)
        bomb = ["x0: &x0 [lol]"] + [
            f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * fanout)}]" for i in range(1, levels)]
        return (text + "\n".join(bomb) + "\n").encode()
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines).encode()


def cases() -> list[tuple[str, bytes]]:
    rng = random.Random(SEED)
    text = EXAMPLE.read_text()
    base = yaml.safe_load(text)
    out = [(f"data-{n}", mutate_data(rng, base).encode()) for n in range(DATA_CASES)]
    out += [(f"text-{n}", mutate_text(rng, text)) for n in range(TEXT_CASES)]
    return out


@contextmanager
def time_bound(seconds: int) -> Iterator[None]:
    def expired(*_: Any) -> None:
        raise TimeoutError(f"a policy case ran over {seconds}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def exercise(path: Path) -> None:
    """What the apps build from a policy, and one pure reclaim decision on a small fleet."""
    policy = load_policy(path)
    fleet = FleetStore()
    fleet.upsert_node(node("n1"))
    view = PlacementView(policy, fleet, clock=lambda: NOW)
    view.rebuild()
    pods = tuple(pod(f"p{i}", created_at=NOW - 7200) for i in range(3))
    fleet_nodes = {"n1": node("n1")}
    evidence = {w: {p.key: Evidence(window=w, peak_percent=float(10 * i), coverage=1.0,
                                    gpus_seen=1) for i, p in enumerate(pods)}
                for w in windows(policy, pods)}
    for p in pods:
        rule_for(p, policy)
    plan(Snapshot(now=NOW, pods=pods, nodes=fleet_nodes, owners={}, namespace_labels={},
                  evidence=evidence, telemetry_ok=True), policy)


CASES = cases()


def test_the_fuzz_covers_both_outcomes(tmp_path):
    """The mutations are distinct, and neither all rejected nor all accepted."""
    assert len({content for _, content in CASES}) > 0.9 * len(CASES)
    path = tmp_path / "policy.yaml"
    outcomes = []
    for _, content in CASES[:60]:
        path.write_bytes(content)
        outcomes.append(exit_code(["policy", "check", str(path)]))
    assert outcomes.count(0) >= 5 and outcomes.count(2) >= 5


@pytest.mark.parametrize(("name", "content"), CASES, ids=[name for name, _ in CASES])
def test_a_mutated_policy_is_rejected_with_a_path_or_works(tmp_path, capsys, name, content):
    path = tmp_path / "policy.yaml"
    path.write_bytes(content)
    started = time.monotonic()
    with time_bound(CASE_SECONDS):
        code = exit_code(["policy", "check", str(path)])
        out, err = capsys.readouterr()
        assert code in (0, 2), err
        if code == 0:
            assert out == f"{path}: valid\n"
            exercise(path)
        else:
            assert err.startswith(f"invalid policy {path}:\n  - "), err
            assert "Traceback" not in err and "<unicode string>" not in err
    assert time.monotonic() - started < CASE_SECONDS
