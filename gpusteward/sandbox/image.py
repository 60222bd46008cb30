"""Build the gpusteward image from the Dockerfile, unchanged, with no registry (``make image``).

No registry answers here, so the Dockerfile's ``FROM python:3.11-slim`` is given a base made
locally from Debian's packages: ``debootstrap --variant=minbase`` of bookworm from the machine's
own apt mirror, then python3.11, its venv module, ``python`` and the CA bundle (what the slim
image holds). The base is tagged with a hash of that recipe and the mirror, so it is made once
per recipe (about 30 s) and found again by its tag. ``buildah bud --layers`` then builds the
Dockerfile; its layer cache skips the pip install while the sources are unchanged. Users build
with ``docker build`` (docs/install.md); the Dockerfile is the same.

Everything lives in gpusteward's own container storage under the cache directory
(``<cache>/oci``) with its own containers.conf, so the host's podman set-up is neither read nor
changed: runc with cgroupfs (crun refuses a cgroup v1 "hybrid" host), ulimits within the hard
limits the machine allows (podman's defaults ask for more and fail), events to a file (no
systemd). Podman itself keeps a little state in ``/run/libpod``, ``/run/runc`` and
``/var/lib/containers/cache`` that no setting moves.

Run ``python -m gpusteward.sandbox.image`` to build and print the tag, id, size and revision.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpusteward.adapters.version import version
from gpusteward.sandbox.build import (
    Log,
    _locked,
    _log_tail,
    _stderr_log,
    cache_root,
    go_source_dir,
)
from gpusteward.sandbox.checkout import REPO

__all__ = ["IMAGE", "SIZE_BUDGET_MB", "Built", "ImageBuildError", "archive", "ensure_image",
           "ensure_pause", "oci_env", "podman"]

#: The tag `make image` builds; pods name it with ``imagePullPolicy: Never``.
IMAGE = "localhost/gpusteward:dev"

#: What the image may weigh (it weighed 289 MB on its Debian bookworm base of 176 MB): a
#: dependency that brings a compiler or a second Python shows up here first.
SIZE_BUDGET_MB = 330

#: The tools the build and the image tests run; `make system-deps` installs them.
TOOLS = ("debootstrap", "buildah", "podman", "runc")

_SUITE = "bookworm"
#: What python:3.11-slim holds on top of Debian's minimal base.
_BASE_PACKAGES = ("python3.11", "python3.11-venv", "python-is-python3", "ca-certificates")
#: The base image's environment; PATH must be set here, or the Dockerfile's
#: ``ENV PATH=/opt/gpusteward/bin:$PATH`` loses /usr/bin.
_BASE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
#: Bump when the base recipe changes in a way the key cannot see.
_BASE_RECIPE = "1"
_DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: The host's CA bundle, mounted into the build's RUN steps only: pip reaches PyPI through
#: whatever TLS-intercepting proxy the host trusts, and the image does not carry it.
_HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class ImageBuildError(RuntimeError):
    """The image could not be built; the message says why and names the log."""


@dataclass(frozen=True, slots=True)
class Built:
    """The image built: its tag, id, size in bytes, and the version and revision it carries."""

    tag: str
    id: str
    size: int
    version: str
    revision: str

    @property
    def size_mb(self) -> float:
        return self.size / 1e6


def _oci_root() -> Path:
    return cache_root() / "oci"


def _run_root() -> Path:
    # Runtime state (locks, container state) belongs on /run, which is emptied at boot; a
    # stale copy of it in the cache would outlive the containers it describes.
    return Path("/run/gpusteward-oci") if os.geteuid() == 0 else _oci_root() / "run"


def _ulimits() -> list[str]:
    """podman's default ulimits exceed what this machine lets a process raise to."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    cap = 1 << 20
    nofile = cap if nofile == resource.RLIM_INFINITY else min(nofile, cap)
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def oci_env() -> dict[str, str]:
    """The environment that points buildah and podman at gpusteward's own storage and
    configuration (written on first use)."""
    conf = _oci_root() / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    run = _run_root()
    containers = conf / "containers.conf"
    storage = conf / "storage.conf"
    _write_if_changed(containers, "\n".join([
        "[containers]",
        f"default_ulimits = {json.dumps(_ulimits())}",
        "[engine]",
        'runtime = "runc"',
        'cgroup_manager = "cgroupfs"',
        'events_logger = "file"',
        f'events_logfile_path = "{run / "events.log"}"',
        f'tmp_dir = "{run / "libpod"}"',
        "",
    ]))
    _write_if_changed(storage, "\n".join([
        "[storage]",
        'driver = "overlay"',
        f'graphroot = "{_oci_root() / "storage"}"',
        f'runroot = "{run / "storage"}"',
        "",
    ]))
    return {**os.environ, "CONTAINERS_CONF": str(containers),
            "CONTAINERS_STORAGE_CONF": str(storage)}


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def podman(*argv: str, timeout: float = 120, check: bool = True,
           ) -> subprocess.CompletedProcess[str]:
    """``podman ARGV`` against gpusteward's storage; raises ImageBuildError with its stderr
    when ``check`` and it fails."""
    done = subprocess.run(["podman", *argv], env=oci_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise ImageBuildError(f"podman {' '.join(argv)} failed ({done.returncode}): "
                              f"{done.stderr.strip()}")
    return done


def _missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def _mirror() -> str:
    """The Debian mirror the machine's own apt sources name (the only one it may reach)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        text = path.read_text(encoding="utf-8", errors="replace")
        for stanza in re.split(r"\n\s*\n", text):
            ours = re.search(rf"^Suites:.*\b{_SUITE}\b", stanza, re.M)
            if ours and "debian-security" not in stanza:
                match = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if match:
                    return match.group(1).rstrip("/")
    legacy = Path("/etc/apt/sources.list")
    if legacy.is_file():
        for line in legacy.read_text(encoding="utf-8", errors="replace").splitlines():
            words = line.split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == _SUITE:
                return words[1].rstrip("/")
    return _DEFAULT_MIRROR


def _base_tag(mirror: str) -> str:
    digest = hashlib.sha256("\0".join(
        [_BASE_RECIPE, _SUITE, mirror, *_BASE_PACKAGES, *_BASE_ENV]).encode()).hexdigest()
    return f"localhost/gpusteward-base:{digest[:16]}"


def _exists(tag: str) -> bool:
    return podman("image", "exists", tag, check=False).returncode == 0


def _step(argv: list[str], log_path: Path, what: str, timeout: float = 900) -> None:
    with open(log_path, "a", encoding="utf-8") as out:
        out.write(f"# {' '.join(argv)}\n")
        out.flush()
        started = time.monotonic()
        try:
            done = subprocess.run(argv, env=oci_env(), stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ImageBuildError(f"{what} took over {timeout:.0f}s; log: {log_path}") from exc
        out.write(f"# exit {done.returncode} after {time.monotonic() - started:.0f}s\n")
    if done.returncode != 0:
        raise ImageBuildError(f"{what} failed; log: {log_path}\n" + _log_tail(log_path, 20))


def _mounts_under(root: Path) -> list[str]:
    """Mount points below ``root`` (debootstrap mounts /proc and /sys in its target and may
    leave them when killed), deepest first."""
    prefix = f"{root}/"
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        points = [line.split()[1].replace("\\040", " ") for line in mounts]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _remove_root(root: Path) -> None:
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    if _mounts_under(root):  # never delete through a mount that is still there
        raise ImageBuildError(f"{root} still has mounts; remove them by hand: "
                              f"{', '.join(_mounts_under(root))}")
    shutil.rmtree(root, ignore_errors=True)


def _make_base(tag: str, mirror: str, log_path: Path, say: Log) -> None:
    say(f"making the base image {tag} from {mirror} (debootstrap {_SUITE}; about 30 s)")
    work = Path(tempfile.mkdtemp(prefix=".base-", dir=_oci_root()))
    root = work / "root"
    try:
        _step(["debootstrap", "--variant=minbase", _SUITE, str(root), mirror], log_path,
              "debootstrap")
        # apt inside the chroot resolves the mirror with the host's resolver; the image does
        # not keep it (a runtime mounts its own /etc/resolv.conf).
        shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
        _step(["chroot", str(root), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get",
               "install", "-y", "-q", "--no-install-recommends", *_BASE_PACKAGES], log_path,
              "apt-get install in the base")
        _step(["chroot", str(root), "apt-get", "clean"], log_path, "apt-get clean")
        (root / "etc" / "resolv.conf").unlink()
        shutil.rmtree(root / "var" / "lib" / "apt" / "lists", ignore_errors=True)
        (root / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True)
        if _mounts_under(root):
            raise ImageBuildError(f"debootstrap left mounts under {root}")
        archive = work / "root.tar"
        _step(["tar", "-C", str(root), "--numeric-owner", "-cf", str(archive), "."],
              log_path, "tar of the base")
        changes = [arg for env in _BASE_ENV for arg in ("--change", f"ENV {env}")]
        _step(["podman", "import", *changes, str(archive), tag], log_path, "podman import")
    finally:
        _remove_root(work)


def ensure_base(log: Log | None = None) -> str:
    """The tag of the local python:3.11-slim stand-in, made if no image carries it yet."""
    say = log or _stderr_log
    mirror = _mirror()
    tag = _base_tag(mirror)
    if _exists(tag):
        return tag
    if os.geteuid() != 0:
        raise ImageBuildError("making the base image needs root (debootstrap and chroot); "
                              "run `make image` as root, or with sudo")
    with _locked(_oci_root() / ".lock"):
        if not _exists(tag):
            _make_base(tag, mirror, _oci_root() / "build-base.log", say)
    return tag


def git_revision(repo: Path = REPO) -> str:
    """HEAD's commit, ``-dirty`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo, capture_output=True, text=True, timeout=30,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def ensure_image(tag: str = IMAGE, log: Log | None = None) -> Built:
    """Build ``tag`` from the repository's Dockerfile (layers cached) and describe it.

    Raises ImageBuildError when a tool is missing or a step fails."""
    say = log or _stderr_log
    missing = _missing_tools()
    if missing:
        raise ImageBuildError(f"{', '.join(missing)} not found on PATH: run `make system-deps` "
                              "(Debian packages debootstrap buildah podman runc)")
    _oci_root().mkdir(parents=True, exist_ok=True)
    base = ensure_base(say)
    revision, release = git_revision(), version()
    volumes = (["-v", f"{_HOST_CA_BUNDLE}:{_HOST_CA_BUNDLE}:ro"]
               if _HOST_CA_BUNDLE.is_file() else [])
    log_path = _oci_root() / "build-image.log"
    log_path.write_text("", encoding="utf-8")
    started = time.monotonic()
    with _locked(_oci_root() / ".lock"):
        _step(["buildah", "bud", "--layers", "--isolation", "chroot", *volumes,
               "--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", f"VERSION={release}",
               "--build-arg", f"REVISION={revision}", "-f", str(REPO / "Dockerfile"),
               "-t", tag, str(REPO)], log_path, "buildah bud")
    say(f"built {tag} in {time.monotonic() - started:.0f}s (log: {log_path})")
    inspected = json.loads(podman("image", "inspect", tag).stdout)[0]
    return Built(tag=tag, id=inspected["Id"], size=int(inspected["Size"]), version=release,
                 revision=revision)


def _pause_source() -> tuple[Path, str]:
    """pause.c and its release tag from the Kubernetes module the control plane is built from
    (``build/pause``: the source of registry.k8s.io/pause)."""
    done = subprocess.run(["go", "list", "-mod=readonly", "-m", "-f", "{{.Dir}}",
                           "k8s.io/kubernetes"], cwd=go_source_dir(), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "GOWORK": "off"},
                          check=False)
    module = Path(done.stdout.strip())
    source = module / "build" / "pause" / "linux" / "pause.c"
    if done.returncode != 0 or not source.is_file():
        raise ImageBuildError("pause.c not found in the k8s.io/kubernetes module (run `make "
                              f"sandbox-build` first): {done.stderr.strip()}")
    makefile = (module / "build" / "pause" / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^TAG \?= (\S+)", makefile, re.M)
    if not match:
        raise ImageBuildError(f"no TAG in {module / 'build' / 'pause' / 'Makefile'}")
    return source, match.group(1)


def ensure_pause(log: Log | None = None) -> str:
    """``localhost/pause:<tag>``, the pod sandbox image, built from the module's pause.c with
    ``gcc -static`` into an image from scratch (registry.k8s.io is not reachable)."""
    say = log or _stderr_log
    source, release = _pause_source()
    tag = f"localhost/pause:{release}"
    _oci_root().mkdir(parents=True, exist_ok=True)
    if _exists(tag):
        return tag
    with _locked(_oci_root() / ".lock"):
        if _exists(tag):
            return tag
        say(f"building {tag} from {source}")
        log_path = _oci_root() / "build-pause.log"
        work = Path(tempfile.mkdtemp(prefix=".pause-", dir=_oci_root()))
        try:
            _step(["gcc", "-Os", "-static", "-Wall", f"-DVERSION={release}", "-o",
                   str(work / "pause"), str(source)], log_path, "gcc pause.c")
            _from_scratch(tag, work / "pause", "/pause",
                          ["--entrypoint", '["/pause"]', "--user", "65535:65535"], log_path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tag


def ensure_scheduler_image(k8s: Path, log: Log | None = None) -> str:
    """``localhost/kube-scheduler:<digest>``: the sandbox's own kube-scheduler (the ``k8s``
    multi-call binary, which dispatches on its name) as /usr/local/bin/kube-scheduler in an
    image from scratch, as the chart's second scheduler runs registry.k8s.io's (its command is
    ``kube-scheduler``, found on PATH). Tagged by the build's content key, the name of the
    sandbox-bin directory it lies in (gpusteward.sandbox.build), so a rebuilt control plane gets
    a new image without hashing the 130 MB binary again."""
    say = log or _stderr_log
    tag = f"localhost/kube-scheduler:{k8s.parent.name}"
    _oci_root().mkdir(parents=True, exist_ok=True)
    if _exists(tag):
        return tag
    with _locked(_oci_root() / ".lock"):
        if not _exists(tag):
            say(f"building {tag} from {k8s}")
            _from_scratch(tag, k8s, "/usr/local/bin/kube-scheduler",
                          ["--env", "PATH=/usr/local/bin", "--user", "65532:65532",
                           "--entrypoint", '["/usr/local/bin/kube-scheduler"]'],
                          _oci_root() / "build-kube-scheduler.log")
    return tag


def _from_scratch(tag: str, binary: Path, dest: str, config: list[str], log_path: Path) -> None:
    """Commit ``tag``: an image from scratch holding one static binary at ``dest``, with
    ``buildah config`` arguments ``config``."""
    container = subprocess.run(["buildah", "from", "scratch"], env=oci_env(),
                               capture_output=True, text=True, timeout=60,
                               check=True).stdout.strip()
    try:
        _step(["buildah", "copy", "--chmod", "0755", container, str(binary), dest], log_path,
              "buildah copy")
        _step(["buildah", "config", *config, container], log_path, "buildah config")
        _step(["buildah", "commit", container, tag], log_path, "buildah commit")
    finally:
        subprocess.run(["buildah", "rm", container], env=oci_env(), check=False,
                       capture_output=True, timeout=60)


def archive(tag: str) -> Path:
    """A docker-archive of ``tag`` (what ``ctr images import`` reads), kept by image id."""
    image_id = json.loads(podman("image", "inspect", tag).stdout)[0]["Id"]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
    directory = _oci_root() / "archives"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{image_id[:16]}.tar"
    if path.is_file():
        return path
    with _locked(_oci_root() / ".lock"):
        if not path.is_file():
            for stale in directory.glob(f"{name}-*.tar"):
                stale.unlink()
            partial = path.with_suffix(".partial")
            podman("save", "--format", "docker-archive", "-o", str(partial), tag, timeout=300)
            partial.rename(path)
    return path


def main() -> int:
    """Build if needed and print what was built, its size against the budget."""
    try:
        built = ensure_image()
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    verdict = "within" if built.size_mb <= SIZE_BUDGET_MB else "OVER"
    print(f"{built.tag} {built.id[:12]} {built.size_mb:.0f} MB ({verdict} the budget of "
          f"{SIZE_BUDGET_MB} MB) version {built.version} revision {built.revision}")
    return 0 if verdict == "within" else 1


if __name__ == "__main__":
    sys.exit(main())
