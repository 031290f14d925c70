"""smolfsdp.estimate.comm, cluster and scaling: byte counts by hand, the ring factor, overlap, bad input, and real traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from smolfsdp.errors import ConfigError
from smolfsdp.estimate import cluster, comm, scaling
from smolfsdp.estimate.params import count_parameters, resolve_model_config
from smolfsdp.traces import collective_sizes as comm_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _layer_shapes(c):
    """(dim0, numel) of one SmolLM3 decoder layer's parameters, written out from the config."""
    h, f = c.hidden_size, c.intermediate_size
    kv = c.num_key_value_heads * (getattr(c, "head_dim", None) or h // c.num_attention_heads)
    return [
        (h, h * h),
        (kv, kv * h),
        (kv, kv * h),
        (h, h * h),
        (f, f * h),
        (f, f * h),
        (h, h * f),
        (h, h),
        (h, h),
    ]


def test_ring_factor():
    assert cluster.ring_factor("all-gather", 8) == 7 / 8
    assert cluster.ring_factor("reduce-scatter", 2) == 0.5
    assert cluster.ring_factor("all-reduce", 4) == 1.5
    assert cluster.ring_factor("all-reduce", 1) == 0.0


def test_tiny_full_shard_bytes_by_hand():
    c = resolve_model_config("tiny")
    layer = sum(n for _, n in _layer_shapes(c))
    root = c.vocab_size * c.hidden_size + c.hidden_size  # embedding (tied lm_head once) + final norm
    L = c.num_hidden_layers
    df = comm.estimate_collectives("tiny", n_gpus=2, fsdp_version=2, mixed_precision="bf16")
    b = comm.step_bytes(df)
    # FSDP2 FULL_SHARD: forward all-gathers root + L layers, backward the L layers again (the root stays
    # gathered from forward, apply_fsdp2's default), in bf16; reduce-scatter of everything in fp32
    assert b.loc["all-gather", "count"] == 2 * L + 1
    assert b.loc["all-gather", "logical_bytes"] == (root + 2 * L * layer) * 2
    assert b.loc["reduce-scatter", "logical_bytes"] == (root + L * layer) * 4
    assert b.loc["all-gather", "sent_bytes"] == b.loc["all-gather", "logical_bytes"] / 2  # (n-1)/n
    # FSDP1 keeps the root gathered for backward: one all-gather fewer
    b1 = comm.step_bytes(comm.estimate_collectives("tiny", n_gpus=2, fsdp_version=1, mixed_precision="bf16"))
    assert b1.loc["all-gather", "count"] == 2 * L + 1
    # ZeRO-2 never re-gathers; gradient accumulation x3 without no_sync triples everything
    z2 = comm.step_bytes(
        comm.estimate_collectives("tiny", strategy="SHARD_GRAD_OP", gradient_accumulation_steps=3)
    )
    assert z2.loc["all-gather", "count"] == 3 * (L + 1) and z2.loc["reduce-scatter", "count"] == 3 * (L + 1)
    ns = comm.step_bytes(comm.estimate_collectives("tiny", gradient_accumulation_steps=3, no_sync=True))
    assert ns.loc["reduce-scatter", "count"] == L + 1 and ns.loc["all-gather", "count"] == 3 * (2 * L + 1)


def test_padding_by_hand_three_ranks():
    c = resolve_model_config("tiny")
    n, L = 3, c.num_hidden_layers
    shapes = _layer_shapes(c)
    fsdp2_layer = sum(-(-d0 // n) * n * (numel // d0) for d0, numel in shapes)  # dim 0 padded per parameter
    real = sum(numel for _, numel in shapes)
    df = comm.estimate_collectives("tiny", n_gpus=n, fsdp_version=2, mixed_precision="no")
    row = df[(df["unit"] == "model.layers.0") & (df["kind"] == "reduce-scatter")].iloc[0]
    assert (row["numel"], row["numel_unpadded"]) == (fsdp2_layer, real)
    assert fsdp2_layer > real
    # FSDP1 fp32, use_orig_params: every parameter starts at a multiple of 4 elements (16 bytes), the
    # FlatParameter is padded to a multiple of 3
    end = 0
    for _, numel in shapes:
        end = -(-end // 4) * 4 + numel
    df1 = comm.estimate_collectives("tiny", n_gpus=n, fsdp_version=1, mixed_precision="no")
    row1 = df1[(df1["unit"] == "model.layers.0") & (df1["kind"] == "all-gather")].iloc[0]
    assert row1["numel"] == -(-end // n) * n
    root_end = -(-(c.vocab_size * c.hidden_size) // 4) * 4 + c.hidden_size
    root_pad = -(-root_end // n) * n - (c.vocab_size * c.hidden_size + c.hidden_size)
    # forward gathers root + L layers, backward L layers (FSDP1 keeps the root), fp32
    expected = (2 * L * (row1["numel"] - real) + root_pad) * 4
    assert comm.step_bytes(df1).loc["all-gather", "padding_bytes"] == expected


def test_ddp_and_hsdp_collectives():
    counts = resolve_model_config("smollm3-3b")
    total = 3_075_098_624
    ddp = comm.estimate_collectives(counts, strategy="DDP", n_gpus=8, mixed_precision="bf16")
    buckets = -(-total * 4 // (25 * 2**20))  # fp32 gradients in 25 MiB buckets
    assert ddp["count"].sum() == buckets
    assert ddp["numel"].iloc[0] * buckets >= total
    hsdp = comm.estimate_collectives(counts, strategy="HSDP", cluster=cluster.build_cluster(32))
    ar = hsdp[hsdp["kind"] == "all-reduce"]
    rs = hsdp[hsdp["kind"] == "reduce-scatter"]
    assert set(ar["group_size"]) == {4} and set(rs["group_size"]) == {8}
    assert (ar["numel"].to_numpy() * 8 == rs["numel"].to_numpy()).all()  # the shard, all-reduced over 4 nodes
    assert set(ar["link"]) == {"network"} and set(rs["link"]) == {"nvlink"}


def test_step_time_by_hand():
    cl = cluster.build_cluster(8, "H100 SXM")
    st = scaling.estimate_step("smollm3-3b", cluster=cl, seq_len=4096, mfu=0.4, latency=False)
    fpt = 6 * 3_075_098_624 + 12 * 36 * 16 * 128 * 4096  # PaLM: 6N + 12 L H Q T
    compute = 4096 * fpt / (989e12 * 0.4)
    root = 128256 * 2048 + 2048
    first = 7 / 8 * root * 2 / 450e9  # root all-gather, bf16, NVLink 450 GB/s
    last = 7 / 8 * root * 4 / 450e9  # root reduce-scatter, fp32
    assert st["compute_s"] == pytest.approx(compute, rel=1e-12)
    # inside one node all other communication hides behind compute: only the first gather and last reduce show
    assert st["step_s"] == pytest.approx(compute + first + last, rel=1e-9)
    assert st["efficiency"] == pytest.approx(compute / (compute + first + last), rel=1e-9)
    one = scaling.estimate_step("smollm3-3b", n_gpus=1)
    assert one["comm_s"] == 0 and one["efficiency"] == 1.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: cluster.build_cluster(24, nodes=5), "does not divide"),
        (lambda: cluster.build_cluster(0), "n_gpus=0"),
        (lambda: cluster.build_cluster(12, gpus_per_node=8), "whole nodes"),
        (lambda: cluster.build_cluster(8, "H100"), "did you mean"),
        (lambda: cluster.build_cluster(8, network="NDR"), "Unknown network"),
        (
            lambda: comm.estimate_collectives("tiny", strategy="HSDP", n_gpus=8, shard_size=3),
            "does not multiply",
        ),
        (lambda: comm.estimate_collectives("tiny", strategy="FULL_SHRD"), "did you mean"),
        (lambda: scaling.estimate_step("tiny", mfu=0), "mfu=0"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


@pytest.mark.parametrize("version, precision", [(1, "no"), (2, "bf16")])
def test_model_equals_smoke_trace(tmp_path, version, precision):
    """A profiled 2-rank smoke step (gloo, record_shapes): the model's collectives per step equal the trace's."""
    from smolfsdp.config import load_config
    from smolfsdp.launch import runner
    from smolfsdp.paths import recipe

    cfg = load_config(
        recipe("smoke"), name=f"comm{version}", output_dir=str(tmp_path), fsdp_version=version,
        mixed_precision=precision, benchmark_steps=2, benchmark_warmup_steps=0, profile=True,
        profile_wait=0, profile_warmup=1, profile_active=1, record_shapes=True, eval_size=0,
    )  # fmt: skip
    runner.run(cfg, capture=True)
    model = comm.step_bytes(
        comm.estimate_collectives(
            "tiny",
            n_gpus=2,
            fsdp_version=version,
            mixed_precision=precision,
            include_loop=True,
            # smolfsdp.sharding.fsdp2.apply_fsdp2 keeps the FSDP2 root gathered after forward (as FSDP1 does)
            root_reshard_after_forward=False,
        )
    )
    for rank in (0, 1):
        trace = comm_trace.trace_step_bytes(tmp_path / cfg.name / "traces" / f"rank{rank}.json.gz")
        assert trace["count"].to_dict() == model["count"].to_dict()
        assert trace["numel_total"].to_dict() == model["numel_total"].to_dict()
        typed = trace["logical_bytes"].dropna()  # gloo's TensorList arguments carry no dtype
        assert "reduce-scatter" in typed
        assert typed.to_dict() == model.loc[typed.index, "logical_bytes"].to_dict()


@pytest.mark.skipif(not (SHARED / "ddp_2rank_a100_rank0.json.gz").is_file(), reason="needs ../shared/traces")
def test_nccl_trace_record_param_comms():
    df = comm_trace.trace_collectives(SHARED / "ddp_2rank_a100_rank0.json.gz")
    per_step = df[df["step"] >= 0].groupby(["step", "kind"])["numel"].sum().unstack()
    # DDP on 2 A100s: every step all-reduces the same gradient elements (25,557,032, in fp32) in buckets
    assert set(per_step["all-reduce"]) == {25_557_032}
    assert set(df.loc[df["kind"] == "all-reduce", "itemsize"]) == {4}
    assert set(df["group_size"]) == {2}


# ------------------------------------------------------------- inputs the API accepts or refuses
def test_scaling_table_takes_a_single_model_strategy_and_count():
    one = scaling.scaling_table("tiny", "FULL_SHARD", 4, seq_len=128)
    listed = scaling.scaling_table(["tiny"], ["FULL_SHARD"], [4], seq_len=128)
    assert (
        list(one["model"]) == ["tiny"]
        and list(one["n_gpus"]) == [4]
        and list(one["strategy"]) == ["FULL_SHARD"]
    )
    assert one.equals(listed)
    cfg = scaling.scaling_table(resolve_model_config("tiny"), "FULL_SHARD", 4, seq_len=128)
    assert cfg["step_s"].tolist() == one["step_s"].tolist()


def test_estimate_step_builds_the_cluster_from_gpu_and_gpus_per_node():
    cl = cluster.build_cluster(16, "A100 80GB", gpus_per_node=4, network="InfiniBand HDR 200 Gb/s")
    kw = dict(gpu="A100 80GB", gpus_per_node=4, network="InfiniBand HDR 200 Gb/s")
    by_kw = scaling.estimate_step("tiny", n_gpus=16, seq_len=128, **kw)
    assert by_kw == scaling.estimate_step("tiny", cluster=cl, seq_len=128)
    assert (by_kw["n_gpus"], by_kw["nodes"]) == (16, 4)
    coll = comm.estimate_collectives("tiny", n_gpus=16, **kw)
    assert coll.equals(comm.estimate_collectives("tiny", cluster=cl))
    # FULL_SHARD over 16 GPUs in nodes of 4 crosses the network: HDR's 25 GB/s per GPU, not NVLink's 300
    assert set(coll["bus_gbs"]) == {25.0} and set(coll["link"]) == {"network"}
    # the same on 4 GPUs stays in one node
    assert set(comm.estimate_collectives("tiny", n_gpus=4, **kw)["bus_gbs"]) == {300.0}


def test_recipe_sets_the_communication_dtypes():
    assert scaling.recipe_dtypes("fp32") == {"mixed_precision": "no", "reduce_dtype": "fp32"}
    assert scaling.recipe_dtypes("hf-fsdp-bf16") == {"mixed_precision": "bf16", "reduce_dtype": "fp32"}
    assert scaling.recipe_dtypes("pure-bf16") == {"mixed_precision": "bf16", "reduce_dtype": "bf16"}
    c = resolve_model_config("tiny")
    layer = sum(n for _, n in _layer_shapes(c))
    root = c.vocab_size * c.hidden_size + c.hidden_size
    params = root + c.num_hidden_layers * layer  # 4 ranks: no padding
    gathered = params + c.num_hidden_layers * layer  # the root is not re-gathered for backward
    args = dict(models="tiny", strategies="FULL_SHARD", n_gpus=4, seq_len=128)
    # FSDP2 FULL_SHARD gathers the layers twice, the root once (kept from forward), reduce-scatters once
    fp32 = scaling.scaling_table(recipe="fp32", **args)
    assert fp32["logical_bytes"].iloc[0] == gathered * 4 + params * 4
    bf16 = scaling.scaling_table(recipe="hf-fsdp-bf16", **args)
    assert bf16["logical_bytes"].iloc[0] == gathered * 2 + params * 4
    pure = scaling.scaling_table(recipe="pure-bf16", **args)
    assert pure["logical_bytes"].iloc[0] == gathered * 2 + params * 2
    assert "fp32 all-gathers, fp32 reductions" in fp32.attrs["assumptions"]


def test_get_gpu_suggests_names_that_contain_the_query():
    with pytest.raises(ConfigError, match=r"did you mean 'A100 40GB' or 'A100 80GB'\?"):
        cluster.build_cluster(8, "a100")
    with pytest.raises(ConfigError, match=r"did you mean 'InfiniBand NDR 400 Gb/s'\?"):
        cluster.build_cluster(8, network="ndr")
    assert cluster.build_cluster(8, "h100sxm").gpu.name == "H100 SXM"


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: scaling.estimate_step(n_gpus=64, cluster=cluster.build_cluster(8)),
            "n_gpus=64 but cluster has 8",
        ),
        (lambda: comm.estimate_collectives(n_gpus=4, cluster=cluster.build_cluster(8)), "drop n_gpus"),
        (
            lambda: scaling.estimate_step(cluster=cluster.build_cluster(8), gpu="H200"),
            "cluster= and gpu= both",
        ),
        (lambda: scaling.estimate_step(cluster=8), "not a cluster.Cluster"),
        (lambda: scaling.estimate_step(n_gpus=2.5), r"n_gpus=2.5: give a whole number"),
        (lambda: cluster.build_cluster(16, gpus_per_node=7.5), "gpus_per_node=7.5"),
        (lambda: comm.estimate_collectives("tiny", gradient_accumulation_steps=1.5), "whole number"),
        (lambda: comm.estimate_collectives("tiny", strategy="HSDP", n_gpus=8, shard_size=0), "shard_size=0"),
        (
            lambda: scaling.scaling_table("tiny", mixed_precision="no"),
            r"contradicts recipe='hf-fsdp-bf16'.*'fp32'",
        ),
        (
            lambda: scaling.scaling_table("tiny", recipe="fp32", reduce_dtype="bf16"),
            "contradicts recipe='fp32'",
        ),
        (
            lambda: scaling.scaling_table("tiny", cluster=cluster.build_cluster(8)),
            "one cluster per GPU count",
        ),
        (lambda: scaling.scaling_table([], seq_len=128), "models is empty"),
        # the cluster keywords are listed once (cluster.CLUSTER_KEYS); a misspelt one names the nearest
        (lambda: scaling.estimate_step("tiny", seq_len=128, gpus_per_nod=4), "did you mean 'gpus_per_node'"),
        (lambda: comm.estimate_collectives("tiny", netwrk="NDR"), "did you mean 'network'"),
    ],
)
def test_bad_api_input(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


def test_ddp_with_accumulation_all_reduces_the_gradients_once_per_step():
    """DDP is modelled as it is run: under gradient accumulation ``no_sync()`` on all but the last micro-batch,
    so one optimizer step all-reduces every gradient exactly once (fp32, 25 MiB buckets); syncing every
    micro-batch (``no_sync=False``) is the k-fold cost shown beside it."""
    total = count_parameters(resolve_model_config("smollm3-3b")).total
    one = comm.estimate_collectives("smollm3-3b", strategy="DDP", n_gpus=16, gradient_accumulation_steps=1)
    acc = comm.estimate_collectives("smollm3-3b", strategy="DDP", n_gpus=16, gradient_accumulation_steps=8)
    b, b1 = comm.step_bytes(acc), comm.step_bytes(one)
    assert list(b.index) == ["all-reduce"] and acc.attrs["reductions_per_step"] == 1
    buckets = -(-total * 4 // comm.DDP_BUCKET_BYTES)
    assert b.loc["all-reduce", "count"] == buckets
    assert (
        b.loc["all-reduce", "numel_total"] == buckets * -(-total // buckets) >= total
    )  # every gradient once
    assert b.loc["all-reduce", "numel_total"] - total < buckets  # (buckets of equal size, rounded up)
    assert b.loc["all-reduce", "logical_bytes"] == b1.loc["all-reduce", "logical_bytes"]
    assert b.loc["all-reduce", "sent_bytes"] == pytest.approx(
        2 * 15 / 16 * b.loc["all-reduce", "logical_bytes"]
    )
    every = comm.step_bytes(
        comm.estimate_collectives(
            "smollm3-3b", strategy="DDP", n_gpus=16, gradient_accumulation_steps=8, no_sync=False
        )
    )
    assert every.loc["all-reduce", "logical_bytes"] == 8 * b.loc["all-reduce", "logical_bytes"]
    # FSDP keeps its default: a reduce-scatter per unit per micro-batch
    fs = comm.estimate_collectives("tiny", n_gpus=2, gradient_accumulation_steps=3)
    assert fs.attrs["reductions_per_step"] == 3
