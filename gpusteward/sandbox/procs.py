"""Child processes of the sandbox: started in their own session, logged to a file, stopped
for sure (SIGTERM, then SIGKILL), and found again by pid after `sandbox up` has returned."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class SandboxError(RuntimeError):
    pass


_LOWEST_PORT = 10000
# Ports chosen by any process of this user on this machine, with when: two sandboxes starting
# at once (parallel test workers, a demo beside the tests) must not both pick a port neither has
# bound yet. A sandbox binds its ports within a minute of choosing them; a claim lasts longer.
_CLAIM_S = 900


def _claims_path() -> Path:
    # asked when a port is chosen, not at import: the image's read-only root has no temp
    # directory, and its commands that never start a process must not need one
    return Path(tempfile.gettempdir()) / f"gpusteward-ports-{os.getuid()}.json"


def free_port() -> int:
    """A loopback port nothing listens on now, for a process started next. Not one bind(0)
    hands out: those come from the kernel's ephemeral range, where any outgoing connection
    (the API server's to etcd, a client's to Prometheus) may take it before the process binds
    it ("address already in use"). Below that range only listeners bind, so the port stays
    free: chosen at random among ~20,000, and never one another process of this machine
    claimed in the last quarter hour."""
    low, _ = _ephemeral_range()
    if low - _LOWEST_PORT < 1000:  # a kernel configured with (almost) every port ephemeral
        return _bound_port(0)
    rng = random.SystemRandom()
    with _claims() as claimed:
        for _ in range(200):
            port = rng.randrange(_LOWEST_PORT, low)
            if str(port) in claimed:
                continue
            try:
                _bound_port(port)
            except OSError:  # taken (or in TIME_WAIT): another
                continue
            claimed[str(port)] = time.time()
            return port
    return _bound_port(0)


@contextlib.contextmanager
def _claims() -> Iterator[dict[str, float]]:
    """The machine's live port claims, locked, written back as the caller leaves them."""
    path = _claims_path()
    with open(path.with_suffix(".lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            claimed = json.loads(path.read_text())
        except (OSError, ValueError):
            claimed = {}
        now = time.time()
        claimed = {port: at for port, at in claimed.items() if now - at < _CLAIM_S}
        yield claimed
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(json.dumps(claimed))
        os.replace(tmp, path)


def _bound_port(port: int) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        return int(s.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the process that started us dies, however it dies.

    SIGKILL, not SIGTERM: an apiserver whose etcd is gone hangs in graceful shutdown."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG = 1


@dataclass
class Proc:
    name: str
    argv: Sequence[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    # False only for `sandbox up`, whose processes outlive the command that started them.
    die_with_parent: bool = True
    pid: int = 0
    _popen: subprocess.Popen | None = None

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self._popen = subprocess.Popen(
                list(self.argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None)
        self.pid = self._popen.pid
        return self

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_alive(self.pid)

    def wait_ready(self, check: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise SandboxError(f"{self.name} exited during start-up; log {self.log}:\n"
                                   f"{log_tail(self.log)}")
            with contextlib.suppress(OSError):
                if check():
                    return
            time.sleep(0.2)
        raise SandboxError(f"{self.name} not ready after {timeout:.0f}s; log {self.log}:\n"
                           f"{log_tail(self.log)}")

    def stop(self, timeout: float = 10.0) -> None:
        stop_pid(self.pid, timeout)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=1)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as gone.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    return True


def stop_pid(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM the process group, wait, then SIGKILL it; whether the process is gone."""
    if not pid_alive(pid):
        return True
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return True
            time.sleep(0.1)
    return False
