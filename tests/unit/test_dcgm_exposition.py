"""The DCGM simulator prints what dcgm-exporter 4.x prints, byte for byte."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpusteward.core.dcgm import HEALTH_FAIL, MigInstance, PodRef, gpu_id
from gpusteward.sandbox.simgpu import (
    Share,
    SimGpu,
    model_name_for_product,
    render_exposition,
    render_openmetrics_history,
)

H100 = "NVIDIA H100 80GB HBM3"
TRAINER = PodRef(namespace="ml", name="train-0", container="trainer")

# Written out by hand from dcgm-exporter's template: fixed labels, Hostname, label
# fields, then attributes in sorted key order.
GPU0 = (
    'gpu="0",UUID="GPU-184c0883-ce7a-b92d-a5ba-4e276c6e7a04",pci_bus_id="00000000:07:00.0",'
    'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",'
    'DCGM_FI_DRIVER_VERSION="550.90.07"'
)
GPU1 = (
    'gpu="1",UUID="GPU-81d866e6-cfe1-3385-cd90-d92fc9604041",pci_bus_id="00000000:17:00.0",'
    'device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",'
    'DCGM_FI_DRIVER_VERSION="550.90.07"'
)
POD = 'namespace="ml",pod="train-0"'
EXPECTED = f"""\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{GPU0},container="trainer",{POD}}} 62
DCGM_FI_DEV_GPU_TEMP{{{GPU1}}} 33
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{GPU0},container="trainer",{POD}}} 302.206000
DCGM_FI_DEV_POWER_USAGE{{{GPU1}}} 68.500000
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{GPU0},container="trainer",{POD}}} 87
DCGM_FI_DEV_GPU_UTIL{{{GPU1}}} 0
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{{GPU0},container="trainer",err_code="0",err_msg="No Error",{POD}}} 0
DCGM_FI_DEV_XID_ERRORS{{{GPU1},err_code="79",err_msg="GPU has fallen off the bus"}} 79
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{{{GPU0},container="trainer",{POD}}} 41559
DCGM_FI_DEV_FB_FREE{{{GPU1}}} 81559
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{GPU0},container="trainer",{POD}}} 40000
DCGM_FI_DEV_FB_USED{{{GPU1}}} 0
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{GPU0},container="trainer",{POD}}} 0.870000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{GPU1}}} 0.000000
"""


def busy_gpu(**overrides: object) -> SimGpu:
    fields: dict[str, object] = dict(
        node="gpu-node-1",
        index=0,
        model_name=H100,
        util_percent=87,
        fb_used_mib=40000,
        temp_c=62,
        power_w=302.206,
        pod=TRAINER,
    )
    return SimGpu(**(fields | overrides))  # type: ignore[arg-type]


def free_gpu(**overrides: object) -> SimGpu:
    fields: dict[str, object] = dict(
        node="gpu-node-1", index=1, model_name=H100, temp_c=33, power_w=68.5, xid=79
    )
    return SimGpu(**(fields | overrides))  # type: ignore[arg-type]


def sample_lines(text: str, metric: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(metric + "{")]


def test_exposition_matches_the_exporters_text_line_for_line() -> None:
    assert render_exposition([busy_gpu(), free_gpu()]).splitlines() == EXPECTED.splitlines()


def test_exposition_ends_with_a_newline_like_the_go_template() -> None:
    assert render_exposition([busy_gpu()]).endswith(" 0.870000\n")


def test_free_gpus_carry_no_pod_labels() -> None:
    text = render_exposition([free_gpu()])

    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == 7
    for line in samples:
        assert not re.search(r"[{,](pod|namespace|container)=", line), line


@pytest.mark.parametrize(
    ("gpu", "metric", "value"),
    [
        pytest.param(
            busy_gpu(power_w=302.206), "DCGM_FI_DEV_POWER_USAGE", "302.206000", id="double-%f"
        ),
        pytest.param(
            busy_gpu(power_w=70), "DCGM_FI_DEV_POWER_USAGE", "70.000000", id="whole-double"
        ),
        pytest.param(
            busy_gpu(util_percent=42.6), "DCGM_FI_DEV_GPU_UTIL", "43", id="util-%d-rounded"
        ),
        pytest.param(busy_gpu(util_percent=130), "DCGM_FI_DEV_GPU_UTIL", "100", id="util-capped"),
        pytest.param(
            busy_gpu(util_percent=42.6), "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.426000", id="ratio-%f"
        ),
        pytest.param(
            busy_gpu(fb_used_mib=90000), "DCGM_FI_DEV_FB_FREE", "0", id="free-not-negative"
        ),
    ],
)
def test_values_are_printed_like_go_formats_them(gpu: SimGpu, metric: str, value: str) -> None:
    (line,) = sample_lines(render_exposition([gpu]), metric)

    assert line.rsplit(" ", 1)[1] == value


@pytest.mark.parametrize(
    ("xid", "err_msg"),
    [
        pytest.param(0, "No Error", id="none"),
        pytest.param(79, "GPU has fallen off the bus", id="fallen-off-the-bus"),
        pytest.param(999, "Unknown Error", id="unlisted-code"),
    ],
)
def test_xid_series_carries_code_and_message(xid: int, err_msg: str) -> None:
    (line,) = sample_lines(render_exposition([free_gpu(xid=xid)]), "DCGM_FI_DEV_XID_ERRORS")

    assert f'err_code="{xid}",err_msg="{err_msg}"}} {xid}' in line


def test_the_xid_counter_is_opt_in_a_counter_and_appears_with_the_first_xid() -> None:
    # DCGM_EXP_XID_ERRORS_TOTAL (dcgm-exporter >= 4.8.3, commented out of default-counters.csv
    # as "counter, Total XID errors observed since exporter start."): labelled like the
    # windowed count, with `xid`; no series before the GPU's first XID.
    assert "DCGM_EXP_XID_ERRORS_TOTAL" not in render_exposition([free_gpu(xid_total=2)])
    text = render_exposition([free_gpu(xid_total=2), busy_gpu()], xid_total=True)
    assert "# TYPE DCGM_EXP_XID_ERRORS_TOTAL counter" in text
    (line,) = sample_lines(text, "DCGM_EXP_XID_ERRORS_TOTAL")
    assert line.endswith('DCGM_FI_DRIVER_VERSION="550.90.07",xid="79"} 2')


def test_the_health_families_are_opt_in_one_status_series_per_watch_none_for_mig() -> None:
    # dcgm-exporter internal/pkg/collector/gpu_health_collector.go: per GPU one
    # DCGM_EXP_GPU_HEALTH_STATUS series for each of its 11 watches, PASS (0) unless DCGM
    # reported an incident, `health_watch`/`health_error_code` among the attributes;
    # DCGM_FI_DEV_ROW_REMAP_FAILURE is a default-counters.csv gauge.
    assert "HEALTH_STATUS" not in render_exposition([free_gpu()])
    failed = free_gpu(row_remap_failure=True,
                      health=(("MEM", HEALTH_FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED"),))
    text = render_exposition([failed, busy_gpu(), busy_gpu(mig=MigInstance(1, "3g.40gb"))],
                             health=True)
    status = sample_lines(text, "DCGM_EXP_GPU_HEALTH_STATUS")
    assert len(status) == 2 * 11
    (mem,) = [line for line in status if 'health_watch="MEM"' in line and "nvidia1" in line]
    assert mem.endswith('health_error_code="DCGM_FR_VOLATILE_DBE_DETECTED",'
                        'health_watch="MEM"} 20')
    assert sum(line.endswith(" 0") for line in status) == 21
    assert [line.rsplit(" ", 1)[1] for line in sample_lines(
        text, "DCGM_FI_DEV_ROW_REMAP_FAILURE")] == ["1", "0"]


def test_node_label_name_can_follow_the_rename_on_exporter_main() -> None:
    text = render_exposition([free_gpu()], node_label="hostname", driver_version="570.86.15")

    (line,) = sample_lines(text, "DCGM_FI_DEV_GPU_UTIL")
    assert ',hostname="gpu-node-1",DCGM_FI_DRIVER_VERSION="570.86.15"}' in line


def test_label_values_are_escaped() -> None:
    pod = PodRef(namespace="ml", name='odd"name\\', container="c")

    (line,) = sample_lines(render_exposition([busy_gpu(pod=pod)]), "DCGM_FI_DEV_GPU_UTIL")

    assert 'pod="odd\\"name\\\\"}' in line


def test_identity_is_stable_per_node_and_index_and_distinct_between_gpus() -> None:
    gpus = [SimGpu(node, index, H100) for node in ("a", "b") for index in range(8)]

    assert len({gpu.uuid for gpu in gpus}) == 16
    assert len({gpu.pci_bus_id for gpu in gpus if gpu.node == "a"}) == 8
    assert SimGpu("a", 3, H100, util_percent=50).uuid == SimGpu("a", 3, "other").uuid
    for gpu in gpus:
        assert re.fullmatch(
            r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", gpu.uuid
        )
        assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", gpu.pci_bus_id)


@pytest.mark.parametrize(
    ("product", "model_name"),
    [
        pytest.param("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", id="h100-sxm"),
        pytest.param("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", id="a100-sxm4-dashed"),
        pytest.param("NVIDIA-A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", id="a100-pcie-40gb-dashed"),
        pytest.param("NVIDIA-A100-80GB-PCIe", "NVIDIA A100 80GB PCIe", id="a100-pcie-80gb-spaced"),
        pytest.param("Tesla-V100-SXM2-16GB", "Tesla V100-SXM2-16GB", id="old-tesla-prefix"),
        pytest.param("A100-SXM4-40GB", "A100-SXM4-40GB", id="old-driver-no-prefix"),
        pytest.param("NVIDIA-L4", "NVIDIA L4", id="l4"),
        pytest.param("NVIDIA-H100-NVL-MIG-1g.12gb", "NVIDIA H100 NVL", id="mig-suffix-dropped"),
        pytest.param("NVIDIA-A100-SXM4-80GB-SHARED", "NVIDIA A100-SXM4-80GB", id="shared-dropped"),
    ],
)
def test_model_name_for_product_inverts_gfd_sanitising(product: str, model_name: str) -> None:
    assert model_name_for_product(product) == model_name


def history(start: int, frames: int, step: int = 30) -> list[tuple[float, list[SimGpu]]]:
    return [
        (start + i * step, [busy_gpu(util_percent=i % 100), free_gpu(util_percent=0)])
        for i in range(frames)
    ]


def test_openmetrics_groups_each_family_and_orders_each_series_by_time() -> None:
    frames = history(1_700_000_000, 4)

    text = render_openmetrics_history(reversed(frames))

    lines = text.splitlines()
    assert lines[-1] == "# EOF"
    types = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)) == 7
    families = [line.split("{")[0] for line in lines if not line.startswith("#")]
    assert families == sorted(families, key=types.index)  # contiguous, in TYPE order
    util0 = [line for line in sample_lines(text, "DCGM_FI_DEV_GPU_UTIL") if 'gpu="0"' in line]
    assert [line.split()[-2:] for line in util0] == [
        ["0", "1700000000.000"],
        ["1", "1700000030.000"],
        ["2", "1700000060.000"],
        ["3", "1700000090.000"],
    ]


def test_openmetrics_adds_extra_labels_to_every_series() -> None:
    text = render_openmetrics_history(
        history(1_700_000_000, 2), extra_labels={"job": "dcgm", "instance": "dcgm:9400"}
    )

    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == 2 * 2 * 7
    for sample in samples:
        assert ',instance="dcgm:9400",job="dcgm"} ' in sample, sample


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"pod": "x"}, id="pod"),
        pytest.param({"Hostname": "x"}, id="node-label"),
        pytest.param({"UUID": "x"}, id="uuid"),
    ],
)
def test_openmetrics_refuses_extra_labels_that_replace_exporter_labels(
    extra: dict[str, str],
) -> None:
    with pytest.raises(ValueError, match="extra_labels"):
        render_openmetrics_history(history(1_700_000_000, 1), extra_labels=extra)


def test_real_promtool_turns_the_openmetrics_history_into_blocks(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not on PATH: `make test` installs the Debian package `prometheus`"
    source = tmp_path / "history.om"
    # Five hours at 30 s, so the data spans several 2-hour blocks.
    source.write_text(
        render_openmetrics_history(history(1_700_000_000, 600), extra_labels={"job": "dcgm"})
    )

    result = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(tmp_path / "tsdb"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:] if line.strip()]
    assert len(rows) >= 3
    assert sum(int(row[-4]) for row in rows) == 600 * 2 * 7  # NUM SAMPLES: frames x GPUs x metrics


def test_the_xid_count_is_off_unless_its_window_is_given() -> None:
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in render_exposition([free_gpu(xid_count=1)])


def test_the_xid_count_has_one_series_per_xid_or_a_zero_without_one() -> None:
    text = render_exposition([busy_gpu(), free_gpu(xid_count=2)], xid_count_window_ms=300000)
    # After the GPU families, as the exporter's own collectors render after the DCGM fields.
    assert text.index("# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge") > text.index(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE{")
    assert sample_lines(text, "DCGM_EXP_XID_ERRORS_COUNT") == [
        f'DCGM_EXP_XID_ERRORS_COUNT{{{GPU0},window_size_in_ms="300000",'
        f'container="trainer",{POD}}} 0',
        f'DCGM_EXP_XID_ERRORS_COUNT{{{GPU1},window_size_in_ms="300000",xid="79"}} 2',
    ]


def test_a_shared_gpu_under_virtual_gpus_prints_one_copy_per_pod_in_its_place() -> None:
    # dcgm-exporter --kubernetes-virtual-gpus (internal/pkg/transformation/kubernetes.go,
    # PodMapper.Process): every series of the device is replaced by a copy per pod sharing it,
    # with the pod's attributes and `vgpu`, the replica id after `::` of `<uuid>::<n>`.
    shared = SimGpu("t4-0", 0, "Tesla T4", util_percent=80, shares=(
        Share(PodRef("ml", "busy", "main"), "0", 80.0),
        Share(PodRef("ml", "idle", "main"), "1", 0.0)))
    util = [line for line in render_exposition([shared]).splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    uuid = shared.uuid
    assert util == [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{uuid}",pci_bus_id="00000000:07:00.0",'
        f'device="nvidia0",modelName="Tesla T4",Hostname="t4-0",'
        f'DCGM_FI_DRIVER_VERSION="550.90.07",container="main",namespace="ml",pod="{pod}",'
        f'vgpu="{vgpu}"}} {value}'
        for pod, vgpu, value in (("busy", "0", 80), ("idle", "1", 0))]
    temps = [line for line in render_exposition([shared]).splitlines()
             if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert len(temps) == 2  # the other families: the device's value on each copy


def test_a_mig_instance_carries_profile_and_id_before_the_node_label() -> None:
    """Label order from dcgm-exporter's `gpuMetricsFormat` (`GPU_I_PROFILE`, `GPU_I_ID` after
    `modelName`), values as in the MIG line of NVIDIA/dcgm-exporter#272."""
    gpu = busy_gpu(mig=MigInstance(1, "3g.40gb"))
    (line,) = sample_lines(render_exposition([gpu]), "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    names = [pair.split("=")[0] for pair in line[line.index("{") + 1:line.index("}")].split(",")]
    assert names[:8] == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE",
                         "GPU_I_ID", "Hostname"]
    assert 'GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"' in line and line.endswith(" 0.870000")
    assert gpu.uuid == busy_gpu().uuid  # the parent GPU's UUID


@pytest.mark.parametrize(("variant", "lines"), [("absent", []), ("zero", ["0"])])
def test_a_mig_instance_prints_no_gpu_util_or_a_zero(variant: str, lines: list[str]) -> None:
    """NVIDIA/dcgm-exporter#50/#430 (not reported for MIG) and #216 (printed as 0)."""
    text = render_exposition([busy_gpu(mig=MigInstance(1, "1g.10gb", gpu_util=variant))])
    assert [ln.rsplit(" ", 1)[1] for ln in sample_lines(text, "DCGM_FI_DEV_GPU_UTIL")] == lines


@pytest.mark.parametrize(("labels", "name"), [
    pytest.param({"gpu": "3", "UUID": "GPU-a"}, "GPU-a", id="uuid-wins"),
    pytest.param({"gpu": "3", "uuid": "GPU-a"}, "GPU-a", id="old-exporter-uuid"),
    pytest.param({"gpu": "3"}, "3", id="index-where-a-query-kept-only-gpu"),
    pytest.param({"gpu": "0", "UUID": "GPU-a", "GPU_I_ID": "2"}, "GPU-a/mig2", id="mig-instance"),
    pytest.param({"gpu": "0", "GPU_I_ID": ""}, "0", id="empty-instance-is-the-gpu"),
])
def test_one_name_per_gpu_from_the_exporter_labels(labels, name):
    assert gpu_id(labels) == name
