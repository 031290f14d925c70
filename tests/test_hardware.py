"""The GPU table, the fit verdict and the "Does FSDP fit?" recommendation."""

import math

import pytest

from smolfsdp.errors import ConfigError
from smolfsdp.measure.hardware import GPUS, fit_table, fits, get_gpu, gpu_from_device_name, recommend
from smolfsdp.measure.memory import estimate_memory


def test_gpu_table_has_the_issue_gpus_with_sources():
    assert set(GPUS) == {"A10G", "L4", "L40S", "A100 40GB", "A100 80GB", "H100 SXM", "H200", "H200 NVL"}
    for g in GPUS.values():
        assert g.memory_bytes == int(g.memory_gb * 1e9) > 0
        assert g.bf16_dense_tflops > 0 and g.hbm_bandwidth_gbs > 0
        assert g.interconnect and "datasheet" in g.source
    assert GPUS["H200"].memory_gb == 141 and GPUS["A100 80GB"].memory_gb == 80


def test_get_gpu_by_name_or_memory_and_unknown_names():
    assert get_gpu("h100-sxm").name == "H100 SXM"
    custom = get_gpu(None, 24)
    assert custom.memory_bytes == 24 * 2**30 and math.isnan(custom.bf16_dense_tflops)
    with pytest.raises(ConfigError, match=r"did you mean 'H200'.*Known: A10G.*--gpu-memory-gib"):
        get_gpu("H20O")
    with pytest.raises(ConfigError, match="positive"):
        get_gpu(None, 0)


def test_fit_verdict_is_peak_against_memory():
    est = estimate_memory("smollm3-3b", world_size=2, seq_len=4096)
    table = fit_table({"FULL_SHARD x2": est})
    assert list(table["gpu"]) == list(GPUS)
    for row in table.itertuples():
        assert row.fits == (est.peak_bytes <= GPUS[row.gpu].memory_bytes)
    assert fits(est, GPUS["H200"]) and not fits(est, GPUS["L4"])


def test_recommend_walks_the_flowchart():
    small = recommend("tiny", "L4", 2, seq_len=512)
    assert small.decision == "full replica"
    sharded = recommend("smollm3-3b", "A100 40GB", 2, seq_len=4096, activation_checkpointing=True)
    assert sharded.decision == "FULL_SHARD" and sharded.estimate.strategy == "FULL_SHARD"
    offload = recommend("smollm3-3b", "A10G", 2, seq_len=2048, activation_checkpointing=True)
    assert offload.decision == "FULL_SHARD + CPU offload" and offload.estimate.offload
    more = recommend("smollm3-3b", "A10G", 2, seq_len=2048, activation_checkpointing=True, host_memory_gib=16)
    assert more.decision == "more GPUs" and more.gpus > 2 and fits(more.estimate, GPUS["A10G"])
    never = recommend("smollm3-3b", get_gpu(None, 2), 1, seq_len=32768)
    assert never.decision == "does not fit"


def test_cli_custom_gpu_memory_is_labelled_as_custom(capsys):
    from smolfsdp.cli import main

    assert main(["memory", "--gpus", "2", "--gpu-memory-gib", "24"]) == 0
    out = capsys.readouterr().out
    assert "custom 24 GiB" in out and "H100" not in out.split("verdict:")[1].splitlines()[0]


@pytest.mark.parametrize(
    ("device_name", "key", "tflops"),
    [
        ("NVIDIA H200", "H200", 989.0),  # SXM: datasheet 1,979 BF16 TFLOPS with sparsity
        ("NVIDIA H200 NVL", "H200 NVL", 835.5),  # NVL: 1,671 with sparsity; was scored as the SXM part
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
        ("NVIDIA H100 NVL", None, None),  # not in the table: unknown, not the SXM peak
        ("NVIDIA H100 PCIe", None, None),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB", 312.0),
        ("NVIDIA GeForce RTX 4090", None, None),
        (None, None, None),
    ],
)
def test_device_name_picks_the_right_variant(device_name, key, tflops):
    from smolfsdp.measure.benchmark import peak_tflops

    g = gpu_from_device_name(device_name)
    assert (g.name if g else None) == key
    assert peak_tflops(device_name)[0] == tflops
