"""The Dockerfile as text: it installs with the same constraints file and pyproject as
`make test`, and its final stage is slim and non-root. tests/image builds it and runs the
image itself."""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib import metadata

from packaging.requirements import Requirement

from tests.deploy.conftest import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    lines = [line.strip() for line in joined.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for op, arg in _instructions():
        if op == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((op, arg))
    return stages


def _pip_installs(text: str) -> list[list[str]]:
    words = shlex.split(text.replace("&&", " ; "))
    commands, current = [], []
    for word in [*words, ";"]:
        if word == ";":
            if "pip" in " ".join(current[:2]) and "install" in current:
                commands.append(current)
            current = []
        else:
            current.append(word)
    return commands


def _constraint_and_target(argv: list[str]) -> tuple[str, str]:
    constraint = argv[argv.index("-c") + 1]
    target = argv[-1].strip("'")
    return constraint, target


def test_the_image_installs_with_the_constraints_file_make_test_uses() -> None:
    build = _stages()[0]
    [image_install] = [c for op, arg in build if op == "RUN" for c in _pip_installs(arg)]
    makefile = (REPO / "Makefile").read_text()
    # The venv `make test` builds (the $(STAMP) recipe); `make bench` adds extras on top.
    [make_install] = [c for line in makefile.splitlines()
                      if "-c constraints.txt" in line and "[test]" in line
                      for c in _pip_installs(line.strip().replace("$(PY) -m pip", "pip"))]
    image_constraint, image_target = _constraint_and_target(image_install)
    make_constraint, make_target = _constraint_and_target(make_install)
    assert image_constraint == make_constraint == "constraints.txt"
    assert image_target == "."  # the package itself, no test extras
    assert make_target in {"-e .[test]", ".[test]"} or make_install[-2:] == ["-e", ".[test]"]
    copied = " ".join(arg for op, arg in build if op == "COPY")
    assert "pyproject.toml" in copied and "constraints.txt" in copied


def test_every_runtime_dependency_is_pinned_in_the_constraints_file() -> None:
    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pins = {norm(line.split("==")[0]) for line in
            (REPO / "constraints.txt").read_text().splitlines() if "==" in line}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [re.split(r"[<>=!~;\[ ]", d)[0] for d in project["dependencies"]]
    seen: set[str] = set()
    while todo:  # the whole runtime closure, as installed in this venv from the same pins
        name = norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    assert seen - pins == set()


def test_the_final_stage_is_slim_non_root_and_has_no_build_tools() -> None:
    final = _stages()[-1]
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE
    [user] = [arg for op, arg in final if op == "USER"]
    assert user.split(":")[0] not in {"0", "root"}
    runs = " ".join(arg for op, arg in final if op == "RUN")
    assert not re.search(r"apt-get install|gcc|build-essential|pip install", runs)
    assert ("COPY", "--from=build /opt/gpusteward /opt/gpusteward") in final
    assert ("ENTRYPOINT", '["gpusteward"]') in final
    assert not [op for op, _ in _instructions() if op == "HEALTHCHECK"]


def test_the_image_carries_oci_labels() -> None:
    for key in ("source", "version", "revision", "licenses", "title"):
        assert f"org.opencontainers.image.{key}=" in DOCKERFILE
