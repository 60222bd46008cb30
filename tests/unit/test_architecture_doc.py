"""docs/architecture.md names real code (issue 28): every module path, ``module.symbol`` and
defined name it cites in backticks exists, so the document cannot drift from the code silently.

What counts as a reference: ``a/b.py`` (a file under gpusteward/ or the repository),
``a/b.Symbol`` and ``core.a.Symbol`` (a module and an attribute chain in it), and a bare
``CamelCase``, ``UPPER_CASE`` or ``snake_case`` name (defined somewhere in the code or its
tests). Anything else in backticks (commands, labels, URLs, metric names) is prose."""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "gpusteward"
SOURCES = ("gpusteward", "tests", "benchmarks", "deploy")
TOP = ("core", "adapters", "extender", "reclaimer", "report", "whatif", "agent", "sandbox",
       "cli", "gpusteward")
METRIC = ("gpusteward_", "DCGM_")  # series names, not code
FILE = re.compile(r"^[\w./-]+\.(py|md|toml|yaml|json)$")
PATHSYM = re.compile(r"^(\w+(?:/\w+)+)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")
DOTTED = re.compile(r"^(\w+(?:\.\w+)+)$")
BARE = re.compile(r"^(?:[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|"
                  r"_?[a-z][a-z0-9]*(?:_[a-z0-9]+)+)$")


def references() -> list[str]:
    return sorted(set(re.findall(r"`([^`\n]+)`", DOC.read_text())))


def in_file() -> list[tuple[str, str]]:
    """(file, name) where the document says a file holds a name: "`a/b.py` (`Name`)"."""
    return sorted(set(re.findall(r"`([\w/]+\.py)` \(`(\w+)`", DOC.read_text())))


def names_in(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            names.update(e.id for t in targets if isinstance(t, ast.Tuple)
                         for e in t.elts if isinstance(e, ast.Name))
    return names


@cache
def defined() -> frozenset[str]:
    """Every class, function, method and assigned name in gpusteward/ and its tests, tools and
    benchmarks."""
    names: set[str] = set()
    for path in (p for d in SOURCES for p in (ROOT / d).rglob("*.py")):
        names |= names_in(path) | {path.stem}
    return frozenset(names)


def resolve(module: str, chain: str) -> None:
    obj = importlib.import_module(module)
    for part in chain.split("."):
        assert hasattr(obj, part), f"{module} has no {chain}"
        obj = getattr(obj, part)


def module_of(dotted: str) -> tuple[str, str] | None:
    """The longest importable module prefix of a dotted name, and the rest."""
    parts = dotted.split(".")
    if parts[0] != "gpusteward":
        parts = ["gpusteward", *parts]
    for cut in range(len(parts), 1, -1):
        name = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(name) is not None:
                return name, ".".join(parts[cut:])
        except ModuleNotFoundError:  # a prefix that is a module, not a package
            continue
    return None


def check(ref: str) -> str | None:
    """None when ``ref`` is prose or names what exists; else what is missing."""
    if FILE.match(ref):
        here = [PACKAGE / ref, ROOT / ref, ROOT / "gpusteward" / "sandbox" / ref]
        return None if any(p.exists() for p in here) or "<" in ref or "*" in ref else \
            f"no file {ref}"
    if (m := PATHSYM.match(ref)) and m.group(1).split("/")[0] in TOP:
        module = "gpusteward." + m.group(1).replace("/", ".")
        try:
            resolve(module, m.group(2))
        except (ImportError, AssertionError) as e:
            return str(e)
        return None
    if (m := DOTTED.match(ref)) and ref.split(".")[0] in TOP:
        found = module_of(ref)
        if found is None:
            return f"no module for {ref}"
        module, chain = found
        try:
            if chain:
                resolve(module, chain)
        except AssertionError as e:
            return str(e)
        return None
    if BARE.match(ref) and not ref.startswith(METRIC) and ref not in defined():
        return f"{ref} is defined nowhere in {', '.join(SOURCES)}"
    return None


def test_the_document_cites_something():
    assert len(references()) > 50


@pytest.mark.parametrize("ref", references())
def test_every_cited_path_and_symbol_exists(ref):
    assert check(ref) is None, check(ref)


@pytest.mark.parametrize(("path", "name"), in_file())
def test_a_name_said_to_be_in_a_file_is_defined_there(path, name):
    found = [p for p in (PACKAGE / path, ROOT / path) if p.exists()]
    assert found and name in names_in(found[0]), f"{name} is not defined in {path}"


@pytest.mark.parametrize(("ref", "missing"), [
    ("core/nosuch.py", True), ("core/reclaim/kinds.nosuch", True), ("core.policy.Nope", True),
    ("NoSuchThingAnywhere", True), ("core/policy.py", False),
    ("adapters/policyfile.load_policy", False), ("core.reclaim.kinds.Catalog.of", False),
    ("load_policy", False), ("make test", False)])
def test_the_checker_tells_a_missing_name_from_a_real_one(ref, missing):
    assert (check(ref) is not None) is missing
