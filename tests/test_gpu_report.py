"""The chapters' view of a committed GPU measurement: a fabricated results folder (synthetic numbers,
made here only) and the absent folder."""

import json

import pytest

from smolfsdp.audit.gpu_check.report import error_pct, gpu_results_section, memory_table, throughput_table
from smolfsdp.measure.results import load_gpu_results

GIB = 2**30


def _fabricate(folder, simulated=False):
    """SYNTHETIC results with round numbers, shaped as scripts/gpu_check.sh writes them."""
    cfg = {
        "name": "mb1_seq2048",
        "summary": {
            "step_time_ms_median": 200.0,
            "tokens_per_s_median": 10240.0,
            "tflops_median": 400.0,
            "mfu_median": 400 / 989,
            "mfu_vs_matmul_median": 0.5,
        },
        "memory": {
            "static": {
                "estimated": {"params": 12 * GIB, "grads": 12 * GIB, "master": 0, "optimizer": 24 * GIB},
                "measured": {"params_bytes": 12 * GIB, "grads_bytes": 12 * GIB, "optimizer_bytes": 24 * GIB},
                "allocated_after_zero_grad_bytes": 40 * GIB,
            },
            "peak_estimate_bytes": 60 * GIB,
            "peak_allocated_bytes": 50 * GIB,
        },
    }
    bench = {
        "simulated_cpu": simulated,
        "calibration": {"matmul": {"n": 8192, "tflops_median": 800.0}, "datasheet_peak_tflops": 989.0},
        "configs": [cfg],
    }
    summary = {"checks": {"mb1_seq2048": {"compute_busy_fraction_mean": 0.9, "nccl_kernels": 0}}}
    prov = {
        "gpu": "SYNTHETIC GPU",
        "nvidia_smi": {"driver_version": "0.0"},
        "cuda": "0.0",
        "versions": {"torch": "synthetic", "transformers": "synthetic"},
        "date_utc": "2000-01-01T00:00:00+00:00",
        "git_sha": "0" * 40,
        "command": "synthetic",
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, obj in (("bench.json", bench), ("trace_summary.json", summary), ("provenance.json", prov)):
        (folder / name).write_text(json.dumps(obj))
    return folder


def test_absent_results_say_so(tmp_path):
    assert load_gpu_results(tmp_path / "nothing") is None
    (tmp_path / "readme_only").mkdir()
    (tmp_path / "readme_only" / "README.md").write_text("no measurement yet")
    for kind in ("memory", "profiling"):
        (text,) = gpu_results_section(kind, tmp_path / "readme_only")
        assert "No GPU measurement exists yet" in text


def test_the_committed_folder_loads_or_says_none_exists():
    res = load_gpu_results()  # data/results/h200/: a README until a real run is committed
    parts = gpu_results_section("memory")
    if res is None:
        assert len(parts) == 1 and "No GPU measurement exists yet" in parts[0]
    else:  # a committed run is complete, from a GPU, and shown shape by shape
        assert res.provenance["gpu"] and not res.bench["simulated_cpu"]
        assert set(parts[1]["shape"]) == {c["name"] for c in res.bench["configs"]}


def test_fabricated_results_give_errors_in_percent(tmp_path):
    folder = _fabricate(tmp_path / "h200")
    res = load_gpu_results(folder)
    mem = memory_table(res).set_index("component")
    assert mem.loc["parameter shards", "estimator error (%)"] == 0.0
    # allocated 40 GiB after zero_grad vs 36 GiB estimated: the estimate is 10 % low
    assert mem.loc["allocated after zero_grad", "estimator error (%)"] == pytest.approx(-10.0)
    assert mem.loc["peak allocated (timed steps)", "estimator error (%)"] == pytest.approx(20.0)
    assert mem.loc["peak allocated (timed steps)", "measured (GiB)"] == 50.0
    thr = throughput_table(res).iloc[0]
    assert thr["MFU vs datasheet (%)"] == pytest.approx(100 * 400 / 989)
    assert thr["MFU vs measured matmul (%)"] == 50.0 and thr["compute stream busy (%)"] == 90.0
    text, table, reading = gpu_results_section("profiling", folder)
    assert "SYNTHETIC GPU" in text and "800 TFLOP/s" in text and table.shape[0] == 1 and "MFU" in reading
    text, table, reading = gpu_results_section("memory", folder)
    assert "error is in percent of the measurement" in reading and len(table) == 5
    assert error_pct(110, 100) == pytest.approx(10.0)


def test_incomplete_or_simulated_results_are_refused(tmp_path):
    folder = _fabricate(tmp_path / "partial")
    (folder / "provenance.json").unlink()
    with pytest.raises(FileNotFoundError, match="provenance.json"):
        load_gpu_results(folder)
    with pytest.raises(ValueError, match="simulate-cpu"):
        load_gpu_results(_fabricate(tmp_path / "sim", simulated=True))
    with pytest.raises(ValueError, match="kind="):
        gpu_results_section("speed", tmp_path / "sim")
