"""docs/policy.md names every policy field, so a new field cannot ship undocumented."""

from pathlib import Path

from gpusteward.core.policyfields import fields

DOC = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()


def test_every_policy_field_is_documented():
    missing = [path for path, *_ in fields() if f"`{path}`" not in DOC]
    assert missing == []


def test_the_doc_names_no_field_that_does_not_exist():
    import re

    known = {path for path, *_ in fields()}
    named = set(re.findall(r"^\| `([a-zA-Z*\[\].]+)` \|", DOC, re.MULTILINE))
    assert named - known == set()


def test_every_duration_row_gives_its_accepted_range():
    import re

    rows = dict(re.findall(r"^\| `([a-zA-Z*\[\].]+)` \| ([^|]*) \|", DOC, re.MULTILINE))
    wrong = {path: rows.get(path) for path, _, bounds in fields()
             if bounds is not None and rows.get(path) != f"duration, {bounds.text}"}
    assert wrong == {}
