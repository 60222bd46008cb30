"""The kube-state-metrics stand-in serves the pod series as kube-state-metrics does: names and
labels from its docs/metrics/workload/pod-metrics.md, values and label order from
internal/store/pod.go (namespace, pod, uid first; resource names sanitized; units core, byte,
integer; ``<none>`` owners; every phase with 0 or 1)."""

from __future__ import annotations

from gpusteward.sandbox.ksm import parse_allowlist, pod_families

POD = {
    "metadata": {"name": "train-0", "namespace": "ml", "uid": "u1",
                 "creationTimestamp": "2026-11-30T10:00:00Z",
                 "labels": {"gpusteward.io/team": "vision", "app": "train"},
                 "ownerReferences": [{"kind": "Job", "name": "train", "controller": True}]},
    "spec": {"nodeName": "h1", "priorityClassName": "batch", "containers": [
        {"name": "main", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi",
                                                    "nvidia.com/gpu": "2"}}}]},
    "status": {"phase": "Running", "hostIP": "10.0.0.5", "podIP": "10.1.0.7"},
}
BASE = (("namespace", "ml"), ("pod", "train-0"), ("uid", "u1"))


def families(pods=(POD,), allow=("gpusteward.io/team",)):
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in pod_families(pods, allow)}


def test_pod_info_names_node_controller_and_priority_class():
    (info,) = families()["kube_pod_info"]
    assert info == (BASE + (("host_ip", "10.0.0.5"), ("pod_ip", "10.1.0.7"), ("node", "h1"),
                            ("created_by_kind", "Job"), ("created_by_name", "train"),
                            ("priority_class", "batch"), ("host_network", "false")), "1")


def test_resource_requests_are_per_container_with_sanitized_names_and_units():
    got = {dict(labels)["resource"]: (dict(labels)["unit"], value)
           for labels, value in families()["kube_pod_container_resource_requests"]}
    assert got == {"cpu": ("core", "1.5"), "memory": ("byte", str(2 * 2**30)),
                   "nvidia_com_gpu": ("integer", "2")}
    labels, _ = families()["kube_pod_container_resource_requests"][0]
    assert [k for k, _ in labels] == ["namespace", "pod", "uid", "container", "node", "resource",
                                      "unit"]


def test_owner_series_say_none_without_owners_and_every_phase_is_listed():
    bare = {**POD, "metadata": {**POD["metadata"], "ownerReferences": []}}
    (owner,) = families([bare])["kube_pod_owner"]
    assert owner == (BASE + (("owner_kind", "<none>"), ("owner_name", "<none>"),
                             ("owner_is_controller", "<none>")), "1")
    phases = {dict(labels)["phase"]: v for labels, v in families()["kube_pod_status_phase"]}
    assert phases == {"Pending": "0", "Succeeded": "0", "Failed": "0", "Unknown": "0",
                      "Running": "1"}


def test_only_allow_listed_labels_are_kept_and_renamed():
    (labels,) = families()["kube_pod_labels"]
    assert labels == (BASE + (("label_gpusteward_io_team", "vision"),), "1")
    (none,) = families(allow=())["kube_pod_labels"]
    assert none == (BASE, "1")
    assert parse_allowlist("pods=[gpusteward.io/team, app]") == ("gpusteward.io/team", "app")
    assert parse_allowlist("namespaces=[x]") == ()


def test_created_is_the_creation_time_in_unix_seconds():
    assert families()["kube_pod_created"] == [(BASE, "1796032800")]
