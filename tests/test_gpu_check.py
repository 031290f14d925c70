"""scripts/gpu_check.sh in its CPU simulation (the code path the lent GPU runs, tiny SmolLM3, every
module the GPU machine's image lacks hidden), its trace check on a real NCCL trace, and its refusals."""

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SHARED
from packaging.requirements import Requirement

from smolfsdp.audit.gpu_check.measure_gpu import SIM_SHAPES, make_plan
from smolfsdp.audit.gpu_check.profiled_window import check_trace
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.traces import analysis as ta

#: The GPU machine image's distributions that this venv also has (every other one is absent there).
H200_PACKAGES = ROOT / "tests" / "data" / "h200_packages.txt"
#: Hides modules the way the GPU machine lacks them: importlib.util.find_spec says None and `import x`
#: raises ImportError (a None entry in sys.modules); at exit it lists the smolfsdp modules it loaded.
HIDE = """import atexit, sys
for _name in {hidden!r}:
    sys.modules[_name] = None
print("test: %d modules the GPU image lacks hidden (trl, datasets, ijson, ...)" % len({hidden!r}), file=sys.stderr)
atexit.register(lambda: open({loaded!r}, "a").write(" ".join(m for m in sys.modules if m.startswith("smolfsdp")) + "\\n"))
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist: str) -> set[str]:
    """The distributions ``dist`` (this venv's version) needs on this platform, extras left out."""
    out = set()
    for line in importlib.metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.add(_norm(req.name))
    return out


def modules_missing_on_gpu_image() -> list[str]:
    """Top-level modules of this venv whose distributions are all absent from the GPU machine's image.

    Its package list names what is there; a distribution that one of those needs in this venv's
    version (huggingface_hub 2.4 needs httpx2; the image's 1.33 does not) stays visible: the image's
    own versions bring their own needs, and the check cannot run this venv's hub without it.
    """
    lines = H200_PACKAGES.read_text().splitlines()
    there = {_norm(x) for x in lines if x and not x.startswith("#")}
    todo = set(there)
    while todo:  # what the image's distributions need, transitively
        found = set().union(*(_requires(d) for d in todo if _installed(d))) - there
        there |= found
        todo = found
    dists = importlib.metadata.packages_distributions()
    return sorted(
        m
        for m, ds in dists.items()
        if m.isidentifier() and m != "smolfsdp" and not any(_norm(d) in there for d in ds)
    )


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


EXPECTED_FILES = {
    "bench.json",
    "trace_summary.json",
    "provenance.json",
    "gpu_check.log",
    "nvidia_smi.txt",
    f"trace_{SIM_SHAPES[-1].name}.json.gz",
}


def _out_entries(out: Path) -> list[Path]:
    return list(out.rglob("*")) if out.is_dir() else []


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """One run of the launcher in simulation, every module the GPU image lacks hidden; returns (out
    folder, completed process, the most entries ``out`` ever held, the smolfsdp modules each process loaded).

    ``out`` is listed every 50 ms while the check runs: a check killed at any moment (the device
    tool's limit, ``timeout``) leaves what was there then, so the most ever seen bounds what comes back.
    """
    hide = tmp_path_factory.mktemp("hide")
    loaded = hide / "loaded.txt"
    (hide / "sitecustomize.py").write_text(
        HIDE.format(hidden=modules_missing_on_gpu_image(), loaded=str(loaded))
    )
    out = tmp_path_factory.mktemp("out")
    env = {
        **os.environ,
        "OUT": str(out),
        "PY": sys.executable,
        "PYTHONPATH": str(hide),  # the launcher puts src/ in front of it
        "CUDA_VISIBLE_DEVICES": "",
    }
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--simulate-cpu"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    most, deadline = 0, time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        most = max(most, len(_out_entries(out)))
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return out, proc, most, loaded.read_text().split()


def _load(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def test_outputs_are_flat_and_fit_the_device_tool(sim):
    out, _, most, _ = sim
    entries = list(out.iterdir())
    assert {p.name for p in entries} == EXPECTED_FILES
    assert len(entries) <= 8 and all(p.is_file() for p in entries)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in entries)
    assert all(p.stat().st_size < 16 * 2**20 for p in entries)
    log = (out / "gpu_check.log").read_text()
    assert "modules the GPU image lacks hidden" in log  # the run really went without them
    # never more than 8 entries (no working folder) while it ran: a check killed part-way leaves <= 8
    assert most <= 8 and len(entries) <= most
    assert "static/est" in log and "gpu_check: exit 0" in log
    assert "CPU simulation" in (out / "nvidia_smi.txt").read_text()


def _gpu_check_script():
    spec = importlib.util.spec_from_file_location("gpu_check_script", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imports(tree: ast.AST, deferred: bool = False):
    """(top-level module name, inside a function?) for every absolute import statement in ``tree``."""
    for node in ast.iter_child_nodes(tree):
        inner = deferred or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if isinstance(node, ast.Import):
            yield from ((a.name.split(".")[0], inner) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0], inner
        yield from _imports(node, inner)


def test_import_check_names_every_third_party_module_the_path_imports(sim):
    """Every import at module level of every smolfsdp module the check and its analyze-trace
    subprocess loaded is in REQUIRED (checked before any work) or OPTIONAL; a deferred import (in a
    function the check does not call, e.g. peft for LoRA) at least names a module the GPU image has."""
    *_, loaded = sim
    script = _gpu_check_script()
    eager, deferred = set(), set()
    for name in set(loaded):
        source = ROOT / "src" / Path(*name.split("."))
        path = source / "__init__.py" if source.is_dir() else source.with_suffix(".py")
        for module, inner in _imports(ast.parse(path.read_text())):
            (deferred if inner else eager).add(module)
    ours = set(sys.stdlib_module_names) | {"smolfsdp", "__future__"}
    checked = set(script.REQUIRED) | set(script.OPTIONAL)
    assert "smolfsdp.traces.load" in loaded and "ijson" in modules_missing_on_gpu_image()
    assert eager - ours <= checked, eager - ours - checked
    missing = (deferred - ours - checked) & set(modules_missing_on_gpu_image())
    assert not missing, sorted(missing)
    assert {"torch", "transformers", "pandas", "tqdm"} <= eager
    assert set(script.OPTIONAL) <= set(modules_missing_on_gpu_image())  # optional because it is absent there


def test_bench_throughput_and_mfu_follow_their_formulas(sim):
    out, *_ = sim
    bench = _load(out, "bench.json")
    plan = make_plan(True)
    assert bench["simulated_cpu"] is True and bench["world_size"] == 1 and bench["device"] == "cpu"
    assert bench["model"]["attn_implementation"] == "sdpa"
    cal = bench["calibration"]
    ceiling = cal["matmul"]["tflops_median"]
    assert ceiling > 0 and cal["datasheet_peak_tflops"] is None and "CPU" in cal["datasheet_source"]
    assert [c["name"] for c in bench["configs"]] == [s.name for s in SIM_SHAPES]
    for cfg, shape in zip(bench["configs"], SIM_SHAPES, strict=True):
        assert cfg["activation_checkpointing"] == shape.activation_checkpointing
        assert len(cfg["steps"]) == plan.timed_steps == cfg["summary"]["timed_steps"]
        for row in cfg["steps"]:
            s = row["step_time_ms"] / 1e3
            assert row["tokens"] == shape.micro_batch * shape.seq_len
            assert row["tokens_per_s"] == pytest.approx(row["tokens"] / s)
            assert row["tflops"] == pytest.approx(row["flops_per_token"] * row["tokens"] / s / 1e12)
            assert row["mfu"] is None and row["mfu_vs_matmul"] == pytest.approx(row["tflops"] / ceiling)
            assert row["loss"] > 0
        times = [r["step_time_ms"] for r in cfg["steps"]]
        assert cfg["summary"]["step_time_ms_median"] == pytest.approx(statistics.median(times))


def test_memory_ratios_are_measured_over_estimated(sim):
    out, *_ = sim
    bench = _load(out, "bench.json")
    config = resolve_model_config("tiny")
    for cfg in bench["configs"]:
        mem = cfg["memory"]
        static = mem["static"]
        n = cfg["n_params"]
        # fp32 parameters, fp32 gradients, fp32 AdamW m and v: 4, 4 and 8 bytes per parameter
        assert static["measured"]["params_bytes"] == 4 * n
        assert static["measured"]["grads_bytes"] == 4 * n
        assert static["measured"]["optimizer_bytes"] == 8 * n
        est = estimate_memory(
            config,
            world_size=1,
            recipe=mem["recipe"],
            seq_len=cfg["seq_len"],
            micro_batch=cfg["micro_batch"],
            activation_checkpointing=cfg["activation_checkpointing"],
            adamw="fused",  # the optimizer that runs (issue 34)
        )
        assert static["estimated"]["params"] == est.params_bytes
        for k in ("params", "grads", "optimizer"):
            assert static["ratio"][k] == static["measured"][f"{k}_bytes"] / static["estimated"][k]
        assert static["ratio"]["params"] == 1.0 and static["ratio"]["optimizer"] == 1.0
        assert mem["peak_estimate_bytes"] == est.peak_bytes - est.cuda_context_bytes
        # the CPU allocator has no peak statistics: said, not invented
        assert mem["peak_allocated_bytes"] is None and mem["peak_ratio"] is None and mem["peak_reason"]


def test_trace_checks_and_analyze_trace(sim):
    out, *_ = sim
    summary = _load(out, "trace_summary.json")
    kept = out / summary["trace_file"]
    assert summary["trace_shape"] == SIM_SHAPES[-1].name  # the real run's shape
    assert summary["analyze_trace"]["returncode"] == 0
    parsed = ta.summarize_trace(kept)
    assert summary["analyze_trace"]["steps"] == len(parsed["steps"]) == make_plan(True).profile.profile_active
    for shape in SIM_SHAPES:
        check = summary["checks"][shape.name]
        assert check["nccl_kernels"] == 0 and check["mode"] == "cpu"
        assert check["fsdp_layers"] == list(range(check["fsdp_layers_expected"]))
        assert check["fsdp_ranges"]["FSDP::pre_forward"] > 0
        assert all(0 < f <= 1 for f in check["compute_busy_fraction"])


def test_provenance_names_code_versions_and_command(sim):
    out, *_ = sim
    prov = _load(out, "provenance.json")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert prov["git_sha"] == head and prov["git_sha_source"] == "git rev-parse HEAD"
    assert re.fullmatch(r"[0-9a-f]{64}", prov["source_sha256"])
    assert "src/smolfsdp/audit/gpu_check/measure_gpu.py" in prov["source_files"]
    import torch
    import transformers

    assert prov["versions"]["torch"] == torch.__version__
    assert prov["all_packages"]["transformers"] == transformers.__version__
    assert prov["command"] == "bash scripts/gpu_check.sh --simulate-cpu"
    assert re.match(r"\d{4}-\d\d-\d\dT", prov["date_utc"])


def test_nccl_kernels_are_counted_on_a_real_gpu_trace():
    ddp = SHARED / "traces" / "ddp_2rank_a100_rank0.json.gz"
    if not ddp.is_file():
        pytest.skip(f"{ddp} is absent: the real GPU traces live in ../shared/traces/ (CI has them)")
    check = check_trace(ddp, n_layers=1)
    df = ta.load_trace(ddp)
    kernels = df[df["cat"].eq("kernel")]
    assert check["mode"] == "gpu"
    assert check["nccl_kernels"] == kernels["name"].str.contains("nccl", case=False).sum() > 0
    assert sum(check["nccl_ops"].values()) == check["nccl_kernels"]
    # only the communication ops the trace holds (the name column's other categories left out)
    assert check["cpu_communication_ops"] and min(check["cpu_communication_ops"].values()) > 0
    assert check["compute_row"].startswith("GPU ") and check["fsdp_layers"] == []  # DDP: no FSDP range


def test_refusals_come_before_any_work(tmp_path):
    env = {**os.environ, "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""}
    no_out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")],
        env={k: v for k, v in env.items() if k != "OUT"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_out.returncode != 0 and "set OUT" in no_out.stderr
    # a missing module (transformers hidden, as a machine without it) is named with the fix
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text('import sys\nsys.modules["transformers"] = None\n')
    out = tmp_path / "out"
    bare = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--simulate-cpu", "--out", str(out)],
        env={**env, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT / 'src'}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bare.returncode == 1 and "cannot import transformers" in bare.stderr
    assert "install it" in bare.stderr and not out.exists()
    # GPU mode on a machine without one: refused after importing torch, before anything else (the
    # smolfsdp source is not even on the path, so reaching any other import would fail differently)
    gpu = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(out)],
        env={**env, "PYTHONPATH": str(hide)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert gpu.returncode == 1 and "no CUDA GPU is visible" in gpu.stderr and not out.exists()


def test_plan_sizes():
    gpu, cpu = make_plan(False), make_plan(True)
    assert (gpu.warmup_steps, gpu.timed_steps, gpu.matmul_n) == (3, 10, 8192)
    assert [s.name for s in gpu.shapes] == ["mb1_seq2048", "mb1_seq4096", "mb2_seq2048_ac"]
    assert gpu.shapes[-1].real_run and cpu.simulate_cpu and cpu.shapes[-1].activation_checkpointing
    with pytest.raises(ValueError, match="timed_steps=0"):
        make_plan(False, timed_steps=0)
