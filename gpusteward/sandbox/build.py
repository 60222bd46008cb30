"""Build (or reuse) the sandbox's Go binaries: ``k8s`` and ``kwok``.

``k8s`` is one multi-call binary holding kube-apiserver, kube-scheduler,
kube-controller-manager and etcd (``k8s apiserver ...`` and so on); ``kwok``
fakes nodes and pod lifecycles; ``noopextender`` is the scheduler benchmark's
protocol floor (an extender that only speaks the upstream wire types). All
come from the Go module in ``sandbox/go`` and are built with the machine's
``go``.

Built binaries live in a cache directory keyed by a hash of everything that
decides their content (go.mod, go.sum, every ``.go`` file, ``go version`` and
the build flags)::

    ${GPUSTEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpusteward}/sandbox-bin/<key>/

A build goes to a temporary directory next to it and is renamed into place
only when it succeeded, so a half build is never used. Builds are serialised
with a file lock, so parallel test workers wait for one build instead of
starting several. A cold build (empty Go caches) took 5.5 minutes on two
cores with a 2.2 GB peak process RSS; a rebuild with a warm Go build cache
only relinks (about a minute or less).

Run ``python -m gpusteward.sandbox.build`` to build and print the bin dir.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpusteward.sandbox.checkout import REPO

__all__ = ["BINARIES", "SandboxBuildError", "cache_root", "ensure_binaries", "go_source_dir"]

#: Files every complete bin directory holds.
BINARIES = ("k8s", "kwok", "noopextender")

#: Main packages, built in one ``go build`` so they share one compile.
_PACKAGES = ("./cmd/k8s", "./cmd/kwok", "./cmd/noopextender")

#: Bump when the build recipe below changes in a way the key cannot see.
_RECIPE = "2"

_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")

_GO_INSTALL_HINT = (
    "Install Go 1.26 or newer: download it from https://go.dev/dl/ and put its bin/ on PATH "
    "(any Go >= 1.21 also works and fetches the 1.26 toolchain from the module proxy by itself), "
    "or point GPUSTEWARD_GO at a go binary."
)

Log = Callable[[str], None]


class SandboxBuildError(RuntimeError):
    """The sandbox binaries could not be built; the message names the build log."""


def _stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def go_source_dir() -> Path:
    """The Go module holding the sandbox binaries (``sandbox/go`` in the repository)."""
    override = os.environ.get("GPUSTEWARD_SANDBOX_GO_DIR")
    if override:
        return Path(override).expanduser().resolve()
    return REPO / "sandbox" / "go"


def cache_root() -> Path:
    """``${GPUSTEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpusteward}``."""
    explicit = os.environ.get("GPUSTEWARD_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "gpusteward"


def _go_binary() -> str | None:
    return os.environ.get("GPUSTEWARD_GO") or shutil.which("go")


def _kubernetes_version(go_mod: str) -> str:
    """The ``k8s.io/kubernetes`` version pinned in go.mod, e.g. ``v1.36.3``."""
    match = re.search(r"^\s*k8s\.io/kubernetes\s+(v\d+\.\d+\.\d+)\s*$", go_mod, re.MULTILINE)
    if match is None:
        raise SandboxBuildError("sandbox/go/go.mod does not require k8s.io/kubernetes vX.Y.Z")
    return match.group(1)


def _ldflags(kube_version: str) -> str:
    major, minor = kube_version.removeprefix("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in _VERSION_PACKAGES:
        flags += [
            f"-X {package}.gitVersion={kube_version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _build_parallelism() -> int:
    """Concurrent compile jobs: one per core, and at most one per 3 GiB of memory."""
    explicit = os.environ.get("GPUSTEWARD_GO_BUILD_P")
    if explicit:
        return max(1, int(explicit))
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    gib = int(line.split()[1]) // (1024 * 1024)
                    return max(1, min(cores, gib // 3))
    except OSError:
        pass
    return max(1, cores)


def _cache_key(src: Path, go_version: str, ldflags: str) -> str:
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("recipe", _RECIPE.encode())
    add("go-version", go_version.encode())
    add("ldflags", ldflags.encode())
    add("packages", " ".join(_PACKAGES).encode())
    files = [src / "go.mod", src / "go.sum"]
    files += sorted(path for path in src.rglob("*.go") if path.is_file())
    for path in files:
        add(path.relative_to(src).as_posix(), path.read_bytes())
    return digest.hexdigest()[:16]


def _complete(bin_dir: Path) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in BINARIES)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _log_tail(log_path: Path, lines: int = 25) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def ensure_binaries(log: Log | None = None) -> Path:
    """Return the directory holding ``k8s`` and ``kwok``, building them if needed.

    Raises SandboxBuildError when ``go`` is missing or the build fails.
    """
    say = log or _stderr_log
    src = go_source_dir()
    root = cache_root()
    if not (src / "go.mod").is_file():
        raise SandboxBuildError(
            f"sandbox Go module not found at {src} (set GPUSTEWARD_SANDBOX_GO_DIR)"
        )

    go = _go_binary()
    root.mkdir(parents=True, exist_ok=True)
    if go is None:
        log_path = root / "build-nogo.log"
        message = (
            "`go` was not found on PATH; it is needed to build the sandbox binaries. "
            + _GO_INSTALL_HINT
        )
        log_path.write_text(message + "\n", encoding="utf-8")
        raise SandboxBuildError(f"{message} (log: {log_path})")

    try:
        go_version = subprocess.run(
            [go, "version"], check=True, capture_output=True, text=True, cwd=src, timeout=600
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        log_path = root / "build-nogo.log"
        log_path.write_text(f"`{go} version` failed: {exc}\n", encoding="utf-8")
        raise SandboxBuildError(
            f"`{go} version` failed: {exc}. {_GO_INSTALL_HINT} (log: {log_path})"
        ) from exc

    kube_version = _kubernetes_version((src / "go.mod").read_text(encoding="utf-8"))
    ldflags = _ldflags(kube_version)
    key = _cache_key(src, go_version, ldflags)
    bins = root / "sandbox-bin"
    bin_dir = bins / key
    if _complete(bin_dir):
        return bin_dir

    bins.mkdir(parents=True, exist_ok=True)
    with _locked(bins / ".lock"):
        if _complete(bin_dir):  # another process built it while we waited
            return bin_dir
        for stale in bins.glob(".tmp-*"):  # left by killed builds; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        if bin_dir.exists():
            shutil.rmtree(bin_dir)
        _build(go, go_version, src, bin_dir, root / f"build-{key}.log", ldflags, kube_version, say)
    return bin_dir


def _build(
    go: str,
    go_version: str,
    src: Path,
    bin_dir: Path,
    log_path: Path,
    ldflags: str,
    kube_version: str,
    say: Log,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{bin_dir.name}-", dir=bin_dir.parent))
    jobs = _build_parallelism()
    # -mod=readonly: resolve nothing new (go.sum is committed); GOWORK=off: ignore go.work files.
    command = [go, "build", "-mod=readonly", "-trimpath", f"-p={jobs}", "-ldflags", ldflags]
    command += ["-o", f"{tmp}{os.sep}", *_PACKAGES]
    env = {**os.environ, "CGO_ENABLED": "0", "GOWORK": "off"}
    say(
        f"building sandbox binaries (Kubernetes {kube_version}, {go_version}) into {bin_dir}; "
        f"a cold build takes about 6 min on 2 cores, a warm one under a minute; log: {log_path}"
    )
    started = time.monotonic()
    try:
        with open(log_path, "w", encoding="utf-8") as out:
            out.write(f"# {go_version}\n# cwd: {src}\n# CGO_ENABLED=0 {' '.join(command)}\n")
            out.flush()
            result = subprocess.run(
                command, cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
            )
            elapsed = time.monotonic() - started
            out.write(f"# exit status {result.returncode} after {elapsed:.0f}s\n")
        if result.returncode != 0:
            raise SandboxBuildError(
                f"go build failed (exit {result.returncode}) after {elapsed:.0f}s; "
                f"log: {log_path}\n" + _log_tail(log_path)
            )
        if not _complete(tmp):
            raise SandboxBuildError(
                f"go build produced no {' and '.join(BINARIES)} in {tmp}; log: {log_path}"
            )
        stamped = subprocess.run(
            [str(tmp / "k8s"), "version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
        if stamped != kube_version:
            raise SandboxBuildError(
                f"built k8s reports version {stamped!r}, expected {kube_version!r}; log: {log_path}"
            )
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        os.rename(tmp, bin_dir)  # atomic: bin_dir is absent (we hold the lock)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxBuildError(
            f"building sandbox binaries failed: {exc}; log: {log_path}"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"built sandbox binaries in {elapsed:.0f}s ({elapsed / 60:.1f} min): {bin_dir}")


def go_build_into(go: str, cwd: Path, packages: list[str], ldflags: str, bin_dir: Path,
                  names: list[str], what: str, tags: str = "") -> float:
    """``go build`` of a module's packages (at its pinned versions) into ``bin_dir``, through a
    temporary directory renamed into place only when every binary in ``names`` was built; the
    log lies beside ``bin_dir``. The caller holds the lock. Returns the seconds it took."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{bin_dir.name}-", dir=bin_dir.parent))
    log_path = bin_dir.parent / f"build-{bin_dir.name}.log"
    command = [go, "build", "-mod=readonly", "-trimpath", f"-p={_build_parallelism()}",
               "-ldflags", ldflags, *(["-tags", tags] if tags else []), "-o", f"{tmp}{os.sep}",
               *packages]
    env = {**os.environ, "CGO_ENABLED": "0", "GOWORK": "off"}
    started = time.monotonic()
    try:
        with open(log_path, "w", encoding="utf-8") as out:
            out.write(f"# cwd: {cwd}\n# {' '.join(command)}\n")
            out.flush()
            result = subprocess.run(command, cwd=cwd, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, check=False)
            out.write(f"# exit {result.returncode} after {time.monotonic() - started:.0f}s\n")
        if result.returncode != 0 or not all(os.access(tmp / n, os.X_OK) for n in names):
            raise SandboxBuildError(f"go build of {what} failed; log: {log_path}\n"
                                    + _log_tail(log_path, 20))
        tmp.chmod(0o755)
        os.rename(tmp, bin_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.monotonic() - started


def main() -> int:
    """Build if needed and print the bin directory."""
    try:
        print(ensure_binaries())
    except SandboxBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
