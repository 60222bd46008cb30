"""The policy file: read from disk here, parsed and checked by core.policy."""

from __future__ import annotations

from pathlib import Path

from gpusteward.core import policyyaml
from gpusteward.core.policy import Policy, PolicyError, read_policy
from gpusteward.core.typedconfig import FieldError


def load_policy(path: str | Path) -> Policy:
    """The policy in ``path``; PolicyError names every problem (the file's own included)."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(policyyaml.MAX_BYTES + 1)
    except OSError as e:
        raise PolicyError(source, [FieldError((), f"cannot read file: {e.strerror}")]) from e
    return read_policy(raw, source)
