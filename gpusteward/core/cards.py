"""Card types: glob patterns over the GFD `nvidia.com/gpu.product` label.

Patterns match the *whole* product name (`NVIDIA-A10` never matches `NVIDIA-A100-SXM4-80GB`);
matching is case-sensitive like the label itself.

GFD names a shared or partitioned card by appending to the card's name
(k8s-device-plugin `internal/lm/resource.go`, `productLabel`): `-MIG-<profile>` for a MIG
device under the single strategy, then `-SHARED` when time-slicing replicates the resource
without renaming it (`NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED`). A pattern matches a product
when it matches the whole label or the physical card the label names, so `Tesla-T4` accepts a
`Tesla-T4-SHARED` node while `Tesla-T4-SHARED` accepts only the time-sliced one.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from functools import lru_cache

PRODUCT_LABEL = "nvidia.com/gpu.product"
CARD_TYPES_ANNOTATION = "gpusteward.io/card-types"
_ALLOWED = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]+$")
_GFD_SUFFIXES = re.compile(r"^(?P<card>.+?)(?:-MIG-(?P<profile>[^-]+))?(?:-SHARED)?$")


class CardPatternError(ValueError):
    pass


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern[str]:
    if not _ALLOWED.match(pattern):
        raise CardPatternError(
            f"card pattern {pattern!r} may only hold letters, digits, '-', '_', '.', and * ? [ ]"
        )
    return re.compile(fnmatch.translate(pattern))


def compile_patterns(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(_compile(p) for p in patterns)


def physical_card(product: str) -> str:
    """`NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED` -> `NVIDIA-A100-SXM4-80GB`."""
    m = _GFD_SUFFIXES.match(product)
    return m.group("card") if m else product


def mig_profile(product: str) -> str | None:
    """The MIG profile a single-strategy product label names (`1g.10gb`), else None."""
    m = _GFD_SUFFIXES.match(product)
    return m.group("profile") if m else None


def matches(pattern: re.Pattern[str], product: str) -> bool:
    """The whole label, or the physical card it names (see the module docstring)."""
    if pattern.match(product):
        return True
    card = physical_card(product)
    return card != product and pattern.match(card) is not None


def parse_card_types(annotation: str | None) -> tuple[str, ...]:
    """`NVIDIA-H100*, NVIDIA-A100-SXM4-80GB` -> ('NVIDIA-H100*', 'NVIDIA-A100-SXM4-80GB')."""
    if not annotation:
        return ()
    patterns = tuple(p.strip() for p in annotation.split(",") if p.strip())
    compile_patterns(patterns)
    return patterns


def preference_rank(product: str | None, patterns: Sequence[str]) -> int | None:
    """Index of the first pattern the product matches, or None when it matches none."""
    if product is None:
        return None
    for i, pattern in enumerate(patterns):
        if matches(_compile(pattern), product):
            return i
    return None


class TierTable:
    """Maps a product to the first policy tier whose patterns match it."""

    def __init__(self, tiers: Sequence[tuple[str, Sequence[str]]]):
        self._tiers = [(name, compile_patterns(products)) for name, products in tiers]
        self._cache: dict[str | None, str | None] = {}

    def tier_of(self, product: str | None) -> str | None:
        if product not in self._cache:
            self._cache[product] = self._lookup(product)
        return self._cache[product]

    def _lookup(self, product: str | None) -> str | None:
        if product is None:
            return None
        for name, patterns in self._tiers:
            if any(matches(p, product) for p in patterns):
                return name
        return None
