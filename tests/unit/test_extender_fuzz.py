"""A bounded, fixed-seed fuzz of filter and prioritize bodies against the real app over loopback.

Bases are real request shapes in both scheduler modes (k8s.io/kube-scheduler/extender/v1
``ExtenderArgs``: ``NodeNames`` when the extender is ``nodeCacheCapable``, whole ``Nodes``
otherwise). Each mutation must get an answer below 500, no traceback may be logged, every
response must be counted in ``gpusteward_extender_requests_total``, and a good request must
still be answered afterwards (issue 13: "a bounded fuzz ... finds no traceback, hang or 500").
"""

from __future__ import annotations

import copy
import gzip
import json
import logging
import random
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import parse_policy
from gpusteward.extender.app import Extender, create_app
from gpusteward.extender.view import PlacementView
from tests.factories import A100, H100, L4, NOW, node, pod

SEED = 1913
MUTATIONS_PER_MODE = 200


def wire_pod() -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "ml", "uid": "uid-ml-pending",
                         "labels": {"gpusteward.io/class": "training"},
                         "annotations": {"gpusteward.io/card-types": "NVIDIA-H100*"}},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"nvidia.com/gpu": "2", "cpu": "4"},
                "limits": {"nvidia.com/gpu": "2"}}}],
                "priority": 0, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}


def wire_node(name: str, product: str) -> dict[str, Any]:
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64"}}}


BASES = {
    "names": {"Pod": wire_pod(), "Nodes": None, "NodeNames": ["h1", "a1", "l1"]},
    "nodes": {"Pod": wire_pod(), "NodeNames": None, "Nodes": {"metadata": {}, "items": [
        wire_node("h1", H100), wire_node("new", A100)]}},
}
ODD_VALUES: list[Any] = [
    None, True, -1, -5, 2.9, 0, 1e308, 10**40, -10**40, "", "²", "٣", "１", "1e3", "NaN",
    "\u0000", "𝟠", [], {}, [[["x"]]], {"a": {"b": None}}, "x" * 2000,
]


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


def put(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def mutate(rng: random.Random, base: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    doc = copy.deepcopy(base)
    where = rng.choice(paths(doc))
    kind = rng.choice(["swap", "swap", "deep", "number", "truncate", "gzip", "flip", "key"])
    headers = {"Content-Type": "application/json"}
    if kind == "swap":
        body = json.dumps(put(doc, where, rng.choice(ODD_VALUES))).encode()
    elif kind == "deep":
        depth = rng.choice([100, 5_000, 20_000])
        body = json.dumps(put(doc, where, "@@DEEP@@")).encode().replace(
            b'"@@DEEP@@"', b"[" * depth + b"]" * depth)
    elif kind == "number":
        number = rng.choice([b"1e400", b"-1e400", b"9" * 400, b"-0", b"1.5e-400"])
        body = json.dumps(put(doc, where, "@@N@@")).encode().replace(b'"@@N@@"', number)
    elif kind == "truncate":
        full = json.dumps(doc).encode()
        body = full[: rng.randrange(len(full))]
    elif kind == "gzip":
        headers["Content-Encoding"] = rng.choice(["gzip", "deflate", "br", "GZIP"])
        body = rng.choice([gzip.compress(json.dumps(doc).encode()),
                           b"\x1f\x8b" + rng.randbytes(64)])
    elif kind == "flip":
        raw = bytearray(json.dumps(doc).encode())
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        body = bytes(raw)
    else:  # an unknown or wrongly cased key somewhere
        parent = where[:-1] if where and isinstance(where[-1], str) else where
        target = doc
        for key in parent:
            target = target[key]
        if isinstance(target, dict):
            target[rng.choice(["pod", "NODENAMES", "Extra", "metadata", "ñ"])] = 1
        body = json.dumps(doc).encode()
    return body, headers


@pytest.fixture
async def client():
    fleet = FleetStore()
    fleet.replace_all([node("h1", H100), node("a1", A100), node("l1", L4)],
                      [pod("pending", node=None, gpus=2), pod("busy", node="h1", gpus=4)])
    extender = Extender(PlacementView(parse_policy({}), fleet, clock=lambda: NOW), None)
    await extender.refresh()
    async with TestClient(TestServer(create_app(extender, max_body_bytes=1 << 20))) as c:
        yield c, extender


def counted(extender: Extender) -> float:
    return sum(s.value for m in extender.metrics.registry.collect()
               if m.name == "gpusteward_extender_requests" for s in m.samples
               if s.name.endswith("_total"))


@pytest.mark.parametrize("mode", sorted(BASES))
async def test_mutated_requests_never_get_a_5xx_or_a_traceback(client, mode, caplog):
    c, extender = client
    rng = random.Random(f"{SEED}-{mode}")
    statuses: dict[int, int] = {}
    sent = 0
    with caplog.at_level(logging.WARNING):
        for i in range(MUTATIONS_PER_MODE):
            body, headers = mutate(rng, BASES[mode])
            verb = "filter" if i % 2 else "prioritize"
            resp = await c.post(f"/{verb}", data=body, headers=headers)
            await resp.read()
            sent += 1
            assert resp.status < 500, (verb, body[:300], headers)
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
        good = await c.post("/prioritize", data=json.dumps(BASES[mode]))
        sent += 1
    assert good.status == 200
    tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert tracebacks == []
    assert counted(extender) == sent
    assert statuses.get(400, 0) > MUTATIONS_PER_MODE // 4  # the fuzz did reach the decoder
