"""Policy YAML with bounds: a hostile or mistyped file is an error, never a hang or a traceback.

PyYAML's safe loader accepts duplicate keys (the last wins silently: `mode: observe` then
`mode: enforce` means enforce), recurses once per nesting level, and expands aliases without
limit (a "billion laughs" file of a few hundred bytes grows past a gigabyte). This loader refuses
all three while composing, before anything is built, and names the file in every message.
"""

from __future__ import annotations

import io
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import CollectionNode, MappingNode, Node, ScalarNode

MAX_BYTES = 1024 * 1024  # the shipped example is under 10 KiB
MAX_DEPTH = 32  # the policy itself nests 6 levels deep
MAX_ALIASES = 64  # uses of `*anchor`
MAX_VALUES = 100_000  # values in the document once every alias is expanded

_MERGE = "tag:yaml.org,2002:merge"


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, text: str, name: str):
        stream = io.StringIO(text)
        stream.name = name  # type: ignore[misc]  # PyYAML's marks quote the stream's name
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values under it, aliases expanded

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise ComposerError(None, None, f"more than {MAX_ALIASES} aliases", mark)
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise ComposerError(None, None, "an alias inside the value it names", mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        size = 1 + sum(self._sizes[id(c)] for c in _children(node))
        self._sizes[id(node)] = size
        if size > MAX_VALUES:
            raise ComposerError(None, None, f"expands to more than {MAX_VALUES} values "
                                "(aliases repeat what they name)", mark)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE:
                continue  # `<<: *base` merges are meant to be overridden
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                raise ConstructorError(None, None, f"duplicate key {key!r} on lines "
                                       f"{first[key]} and {line}", key_node.start_mark)
            first[key] = line
        return super().construct_mapping(node, deep=deep)


def _children(node: Node | None) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, CollectionNode):
        return list(node.value)
    return []


def load(text: str, name: str) -> Any:
    """The single document in text; raises yaml.YAMLError whose message names `name`."""
    loader = _BoundedLoader(text, name)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
