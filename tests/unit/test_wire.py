"""Extender wire details: node names from full Node objects, fast path and fallback."""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.extender import wire


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        pytest.param(b'{"metadata":{"name":"gpu-1","uid":"u"},"status":{}}', "gpu-1",
                     id="as-go-writes-it"),
        pytest.param(b'{"kind":"Node","apiVersion":"v1","metadata":{"name":"gpu-2"}}', "gpu-2",
                     id="with-type-meta"),
        pytest.param(b'{"status":{},"metadata":{"uid":"u","name":"gpu-3"}}', "gpu-3",
                     id="other-key-order-falls-back"),
        pytest.param(b'{ "metadata" : { "name" : "gpu-4" } }', "gpu-4",
                     id="whitespace-falls-back"),
        pytest.param(b'{"metadata":{"name":"gpu\\u002d5"}}', "gpu-5", id="escapes-fall-back"),
    ],
)
def test_node_names_are_read_from_full_node_objects(raw, name):
    assert wire.node_name(msgspec.Raw(raw)) == name


def test_a_broken_node_object_is_a_bad_request():
    with pytest.raises(wire.BadRequest, match="invalid node"):
        wire.node_name(msgspec.Raw(b'{"metadata":'))
