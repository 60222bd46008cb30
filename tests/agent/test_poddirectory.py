"""The agent's pod directory: UID -> name, listing the API server only when it must.

The LIST itself runs against the real API server in tests/e2e/test_agent_telemetry.py.
"""

from __future__ import annotations

from gpusteward.adapters.errors import KubeError
from gpusteward.agent.poddirectory import PodDirectory, index
from gpusteward.core.kubewire import Meta

A, B, HASH = "uid-a", "uid-b", "0123456789abcdef0123456789abcdef"


class Lister:
    def __init__(self) -> None:
        self.pods = {A: ("ml", "train-0")}
        self.fail = False
        self.calls = 0

    async def __call__(self) -> dict[str, tuple[str, str]]:
        self.calls += 1
        if self.fail:
            raise KubeError("pods is forbidden", 403)
        return dict(self.pods)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_lists_once_then_answers_from_memory_and_again_for_a_new_uid() -> None:
    lister, clock = Lister(), Clock()
    directory = PodDirectory(lister, min_interval=30, clock=clock)

    assert await directory.resolve([A]) == {A: ("ml", "train-0")}
    assert await directory.resolve([A]) == {A: ("ml", "train-0")}
    assert lister.calls == 1
    lister.pods[B] = ("lab", "nb-1")
    assert await directory.resolve([A, B]) == {A: ("ml", "train-0")}  # too soon to list again
    clock.now = 31
    assert await directory.resolve([A, B]) == {A: ("ml", "train-0"), B: ("lab", "nb-1")}
    assert lister.calls == 2


async def test_a_failed_list_keeps_what_was_known_and_says_so() -> None:
    lister, clock = Lister(), Clock()
    directory = PodDirectory(lister, min_interval=30, clock=clock)
    await directory.resolve([A])
    lister.fail, clock.now = True, 31

    assert await directory.resolve([A, B]) == {A: ("ml", "train-0")}
    assert directory.ok is False
    lister.fail, clock.now = False, 62
    await directory.resolve([B])
    assert directory.ok is True


def test_a_mirror_pod_is_found_by_its_static_pods_config_hash() -> None:
    metas = [Meta(name="etcd-gpu-1", namespace="kube-system", uid="mirror-uid",
                  annotations={"kubernetes.io/config.mirror": HASH}),
             Meta(name="train-0", namespace="ml", uid=A)]
    assert index(metas) == {"mirror-uid": ("kube-system", "etcd-gpu-1"),
                            HASH: ("kube-system", "etcd-gpu-1"), A: ("ml", "train-0")}
