"""Host PID -> pod: cgroup paths of both cgroup versions and drivers, and the HOSTNAME join."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusteward.adapters.pidmap import hostname_from_environ, pod_uid_from_cgroup, read_owners
from gpusteward.core.nodereadings import PidOwner
from tests.agent.fakes import write_proc

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


@pytest.mark.parametrize(
    "cgroup",
    [
        pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                     f"{UID.replace('-', '_')}.slice/cri-containerd-abc.scope\n", id="v2-systemd"),
        pytest.param(f"0::/kubepods/besteffort/pod{UID}/0123abcd\n", id="v2-cgroupfs"),
        pytest.param(f"12:memory:/kubepods/burstable/pod{UID}/0123abcd\n"
                     f"11:devices:/kubepods/burstable/pod{UID}/0123abcd\n", id="v1"),
        pytest.param(f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/x\n",
                     id="v2-guaranteed"),
    ],
)
def test_the_pod_uid_is_read_from_any_kubepods_cgroup_path(cgroup: str) -> None:
    assert pod_uid_from_cgroup(cgroup) == UID


@pytest.mark.parametrize(
    "cgroup",
    [
        pytest.param("0::/system.slice/containerd.service\n", id="host-daemon"),
        pytest.param("0::/user.slice/user-1000.slice/session-1.scope\n", id="login-session"),
        pytest.param("", id="empty"),
    ],
)
def test_a_process_outside_kubepods_has_no_pod(cgroup: str) -> None:
    assert pod_uid_from_cgroup(cgroup) is None


def test_hostname_is_taken_from_the_nul_separated_environment() -> None:
    assert hostname_from_environ(b"PATH=/bin\0HOSTNAME=train-0\0HOME=/root\0") == "train-0"
    assert hostname_from_environ(b"PATH=/bin\0") is None


def test_owners_skip_vanished_and_non_pod_processes(proc_root: Path) -> None:
    write_proc(proc_root, 100, f"0::/kubepods/burstable/pod{UID}/c1\n", hostname="train-0")
    write_proc(proc_root, 200, "0::/system.slice/sshd.service\n")

    owners = read_owners([100, 200, 300], proc_root)

    assert owners == {100: PidOwner(pod_uid=UID, hostname="train-0")}
