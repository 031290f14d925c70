"""Issue 34, the first GPU session: the check estimates the fused AdamW that runs, records the peak of each
step phase beside the dry run's moments, survives a failing shape, starts gloo at world size 1; the launcher
sizes host memory from the model and refuses a GPU run of the TRL engine that Triton cannot build."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from test_gpu_check import HIDE, modules_missing_on_gpu_image

from smolfsdp.audit.gpu_check.measure_gpu import FAIL_SHAPE_ENV, PHASE_MOMENTS, SIM_SHAPES, phase_check
from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import count_parameters, resolve_model_config
from smolfsdp.launch import host_checks as checks

GIB = 2**30


def test_fused_adamw_makes_no_v_sized_temporary():
    fused = estimate_memory("smollm3-3b", adamw="fused")
    foreach = estimate_memory("smollm3-3b")  # the default stays torch's CUDA default
    held = fused.params_bytes + fused.master_bytes + fused.optimizer_bytes + fused.grads_bytes
    assert fused.moments["optimizer"] == held
    assert foreach.moments["optimizer"] == held + foreach.optimizer_bytes // 2
    # at 1 GPU the optimizer moment was the estimated peak; with fused AdamW it no longer is
    assert foreach.peak_moment == "optimizer" and fused.peak_moment != "optimizer"
    assert fused.peak_bytes < foreach.peak_bytes
    with pytest.raises(ValueError, match="Unknown adamw 'sgd'"):  # a ConfigError
        estimate_memory("smollm3-3b", adamw="sgd")


def test_phase_peaks_are_compared_with_the_moments_of_their_phase():
    est = estimate_memory("smollm3-3b", adamw="fused")
    backward = max(est.moments[m] for m in ("loss", "layer", "last layer"))
    peaks = {"forward": 30 * GIB, "backward": backward // 2, "optimizer": est.moments["optimizer"]}
    got = phase_check(est, peaks)
    assert set(got) == set(PHASE_MOMENTS) == {"forward", "backward", "clip", "optimizer"}
    assert got["backward"]["estimated_bytes"] == backward
    assert got["backward"]["error_pct"] == pytest.approx(100 * (backward - backward // 2) / (backward // 2))
    assert got["optimizer"]["error_pct"] == 0.0
    assert got["forward"] == {
        "moments": [],
        "estimated_bytes": None,
        "measured_bytes": 30 * GIB,
        "error_pct": None,
    }
    assert got["clip"]["measured_bytes"] is None  # not measured (CPU): said as None, not invented


@pytest.fixture(scope="module")
def injected(tmp_path_factory):
    """The CPU simulation with the GPU image's missing modules hidden and the first shape failing in its
    profiled window."""
    hide = tmp_path_factory.mktemp("hide")
    (hide / "sitecustomize.py").write_text(
        HIDE.format(hidden=modules_missing_on_gpu_image(), loaded=str(hide / "loaded.txt"))
    )
    out = tmp_path_factory.mktemp("out")
    env = {**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT / 'src'}", "CUDA_VISIBLE_DEVICES": "",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", FAIL_SHAPE_ENV: SIM_SHAPES[0].name}  # fmt: skip
    # SMOLFSDP_SIM_PYTHON: another interpreter, e.g. a venv with the GPU image's versions
    # (scripts/device_stack_sim.sh); by default this venv's, with the image's missing modules hidden.
    python = os.environ.get("SMOLFSDP_SIM_PYTHON", sys.executable)
    cmd = [python, str(ROOT / "scripts" / "gpu_check.py"), "--simulate-cpu", "--out", str(out)]
    cmd += ["--warmup-steps", "1", "--timed-steps", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return out, proc


def test_one_failing_shape_keeps_every_other_shapes_results(injected):
    out, proc = injected
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # a failure is not a success
    bench = json.loads((out / "bench.json").read_text())
    names = [c["name"] for c in bench["configs"]]
    assert names == [s.name for s in SIM_SHAPES]
    bad, *good = bench["configs"]
    assert bad["error"].startswith("RuntimeError: injected failure in mb1_seq32") and not bad["out_of_memory"]
    summary = json.loads((out / "trace_summary.json").read_text())
    assert set(summary["checks"]) == {c["name"] for c in good}
    assert summary["trace_file"] == f"trace_{SIM_SHAPES[-1].name}.json.gz"
    assert (out / summary["trace_file"]).stat().st_size > 0  # the kept trace survived the failure
    for c in good:
        assert c["summary"]["step_time_ms_median"] > 0
        mem = c["memory"]
        assert mem["adamw"] == "fused" and bench["model"]["estimator_adamw"] == "fused"
        est = mem["estimate"]
        held = est["params_bytes"] + est["master_bytes"] + est["optimizer_bytes"] + est["grads_bytes"]
        assert est["moments"]["optimizer"] == held  # fused AdamW: no v-sized temporary estimated
        assert mem["phases"]["optimizer"]["estimated_bytes"] == held
        assert mem["phases"]["backward"]["moments"][:3] == ["loss", "layer", "last layer"]
    assert "mb1_seq32: FAILED (RuntimeError: injected failure" in proc.stdout


DEVICE_SIM = ROOT / "data" / "results" / "gpu_check_sim"


def test_the_simulation_ran_on_the_gpu_images_versions():
    """The record scripts/device_stack_sim.sh wrote: the same simulation, with a failure injected in the first
    shape, on torch 2.11 / transformers 5.17 / accelerate 1.15 (the GPU image's versions), kept every other
    shape's results."""
    prov = json.loads((DEVICE_SIM / "provenance.json").read_text())
    versions = prov["versions"]
    assert (versions["torch"], versions["transformers"], versions["accelerate"]) == (
        "2.11.0",
        "5.17.0",
        "1.15.0",
    )
    assert versions["trl"] == versions["datasets"] == "not installed"  # as on the GPU image
    bench = json.loads((DEVICE_SIM / "bench.json").read_text())
    assert bench["simulated_cpu"] and bench["process_group"]["backend"] == "gloo"
    bad, *good = bench["configs"]
    assert [c["name"] for c in bench["configs"]] == [s.name for s in SIM_SHAPES]
    assert bad["error"].startswith("RuntimeError: injected failure in mb1_seq32")
    assert good and all(c["summary"]["step_time_ms_median"] > 0 for c in good)
    summary = json.loads((DEVICE_SIM / "trace_summary.json").read_text())
    assert set(summary["checks"]) == {c["name"] for c in good}
    assert (DEVICE_SIM / summary["trace_file"]).stat().st_size > 0


def test_world_size_one_runs_on_gloo(injected):
    out, proc = injected
    bench = json.loads((out / "bench.json").read_text())
    assert bench["process_group"] == {"backend": "gloo", "why_not_gloo": None}
    assert "world size 1 (gloo)" in proc.stdout


def test_host_memory_is_sized_from_the_model(monkeypatch):
    per_rank = count_parameters(resolve_model_config("smollm3-3b")).total * 4
    assert checks.loaded_model_bytes("smollm3-3b") == per_rank
    assert 12.2e9 < per_rank < 12.4e9  # 3.08 B parameters in fp32: two ranks load 24.6 GB
    monkeypatch.setattr(checks, "available_memory_bytes", lambda: 20 * GIB)
    monkeypatch.setattr(checks, "triton_toolchain_missing", lambda: [])
    cfg = TrainConfig().replace(model="smollm3-3b", nproc=2)
    with pytest.raises(
        ConfigError, match=r"2 ranks need at least 23.9 GiB of host memory .*20.0 GiB.*--nproc 1"
    ):
        checks.check_resources(cfg, gpu_count=2)  # GPUs too: every rank loads the model on the host
    monkeypatch.setattr(checks, "available_memory_bytes", lambda: 30 * GIB)
    checks.check_resources(cfg, gpu_count=2)


def test_trl_on_gpus_needs_what_triton_builds_with(monkeypatch):
    monkeypatch.setattr(checks, "available_memory_bytes", lambda: 64 * GIB)
    monkeypatch.setattr(
        checks, "triton_toolchain_missing", lambda: ["a C compiler (cc, gcc or clang; or set CC)"]
    )
    trl = TrainConfig().replace(engine="trl", nproc=1)
    with pytest.raises(ConfigError, match=r"engine=trl on GPUs .*lacks a C compiler.*engine: native"):
        checks.check_resources(trl, gpu_count=1)
    checks.check_resources(trl.replace(engine="native"), gpu_count=1)  # the native engine needs no Triton
    checks.check_resources(trl, gpu_count=0)  # on CPU TRL's chunked PyTorch path runs, no Triton


class _Captured(Exception):
    pass


def test_the_smoke_profile_hides_gpus_from_its_kernels_and_ranks(monkeypatch, tmp_path):
    import nbclient

    from smolfsdp.book import chapters

    seen = {}

    class FakeClient:
        def __init__(self, nb, **kw):
            pass

        def execute(self, env=None):
            seen["execute"] = env
            raise _Captured

    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    nb = ROOT / "notebooks" / "01_finetune.ipynb"
    for profile, want in (("smoke", ""), ("full", "0,1")):
        with pytest.raises(_Captured):
            chapters.execute_chapter(nb, profile)
        assert seen["execute"]["CUDA_VISIBLE_DEVICES"] == want

    def fake_run(cmd, cwd=None, env=None, check=None):
        seen["quarto"] = env
        raise _Captured

    monkeypatch.setattr(chapters.subprocess, "run", fake_run)
    monkeypatch.setattr(chapters, "prepare_render_project", lambda profile, root: tmp_path)
    monkeypatch.setattr(chapters.shutil, "which", lambda exe: "/bin/true", raising=False)
    for profile, want in (("smoke", ""), ("full", "0,1")):
        with pytest.raises(_Captured):
            chapters.render_book(profile, quarto="/bin/true", scratch_root=tmp_path, out_root=tmp_path)
        assert seen["quarto"]["CUDA_VISIBLE_DEVICES"] == want


def test_the_real_run_is_refused_in_one_line_without_gpus_or_hub(monkeypatch, tmp_path, capsys):
    import time

    from smolfsdp.cli import main as cli_main
    from smolfsdp.config import load_config

    real = load_config(ROOT / "configs" / "runs" / "smollm3_3b_medical.yaml")
    with pytest.raises(
        ConfigError, match=r"model=HuggingFaceTB/SmolLM3-3B \(3.08 B parameters\) trains on CUDA GPUs"
    ):
        checks.check_runs_here(real, gpu_count=0)
    other = real.replace(model="nobody/not-cached-model")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(
        ConfigError, match=r"not-cached-model is not in the local .*cache.*HF_HUB_OFFLINE is set"
    ):
        checks.check_runs_here(other, gpu_count=2)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    with pytest.raises(ConfigError, match=r"cannot be reached \(no route\)"):
        checks.check_runs_here(other, gpu_count=2, hub_problem=lambda: "no route")
    checks.check_runs_here(real.replace(model="tiny"), gpu_count=0)  # the smoke model runs on CPU

    # the CLI, as the README gives it, on this GPU-less machine: one line, fast, and no run folder
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    rc = cli_main(["train", "--config", str(ROOT / "configs" / "runs" / "smollm3_3b_medical.yaml"),
                   "--output_dir", str(tmp_path / "runs")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and time.monotonic() - t0 < 30
    assert err[-1].startswith(
        "smolfsdp: error: model=HuggingFaceTB/SmolLM3-3B (3.08 B parameters) trains on CUDA"
    )
    assert not (tmp_path / "runs").exists()
    # under accelerate each rank checks the same before its process group or run folder
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    rc = cli_main(["train", "--config", str(ROOT / "configs" / "runs" / "smollm3_3b_medical.yaml"),
                   "--output_dir", str(tmp_path / "runs")])  # fmt: skip
    assert rc == 2 and "trains on CUDA GPUs" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_accelerate_launch_runs_after_the_same_checks(monkeypatch, tmp_path, capsys):
    """``smolfsdp train --accelerate_config F``: the one-line refusals first, then ``accelerate launch``."""
    from smolfsdp.cli import main as cli_main
    from smolfsdp.config import load_config
    from smolfsdp.launch import accelerate_launch, torchrun

    recipe = str(ROOT / "configs" / "runs" / "smollm3_3b_medical.yaml")
    gpu2 = ROOT / "configs" / "accelerate" / "2gpu.yaml"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    rc = cli_main(["train", "--config", recipe, "--accelerate_config", str(gpu2)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "trains on CUDA GPUs" in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "runs").exists()  # no rank started, no run folder

    smoke = load_config(ROOT / "configs" / "runs" / "smoke.yaml")
    assert accelerate_launch.check_accelerate_config(smoke, gpu2) == 2
    with pytest.raises(ConfigError, match=r"num_processes=2 on num_machines=1, but the run has nproc=4"):
        accelerate_launch.check_accelerate_config(smoke.replace(nproc=4), gpu2)
    with pytest.raises(
        ConfigError, match=r"distributed_type=MULTI_CPU: accelerate launches that with its simple"
    ):
        accelerate_launch.check_accelerate_config(smoke, ROOT / "configs" / "accelerate" / "2cpu.yaml")
    with pytest.raises(ConfigError, match=r"cannot read it"):
        accelerate_launch.check_accelerate_config(smoke, tmp_path / "missing.yaml")

    seen = {}

    def fake_spawn(cmd, **kw):
        seen["cmd"] = cmd
        raise _Spawned

    class _Spawned(Exception):
        pass

    monkeypatch.setattr(torchrun, "spawn", fake_spawn)
    with pytest.raises(_Spawned):
        torchrun.launch(smoke.replace(output_dir=str(tmp_path / "runs")), accelerate_config=gpu2)
    cmd = seen["cmd"]
    assert cmd[1:5] == ["-m", "accelerate.commands.launch", "--config_file", str(gpu2)]
    assert cmd[5:8] == ["-m", "smolfsdp.cli", "train"]
