"""`gpusteward sandbox` is a development command: from a checkout it finds what it builds
from; from an installed copy of the package (what the image holds) `sandbox up` says so in one
line and exits 2, before building or starting anything."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from gpusteward.sandbox.checkout import NEEDED, REPO, missing_from_checkout


def test_a_checkout_has_everything_sandbox_up_reads():
    assert missing_from_checkout() is None


def test_the_image_leaves_out_what_sandbox_up_reads():
    ignored = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text()
               .splitlines() if line.strip() and not line.startswith("#")}
    assert all(path.split("/")[0] in ignored for path in NEEDED), (NEEDED, ignored)


def installed(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``gpusteward ARGV`` run from a copy of the package alone, as pip installs it."""
    site = tmp_path / "site-packages"
    if not site.exists():
        shutil.copytree(REPO / "gpusteward", site / "gpusteward",
                        ignore=shutil.ignore_patterns("__pycache__"))
    return subprocess.run([sys.executable, "-m", "gpusteward", *argv], cwd=tmp_path,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_sandbox_up_from_an_installed_package_says_it_is_a_development_command(tmp_path: Path):
    state = tmp_path / "state"
    done = installed(tmp_path, "sandbox", "up", "--state-dir", str(state))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("gpusteward sandbox: a development command: run it from a checkout")
    assert f"{tmp_path / 'site-packages'} has no sandbox/go/go.mod" in line  # the copy ran
    assert not state.exists()  # nothing built or started, nothing written


def test_sandbox_status_still_answers_from_an_installed_package(tmp_path: Path):
    done = installed(tmp_path, "sandbox", "status", "--state-dir", str(tmp_path / "state"))
    assert (done.returncode, done.stdout) == (1, "no sandbox running\n"), done.stderr
