"""Faults and multi-node launch: a rank killed mid-run, elastic restarts, a hung collective, rendezvous.

The runs share one uninterrupted 6-step run (module fixture) whose final parameters the others must equal.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from _dist import free_port
from safetensors.torch import load_file

from smolfsdp.book import drills_view, tables
from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.cli import main as cli_main
from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch import failures as launch_failures
from smolfsdp.launch import probe, runner
from smolfsdp.launch import torchrun as launch
from smolfsdp.launch.validate import validate
from smolfsdp.probes import drills

# 4 rows x 256 tokens per rank: steps long enough (~0.3 s on 2 cores) for the killer to act between them
BASE = TrainConfig(max_steps=6, eval_steps=0, per_device_train_batch_size=4, max_length=256)
ROOT = Path(__file__).resolve().parents[1]


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def _assert_same_params(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=atol)


# ------------------------------------------------------------------ commands and bad input
def test_torchrun_commands_single_and_multi_node():
    single = launch.command_for(BASE, ["train"])
    assert single[1:] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "smolfsdp.cli",
        "train",
    ]
    multi = BASE.replace(nproc=16, nnodes=2, node_rank=1, rdzv_endpoint="node0:29400", max_restarts=3)
    assert launch.command_for(multi, ["train"])[1:] == [
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29400",
        "--rdzv-id=smolfsdp-smoke",
        "--rdzv-conf=join_timeout=300,read_timeout=300,is_host=false",
        "--nproc-per-node=8",  # nproc is the world size; each of 2 nodes starts 8
        "--max-restarts=3",
        "-m",
        "smolfsdp.cli",
        "train",
    ]
    assert "is_host=true" in " ".join(launch.command_for(multi.replace(node_rank=0), ["train"]))


@pytest.mark.parametrize(
    "changes, needle",
    [
        (
            {"nproc": 3, "nnodes": 2},
            "nproc=3 processes cannot be split evenly over nnodes=2 nodes.*Use nproc=4 or 2",
        ),
        ({"nproc": 4, "nnodes": 2}, "needs rdzv_endpoint=host:port"),
        (
            {"nproc": 4, "nnodes": 2, "node_rank": 2, "rdzv_endpoint": "n0:1"},
            r"node_rank=2: must be in 0\.\.1",
        ),
        ({"nproc": 4, "nnodes": 2, "rdzv_endpoint": "node0"}, "'node0' is not host:port"),
        ({"nproc": 4, "nnodes": 2, "rdzv_endpoint": "node0:99999"}, "is not host:port"),
        ({"max_restarts": -1}, "max_restarts=-1 must be >= 0"),
        ({"collective_timeout_s": 0}, "collective_timeout_s=0 must be > 0"),
    ],
)
def test_bad_launch_settings_are_refused(changes, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(BASE.replace(**changes))


def test_cli_refuses_node_count_that_does_not_divide(capsys):
    assert cli_main(["train", "--nproc", "6", "--nnodes", "4", "--rdzv-endpoint", "n0:29400"]) == 2
    assert "nproc=6 processes cannot be split evenly over nnodes=4" in capsys.readouterr().err


def test_endpoint_that_does_not_answer_fails_naming_it(tmp_path, capsys):
    port = free_port()  # bound, released: nothing listens there
    cfg = BASE.replace(
        output_dir=str(tmp_path),
        nproc=2,
        nnodes=2,
        node_rank=1,
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_timeout_s=2,
    )
    t0 = time.monotonic()
    with pytest.raises(
        ConfigError, match=rf"rendezvous endpoint 127\.0\.0\.1:{port} did not answer within 2 s"
    ):
        launch.launch(cfg, capture=True)
    assert time.monotonic() - t0 < 8
    assert not (tmp_path / "smoke").exists()  # nothing was started
    err = capsys.readouterr().err
    assert f"waiting up to 2 s for the rendezvous endpoint 127.0.0.1:{port} served by node_rank 0" in err


def test_waiting_for_the_endpoint_reports_while_it_retries(capsys):
    """One line when the wait starts, one per report_every_s while it retries (30 s by default)."""
    port = free_port()
    with pytest.raises(ConfigError, match="did not answer within 2.5 s"):
        launch.wait_for_endpoint(f"127.0.0.1:{port}", 2.5, poll_s=0.2, report_every_s=1.0)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"[smolfsdp] waiting up to 2.5 s for the rendezvous endpoint 127.0.0.1:{port}")
    still = [line for line in lines if line.startswith(f"[smolfsdp] still waiting for 127.0.0.1:{port}: ")]
    assert len(still) == 2, lines  # at ~1 s and ~2 s of the 2.5 s
    assert all(line.endswith("of 2.5 s ([Errno 111] Connection refused)") for line in still), still


def test_torchrun_rendezvous_times_out_instead_of_waiting(tmp_path):
    """Node 0 of 2 whose partner never comes: torchrun gives up after join_timeout (5 s), not torch's 600 s."""
    cfg = BASE.replace(
        nproc=2, nnodes=2, node_rank=0, rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_timeout_s=5
    )
    cmd = launch.command_for(cfg, ["train"])
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=launch.launch_env(1))
    took = time.monotonic() - t0
    assert out.returncode != 0
    assert "RendezvousTimeoutError" in out.stderr
    assert 5 <= took < 60, took
    # what `smolfsdp train` prints last: the timeout named, not only "torchrun exited with code 1"
    why = launch_failures.explain_failure(out.stdout + out.stderr, out.returncode, cfg)
    assert why.startswith(
        f"run 'smoke' failed: the rendezvous at {cfg.rdzv_endpoint} timed out after 5 s (rdzv_timeout_s): "
        "not all of the nnodes=2 nodes joined; start the same command on every node (node_rank 0..1)"
    ), why
    assert "exited with code" not in why


def test_rendezvous_closed_and_lost_store_are_explained():
    cfg = BASE.replace(nproc=2, nnodes=2, node_rank=1, rdzv_endpoint="node0:29400")
    closed = "raise RendezvousClosedError\ntorch.distributed.elastic.rendezvous.api.RendezvousClosedError\n"
    assert "the rendezvous at node0:29400 was closed by another node" in launch_failures.explain_failure(
        closed, 1, cfg
    )
    lost = (
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store"
    )
    assert "the connection to the rendezvous store at node0:29400 failed" in launch_failures.explain_failure(
        lost, 1, cfg
    )
    assert launch_failures.explain_rendezvous("ChildFailedError", cfg) is None


# ------------------------------------------------------------------ a rank killed mid-run
def test_rank_killed_after_step_3_then_resume_equals_uninterrupted(uninterrupted, runs):
    """SIGKILL rank 1 alone after step 3's checkpoint: the launcher names it; --resume finishes the run."""
    cfg = BASE.replace(name="killed", output_dir=str(runs), save_steps=1, save_total_limit=6)
    proc, killed = drills.launch_and_kill(cfg, 3, rank=1)
    assert proc.returncode != 0, "the run finished before it could be killed"
    latest = checkpoint.latest_checkpoint(cfg.run_dir)
    assert latest is not None and 3 <= int(latest.name.split("-")[1]) < 6
    assert not (cfg.run_dir / "final_model").exists()
    failures = launch_failures.parse_failures(proc.stdout)
    assert failures[0] == {
        **failures[0],
        "rank": 1,
        "exitcode": -9,
        "signal": "SIGKILL",
        "pid": killed["pid"],
    }
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(
        f"[smolfsdp] run 'killed' failed: rank 1 (local rank 1 on {failures[0]['host']}, pid "
    )
    assert "was killed by SIGKILL" in last
    assert (
        f"the last complete checkpoint is {latest}; resume with: smolfsdp train <the same flags> --resume"
        in last
    )
    # resume through the command line, as a reader would
    cfg_path = runs / "killed.yaml"
    cfg.save(cfg_path)
    out = subprocess.run(
        [sys.executable, "-m", "smolfsdp.cli", "train", "--config", str(cfg_path), "--resume"],
        capture_output=True,
        text=True,
        timeout=600,
        env=launch.launch_env(2),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["metrics"]["resumed_from"] == str(latest)
    assert summary["metrics"]["optimizer_step"] == uninterrupted.summary["metrics"]["optimizer_step"] == 6
    _assert_same_params(_params(uninterrupted.path), _params(cfg.run_dir))


def test_elastic_restart_resumes_from_latest_checkpoint(uninterrupted, runs):
    """--max-restarts 1: torchrun restarts both ranks after rank 1 is killed; they resume and finish."""
    cfg = BASE.replace(name="elastic", output_dir=str(runs), save_steps=1, save_total_limit=6, max_restarts=1)
    killed: dict = {}
    killer = threading.Thread(target=drills.kill_after_step, args=(cfg, 3, killed), kwargs={"rank": 1})
    killer.start()
    run = runner.run(cfg, capture=True, timeout=600)
    killer.join()
    at_kill = killed["latest_at_kill"]
    assert at_kill is not None and 3 <= int(at_kill.name.split("-")[1]) < 6, "killed too late"
    resumed = run.summary["metrics"]["resumed_from"]
    assert resumed is not None and int(Path(resumed).name.split("-")[1]) >= 3
    assert run.summary["metrics"]["optimizer_step"] == 6
    assert "failed (exitcode: -9) local_rank: 1" in run.log  # torchrun saw the kill, then restarted
    assert f"resumed from {resumed} at step" in run.log
    _assert_same_params(_params(uninterrupted.path), _params(run.path))


def test_two_nodes_on_one_machine_equal_one_node(uninterrupted, runs):
    """The multi-node path for real: two torchrun "nodes" of one process each, c10d rendezvous on
    localhost, one shared run folder; the result equals the 2-process single-node run."""
    cfg = BASE.replace(
        name="twonodes", output_dir=str(runs), nnodes=2, rdzv_endpoint=f"127.0.0.1:{free_port()}"
    )
    results = {}

    def node(rank: int) -> None:
        results[rank] = launch.launch(cfg.replace(node_rank=rank), capture=True, timeout=600)

    threads = [threading.Thread(target=node, args=(r,)) for r in (1, 0)]  # node 1 first: it waits for node 0
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[r].returncode for r in (0, 1)] == [0, 0], (
        results[0].stdout[-2000:] + results[1].stdout[-2000:]
    )
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["params"]["fraction_per_rank"] == [0.5, 0.5]
    _assert_same_params(_params(uninterrupted.path), _params(cfg.run_dir), atol=1e-5)


# ------------------------------------------------------------------ a hung collective
HANG = textwrap.dedent(
    """
    import time, torch, torch.distributed as dist
    from smolfsdp.sharding.distributed import init_distributed, name_collective_errors
    info = init_distributed(timeout_s=3)
    dist.barrier()
    with name_collective_errors():
        if info.rank == 0:
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(4))
            finally:
                print(f"rank 0 waited {time.monotonic() - t0:.1f} s", flush=True)
        else:
            time.sleep(30)  # skips the all_reduce
    """
)


def test_hung_collective_times_out_naming_rank_and_collective(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=launch.launch_env(2))
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert (
        "smolfsdp.sharding.distributed.CollectiveError: rank 0 of 2: collective all_reduce (#2 on process group"
        in text
    )
    assert "input sizes [[4]], timeout 3 s) timed out: " in text
    waited = float(text.split("rank 0 waited ")[1].split(" s")[0])
    assert 2.9 <= waited < 10, waited
    assert took < 30, took  # torchrun stopped the sleeping rank instead of waiting its 30 s
    cfg = BASE.replace(output_dir=str(tmp_path))
    line = launch_failures.explain_failure(text, out.returncode, cfg)
    assert "rank 0 (local rank 0" in line and "exited with code 1" in line
    assert "rank 0 of 2: collective all_reduce" in line


# ------------------------------------------------------------------ SLURM and accelerate
def test_accelerate_multinode_config_loads():
    from accelerate.commands.config.config_args import ClusterConfig

    path = ROOT / "configs" / "accelerate" / "multinode.yaml"
    cc = ClusterConfig.from_yaml_file(str(path))
    assert (cc.num_machines, cc.num_processes, cc.machine_rank) == (2, 16, 0)
    assert cc.main_process_port == 29500 and cc.rdzv_backend == "c10d"
    assert str(cc.distributed_type) in ("MULTI_GPU", "DistributedType.MULTI_GPU")
    assert cc.same_network is True


def test_slurm_script_is_valid_bash_and_uses_the_documented_rendezvous():
    script = ROOT / "scripts" / "slurm" / "train.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    for needle in (
        "scontrol show hostnames",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$HEAD_NODE:$RDZV_PORT"',
        '--rdzv-id="$SLURM_JOB_ID"',
        '--nnodes="$SLURM_NNODES"',
        "--max-restarts",
        "-m smolfsdp.cli train",
    ):
        assert needle in text, needle


def test_resume_on_restart_picks_latest(tmp_path):
    cfg = BASE.replace(output_dir=str(tmp_path), save_steps=1)
    assert launch.resume_on_restart(cfg, {"TORCHELASTIC_RESTART_COUNT": "0"}) is cfg
    assert launch.resume_on_restart(cfg, {"TORCHELASTIC_RESTART_COUNT": "1"}).overwrite is True  # none yet
    done = cfg.run_dir / "checkpoints" / "step-000002"
    done.mkdir(parents=True)
    (done / checkpoint.MARKER).write_text("ok\n")
    assert launch.resume_on_restart(cfg, {"TORCHELASTIC_RESTART_COUNT": "1"}).resume_from == "latest"
    assert os.environ.get("TORCHELASTIC_RESTART_COUNT") is None


def test_drill_table_labels_runs_and_says_the_difference_exactly(tmp_path):
    """Before: a plain DataFrame with index 0/1, snake_case headers, absolute /tmp paths cut at 50
    characters, and the difference rounded (0.004 and 0 both read 0.00)."""
    ckpt = tmp_path / "fault_killed" / "checkpoints" / "step-000003"
    row = {  # the keys and values kill_rank_drill returns (tests/test_trl_engine.py runs it for real)
        "run": "rank 1 killed, then --resume",
        "killed": "rank 1 (pid 4242) after step 3",
        "max_restarts": 0,
        "first_launch_exit_code": 1,
        "launcher_said": "[smolfsdp] run 'fault_killed' failed: ...",
        "resumed_from": str(ckpt),
        "optimizer_steps": 6,
        "tensors": 38,
        "max_abs_diff": 0.0,
        "reference": str(tmp_path / "fault_whole"),
    }
    elastic = {**row, "run": "rank 1 killed, torchrun restarts (max_restarts=1)", "max_restarts": 1}
    elastic.update(first_launch_exit_code=0, max_abs_diff=0.0041729, resumed_from="/elsewhere/step-000004")
    frame = drills_view.drill_table([row, elastic], root=tmp_path)
    assert list(frame.index) == [row["run"], elastic["run"]] and frame.index.name == "run"
    assert list(frame.columns) == [
        "killed",
        "first launch's exit code",
        "resumed from (checkpoint)",
        "optimizer steps",
        "tensors compared",
        "largest weight difference from the run left alone",
    ]
    assert frame["resumed from (checkpoint)"].tolist() == [
        "fault_killed/checkpoints/step-000003",
        "/elsewhere/step-000004",  # not under root: kept whole, never cut
    ]
    diffs = frame["largest weight difference from the run left alone"].tolist()
    assert diffs == ["0 (bitwise identical)", "4.17 × 10⁻³"]
    assert tables.difference_text(2.5e-7) == "2.50 × 10⁻⁷"
    html = tables.show(frame).to_html()
    assert "fault_killed/checkpoints/step-000003" in html and "max_abs_diff" not in html and "nan" not in html
    with pytest.raises(KeyError, match="no 'run' label"):
        drills_view.drill_table([{"max_abs_diff": 0.0}])


# ------------------------------------------------------------------ launcher: causes named, one run per name, SIGTERM
#: torchrun 2.13's output when rank 1 stopped itself (SIGSTOP) and rank 0's barrier timed out (captured from a
#: real 2-rank gloo run, trimmed): torchrun SIGTERMs the stopped rank, waits 30 s, then SIGKILLs it.
STOPPED_RANK_OUTPUT = """\
[rank0]: RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete
W1201 08:49:06.841000 18964 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 19036 closing signal SIGTERM
W1201 08:49:36.841000 18964 torch/distributed/elastic/multiprocessing/api.py:1047] Unable to shutdown process 19036 via 15, forcefully exiting via 9
E1201 08:49:36.958000 18964 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 19035) of binary: /work/main/.venv/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/tmp/stopme.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_08:49:36
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 19036)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 19036
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_08:49:06
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 19035)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_stopped_rank_is_not_reported_as_killed_by_oom(tmp_path):
    """Before: 'rank 1 ... was killed by SIGKILL (the out-of-memory killer ...)' came first."""
    cfg = BASE.replace(output_dir=str(tmp_path))
    line = launch_failures.explain_failure(STOPPED_RANK_OUTPUT, 1, cfg)
    assert line.startswith(
        f"run {cfg.name!r} failed: rank 0 (local rank 0 on localhost, pid 19035) exited with code 1"
    )
    assert "rank 1 (local rank 1 on localhost, pid 19036) did not answer the launcher's SIGTERM" in line
    assert "stopped (SIGSTOP" in line and "out-of-memory" not in line
    # a SIGKILL the launcher did not send is still named as the cause, with the OOM hint
    killed = STOPPED_RANK_OUTPUT.replace("Unable to shutdown process 19036", "Unable to shutdown process 4")
    assert (
        "rank 1 (local rank 1 on localhost, pid 19036) was killed by SIGKILL (the out-of-memory killer"
        in (launch_failures.explain_failure(killed, 1, cfg))
    )


def test_rendezvous_port_in_use_is_named_not_a_lost_connection(tmp_path):
    """A real torchrun whose rendezvous port is taken. Before: 'the connection to the rendezvous store ...
    failed (node_rank 0 stopped, or the network between the nodes failed)'."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = BASE.replace(
            output_dir=str(tmp_path), nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout_s=5
        )
        cmd = launch.torchrun_command(
            1, [], "json.tool", nnodes=2, rdzv_endpoint=cfg.rdzv_endpoint, is_host=True, rdzv_timeout_s=5
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    line = launch_failures.explain_failure(proc.stdout + proc.stderr, proc.returncode, cfg)
    assert f"port {port} is already in use on this machine (EADDRINUSE" in line
    assert "network between the nodes failed" not in line


def test_second_run_of_the_same_name_is_refused(tmp_path):
    """While one launcher holds the run's lock, a second launch of that name and output_dir is refused
    before it starts anything (before: both ran, and the folder kept only the second)."""
    from smolfsdp.launch.host_checks import check_output_dir, lock_path, run_lock

    cfg = BASE.replace(name="twice", output_dir=str(tmp_path))
    with run_lock(cfg) as held:
        assert held == lock_path(cfg) == tmp_path / ".twice.lock"
        assert held.read_text().strip() == str(os.getpid())
        with pytest.raises(
            ConfigError, match=rf"Run 'twice' in .* is already running \(launcher pid {os.getpid()}"
        ):
            launch.launch(cfg)
        with pytest.raises(ConfigError, match="already running"):
            check_output_dir(cfg)
        check_output_dir(cfg.replace(name="other"))  # another name is free
    assert not lock_path(cfg).exists()
    with run_lock(cfg):  # released: a later run of the name may start
        pass


def test_output_dir_must_be_a_writable_folder(tmp_path):
    from smolfsdp.launch.host_checks import check_output_dir

    afile = tmp_path / "runs"
    afile.write_text("not a folder")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_output_dir(BASE.replace(output_dir=str(afile)))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "smoke").write_text("")
    with pytest.raises(ConfigError, match="out/smoke' is a file"):
        check_output_dir(BASE.replace(output_dir=str(tmp_path / "out")))
    readonly = Path("/sys/smolfsdp-runs")  # sysfs refuses new files even to root (chmod does not stop root)
    try:
        with tempfile.TemporaryFile(dir="/sys"):
            pytest.skip("/sys is writable here")
    except OSError:
        pass
    with pytest.raises(ConfigError, match="output_dir='/sys/smolfsdp-runs' is not writable"):
        check_output_dir(BASE.replace(output_dir=str(readonly)))


def test_nproc_is_checked_against_cores_memory_and_gpus(monkeypatch, capsys):
    from smolfsdp.launch import host_checks as launch_checks

    with pytest.raises(ConfigError, match="64 CPU ranks on 2 core.* more than 4 per core"):
        launch_checks.check_resources(BASE.replace(nproc=64), cpu_count=2, gpu_count=0)
    launch_checks.check_resources(BASE.replace(nproc=4), cpu_count=2, gpu_count=0)
    assert "warning: 4 CPU ranks on 2 core(s)" in capsys.readouterr().err
    monkeypatch.setattr(launch_checks, "available_memory_bytes", lambda: 2**30)
    with pytest.raises(
        ConfigError, match=r"4 ranks need at least 2.0 GiB of host memory.* 1.0 GiB is available.*--nproc 1"
    ):
        launch_checks.check_resources(BASE.replace(nproc=4), cpu_count=8, gpu_count=0)
    with pytest.raises(ConfigError, match="has 1 GPU"):
        launch_checks.check_resources(BASE.replace(nproc=2), gpu_count=1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # launch() refuses before it starts torchrun
    with pytest.raises(ConfigError, match="more than 4 per core"):
        launch.launch(BASE.replace(nproc=64))


SLEEPER = """\
import os, sys, time
out = os.environ["SLEEPER_DIR"]
with open(os.path.join(out, f"rank{os.environ['RANK']}.pid"), "w") as f:
    f.write(f"{os.getpid()} {sys.argv[-1]}")
time.sleep(600)
"""

LAUNCHER = """\
import sys
import tempfile
from smolfsdp.launch import torchrun as launch
from smolfsdp.config import TrainConfig

def sleeper_command(cfg, args, module="smolfsdp.cli"):
    return launch.torchrun_command(2, args, "sleeper")  # torchrun and 2 real ranks, which just sleep

launch.command_for = sleeper_command
try:
    launch.launch(TrainConfig(name="term", output_dir=sys.argv[1]))
except launch.Terminated:
    sys.exit(143)
"""


def test_sigterm_to_the_launcher_stops_every_rank_and_removes_the_temp_config(tmp_path):
    """Before: SIGTERM killed the launcher alone; torchrun and both ranks kept running, and the unredacted
    config stayed in its temporary folder."""
    import psutil

    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    env = dict(os.environ, SLEEPER_DIR=str(tmp_path), PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT / 'src'}")
    proc = subprocess.Popen([sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "runs")], env=env)
    pids = [tmp_path / f"rank{r}.pid" for r in (0, 1)]
    deadline = time.monotonic() + 240
    while not all(p.is_file() and p.read_text() for p in pids):
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.5)
    family = psutil.Process(proc.pid).children(recursive=True)  # torchrun and its two ranks
    try:
        config = Path(pids[0].read_text().split()[1])
        assert len(family) >= 3 and config.is_file() and (tmp_path / "runs" / ".term.lock").is_file()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 143
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, [p.pid for p in alive]
        assert not config.parent.exists()  # the private folder with the unredacted config is removed
    finally:  # a failing test must not leave its sleepers behind
        for p in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        if proc.poll() is None:
            proc.kill()
    assert not (tmp_path / "runs" / ".term.lock").exists()


def test_a_failed_probe_names_itself_and_quotes_the_ranks(tmp_path):
    """``launch.probe.run_probe``, the launch of the book's measuring scripts: a failure is an error naming the
    probe with the ranks' output, before any caller reads a result file."""
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint('probe started')\nsys.exit('no result for you')\n")
    with pytest.raises(RuntimeError, match=r"(?s)my probe failed \(1\):.*no result for you"):
        probe.run_probe("my probe", script, [], 1, timeout=120)
    ok = probe.run_probe("module probe", "smolfsdp.errors", [], 1, timeout=120)  # -m form
    assert ok.returncode == 0


def test_drill_output_as_a_page_prints_it_has_no_machine_path(tmp_path):
    """What the scaling chapter shows of a drill (the launcher's verdict, torchrun's report) names run folders
    relative to the chapter's and the interpreter by its name, never this machine's paths."""
    from smolfsdp.probes.drills import page_text

    said = (
        f"the last complete checkpoint is {tmp_path}/fault_killed/checkpoints/step-000003; resume with: ...\n"
        f"failed (exitcode: -9) local_rank: 1 (pid: 5612) of binary: {sys.executable}"
    )
    out = page_text(said, tmp_path)
    assert str(tmp_path) not in out and sys.executable not in out
    assert "checkpoint is fault_killed/checkpoints/step-000003;" in out and out.endswith(
        f"of binary: {Path(sys.executable).name}"
    )


def test_drills_compare_a_lora_runs_adapter(tmp_path):
    """Issue 43: a LoRA run's final_model/ holds adapter/adapter_model.safetensors, no model.safetensors; the
    resume drill failed looking for the latter after all three of its runs."""
    from safetensors.torch import save_file

    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    for name, value in (("whole", 0.25), ("resumed", 0.5)):
        (tmp_path / name / "final_model" / "adapter").mkdir(parents=True)
        save_file(
            {key: torch.full((8, 128), value)},
            str(tmp_path / name / "final_model/adapter/adapter_model.safetensors"),
        )
    assert drills.max_abs_diff(tmp_path / "whole", tmp_path / "resumed") == (1, 0.25)
    (tmp_path / "empty" / "final_model").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"empty/final_model holds neither model.safetensors nor adapter/"):
        drills.max_abs_diff(tmp_path / "whole", tmp_path / "empty")


def test_drills_refuse_a_run_that_saves_no_final_model_before_running():
    for drill in (lambda c: drills.resume_drill(c, 2), lambda c: drills.kill_rank_drill(c, after_step=2)):
        with pytest.raises(ConfigError, match="compares final models; set save_final_model: true"):
            drill(BASE.replace(lora=True, fsdp_version=2, save_final_model=False))
