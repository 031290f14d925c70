"""Faults and multi-node launch: a rank killed mid-run, elastic restarts, a hung collective, rendezvous.

The runs share one uninterrupted 6-step run (module fixture) whose final parameters the others must equal.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from smolfsdp import checkpoint, drills, launch, sft
from smolfsdp.cli import main as cli_main
from smolfsdp.config import ConfigError, TrainConfig

# 4 rows x 256 tokens per rank: steps long enough (~0.3 s on 2 cores) for the killer to act between them
BASE = TrainConfig(max_steps=6, eval_steps=0, per_device_train_batch_size=4, max_length=256)
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def _assert_same_params(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=atol)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def uninterrupted(runs):
    return sft.run(BASE.replace(name="whole", output_dir=str(runs)), capture=True, timeout=600)


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
        BASE.replace(**changes)


def test_cli_refuses_node_count_that_does_not_divide(capsys):
    assert cli_main(["train", "--nproc", "6", "--nnodes", "4", "--rdzv-endpoint", "n0:29400"]) == 2
    assert "nproc=6 processes cannot be split evenly over nnodes=4" in capsys.readouterr().err


def test_endpoint_that_does_not_answer_fails_naming_it(tmp_path, capsys):
    port = _free_port()  # bound, released: nothing listens there
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
    port = _free_port()
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
        nproc=2, nnodes=2, node_rank=0, rdzv_endpoint=f"127.0.0.1:{_free_port()}", rdzv_timeout_s=5
    )
    cmd = launch.command_for(cfg, ["train"])
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=launch.launch_env(1))
    took = time.monotonic() - t0
    assert out.returncode != 0
    assert "RendezvousTimeoutError" in out.stderr
    assert 5 <= took < 60, took
    # what `smolfsdp train` prints last: the timeout named, not only "torchrun exited with code 1"
    why = launch.explain_failure(out.stdout + out.stderr, out.returncode, cfg)
    assert why.startswith(
        f"run 'smoke' failed: the rendezvous at {cfg.rdzv_endpoint} timed out after 5 s (rdzv_timeout_s): "
        "not all of the nnodes=2 nodes joined; start the same command on every node (node_rank 0..1)"
    ), why
    assert "exited with code" not in why


def test_rendezvous_closed_and_lost_store_are_explained():
    cfg = BASE.replace(nproc=2, nnodes=2, node_rank=1, rdzv_endpoint="node0:29400")
    closed = "raise RendezvousClosedError\ntorch.distributed.elastic.rendezvous.api.RendezvousClosedError\n"
    assert "the rendezvous at node0:29400 was closed by another node" in launch.explain_failure(
        closed, 1, cfg
    )
    lost = (
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store"
    )
    assert "the connection to the rendezvous store at node0:29400 failed" in launch.explain_failure(
        lost, 1, cfg
    )
    assert launch.explain_rendezvous("ChildFailedError", cfg) is None


# ------------------------------------------------------------------ a rank killed mid-run
def test_rank_killed_after_step_3_then_resume_equals_uninterrupted(uninterrupted, runs):
    """SIGKILL rank 1 alone after step 3's checkpoint: the launcher names it; --resume finishes the run."""
    cfg = BASE.replace(name="killed", output_dir=str(runs), save_steps=1, save_total_limit=6)
    killed: dict = {}
    killer = threading.Thread(target=drills.kill_rank_after_step, args=(cfg, 1, 3, killed))
    killer.start()
    proc = launch.launch(cfg, capture=True, timeout=300)
    killer.join()
    assert proc.returncode != 0, "the run finished before it could be killed"
    latest = checkpoint.latest_checkpoint(cfg.run_dir)
    assert latest is not None and 3 <= int(latest.name.split("-")[1]) < 6
    assert not (cfg.run_dir / "final_model").exists()
    failures = launch.parse_failures(proc.stdout)
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
    killer = threading.Thread(target=drills.kill_rank_after_step, args=(cfg, 1, 3, killed))
    killer.start()
    run = sft.run(cfg, capture=True, timeout=600)
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
        name="twonodes", output_dir=str(runs), nnodes=2, rdzv_endpoint=f"127.0.0.1:{_free_port()}"
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
    from smolfsdp.distributed import init_distributed, name_collective_errors
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
        "smolfsdp.distributed.CollectiveError: rank 0 of 2: collective all_reduce (#2 on process group"
        in text
    )
    assert "input sizes [[4]], timeout 3 s) timed out: " in text
    waited = float(text.split("rank 0 waited ")[1].split(" s")[0])
    assert 2.9 <= waited < 10, waited
    assert took < 30, took  # torchrun stopped the sleeping rank instead of waiting its 30 s
    cfg = BASE.replace(output_dir=str(tmp_path))
    line = launch.explain_failure(text, out.returncode, cfg)
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
