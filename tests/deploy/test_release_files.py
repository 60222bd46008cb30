"""What a user checks before installing: the licence matches the declared one, and the changelog
and the chart name the version the package is."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version as distribution_version
from pathlib import Path

import yaml

import gpusteward

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_licence_file_is_the_apache_2_0_text_the_package_declares():
    assert (PROJECT["license"], PROJECT["license-files"]) == ("Apache-2.0", ["LICENSE"])
    text = (ROOT / "LICENSE").read_text()
    assert " ".join(text.split()[:6]) == "Apache License Version 2.0, January 2004"
    # the whole text, not its first page: the terms' last section and their end
    assert "9. Accepting Warranty or Additional Liability." in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_changelog_has_the_packages_version_and_the_chart_ships_it():
    assert PROJECT["dynamic"] == ["version"]  # built from the package's own __version__
    version = gpusteward.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog,
                     re.MULTILINE), version
    chart = yaml.safe_load((ROOT / "deploy/helm/gpusteward/Chart.yaml").read_text())
    assert chart["appVersion"] == version


def test_the_installed_distribution_has_the_version_the_package_says():
    # pyproject.toml's tool.setuptools.dynamic, read when the venv's editable install was built
    assert distribution_version("gpusteward") == gpusteward.__version__
