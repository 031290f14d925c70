"""Measure, on one GPU, what padding, packing and activation checkpointing cost SmolLM3-3B's training step.

SmolLM3-3B from its bundled config (``data/models/smollm3_3b/config.json``) with random weights (the device
machine has no hub access; speed and memory do not depend on the weights' values), fp32 parameters under
``torch.autocast(bfloat16)`` (what transformers' Trainer runs with ``bf16=True`` on one GPU), SDPA attention,
the loss of ``SmolLM3ForCausalLM`` (fp32 logits), fused AdamW. **One GPU, no FSDP**: no all-gather or
reduce-scatter, so this is the compute part of a step only; the 2-GPU run adds the collectives that
``smolfsdp.estimate.comm`` counts.

Micro-batch shapes, each timed with activation checkpointing off and on (transformers'
``gradient_checkpointing_enable``, non-reentrant, every decoder layer, as the TRL recipe's FSDP checkpointing does):

* ``causal``: 2 rows x 2,048 tokens, every token real, no attention mask (the causal kernel path): the ceiling.
* ``padded``: 2 rows padded to the longer one (2,048 and ``PADDED_SHORT`` tokens), with an attention mask, as
  TRL's collator builds it for unpacked rows.
* ``packed8k``: five rows, 8,192 tokens, packed the same way (micro-batch 4 x 2,048).
* ``packed``: the rows of ``PACKED_ROWS`` (4,096 tokens) flattened into one row with ``position_ids`` reset per
  row and no attention mask, as TRL's padding-free collator builds it; transformers then gives SDPA a
  block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``), so no row attends to another.
  The script checks that on this GPU: the logits of the packed row's last row equal that row run alone.

Per setting: two warm-up micro-batches, then ``--steps`` timed forward + backward passes (CUDA events; median and
spread), the peak allocated and reserved bytes with the gradients held (as under gradient accumulation), and,
once, the fused AdamW step. Writes ``<out>/gpu_throughput.json``; committed under ``data/results/h200/``.

    python3 scripts/gpu_throughput.py --out /tmp/x            # on the GPU machine
    python3 scripts/gpu_throughput.py --out /tmp/x --tiny     # a 2-layer stand-in, any device (a check of the script)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "data" / "models" / "smollm3_3b"
ROW = 2048
PADDED_SHORT = (
    1331  # the shorter row of the padded micro-batch: 65 % of 2,048, so 82.5 % of its tokens are real
)
PACKED_ROWS = (700, 1200, 900, 1296)  # four rows, 4,096 tokens: one packed micro-batch of 2 x 2,048
PACKED8K_ROWS = (1500, 2048, 900, 1800, 1944)  # five rows, 8,192 tokens: micro-batch 4 x 2,048 packed


def build_model(tiny: bool, device: torch.device):
    config = AutoConfig.from_pretrained(CONFIG)
    if tiny:
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 128, 256
        config.num_attention_heads, config.num_key_value_heads, config.vocab_size = 4, 2, 1024
        config.layer_types = config.layer_types[:2]
        config.pad_token_id = config.bos_token_id = config.eos_token_id = 0
        config.no_rope_layers = config.no_rope_layers[:2]
    config._attn_implementation = "sdpa"
    # SmolLM3's config keeps use_cache=True: a training forward would then build a KV cache, and transformers
    # builds the packed rows' block mask only without one (masking_utils: ``cache is None``), so packed rows
    # would attend to each other. Training runs without a cache (TRL passes use_cache=False).
    config.use_cache = False
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model, config


def batches(vocab: int, device: torch.device, scale: float) -> dict[str, dict]:
    """The three micro-batch shapes (``scale`` < 1 shrinks every length for the tiny check)."""
    g = torch.Generator().manual_seed(1)
    row, short = int(ROW * scale), int(PADDED_SHORT * scale)
    packed = [max(2, int(n * scale)) for n in PACKED_ROWS]

    def ids(*shape):
        return torch.randint(0, vocab, shape, generator=g)

    causal = ids(2, row)
    padded = ids(2, row)
    mask = torch.ones(2, row, dtype=torch.long)
    mask[1, short:] = 0
    labels = padded.clone()
    labels[mask == 0] = -100
    packed8k = [max(2, int(n * scale)) for n in PACKED8K_ROWS]

    def flat_rows(lengths):
        flat = ids(1, sum(lengths))
        pos = torch.cat([torch.arange(n) for n in lengths])[None]
        labels = flat.clone()
        labels[pos == 0] = -100  # TRL's padding-free collator: no label across a row boundary
        return {"input_ids": flat, "position_ids": pos, "labels": labels}

    out = {
        "causal": {"input_ids": causal, "labels": causal.clone()},
        "padded": {"input_ids": padded, "attention_mask": mask, "labels": labels},
        "packed": flat_rows(packed),
        "packed8k": flat_rows(packed8k),
    }
    real = {"causal": 2 * row, "padded": row + short, "packed": sum(packed), "packed8k": sum(packed8k)}
    computed = {**real, "padded": 2 * row}
    return (
        {k: {n: t.to(device) for n, t in v.items()} for k, v in out.items()},
        real,
        computed,
        packed,
    )


def timed(fn, device: torch.device) -> float:
    """Seconds ``fn`` takes on the device (CUDA events), or by the wall clock on CPU."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000


def rows_apart(
    model, packed_batch: dict, lengths: list[int], device, bf16: bool = True
) -> tuple[float, float]:
    """Largest |logit| difference between the packed row's last row and that row run alone (bf16 autocast, or
    fp32 with ``bf16=False``), and the largest |logit| of the row alone."""
    n = lengths[-1]
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        packed = model(input_ids=packed_batch["input_ids"], position_ids=packed_batch["position_ids"]).logits
        alone = model(input_ids=packed_batch["input_ids"][:, -n:]).logits
        ref = alone.float().abs().max().item()
    return (packed[:, -n:].float() - alone.float()).abs().max().item(), ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument(
        "--use-cache", action="store_true", help="keep SmolLM3's use_cache=True (shows rows mixing)"
    )
    ap.add_argument("--checks", action="store_true", help="only the rows-apart checks and flex_attention")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t_start = time.time()
    model, config = build_model(args.tiny, device)
    model.config.use_cache = args.use_cache
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    data, real, computed, packed_lengths = batches(config.vocab_size, device, 0.0625 if args.tiny else 1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")

    def micro(batch):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()

    if args.checks:
        return attention_checks(model, data, packed_lengths, device, micro, args)
    micro(data["causal"])  # materialise gradients and AdamW state, then time the step itself
    opt_times = []
    for _ in range(3):
        opt_times.append(timed(opt.step, device))
    diff, ref = rows_apart(model, data["packed"], packed_lengths, device)
    rows = []
    for ac in (False, True):
        if ac:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        for name, batch in data.items():
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            for _ in range(2):
                micro(batch)
            times = [timed(lambda b=batch: micro(b), device) for _ in range(args.steps)]
            row = {
                "batch": name,
                "activation_checkpointing": ac,
                "tokens_computed": computed[name],
                "tokens_real": real[name],
                "seconds": times,
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
            }
            if device.type == "cuda":
                row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            rows.append(row)
            print(
                f"{name:7s} AC {'on ' if ac else 'off'} {row['median_s'] * 1000:8.1f} ms "
                f"({row['min_s'] * 1000:.1f}-{row['max_s'] * 1000:.1f}), "
                f"{computed[name] / row['median_s']:9.0f} tok/s computed, {real[name] / row['median_s']:9.0f} real"
                + (
                    f", peak {row['peak_allocated_bytes'] / 2**30:.2f} GiB alloc, "
                    f"{row['peak_reserved_bytes'] / 2**30:.2f} reserved"
                    if "peak_allocated_bytes" in row
                    else ""
                ),
                flush=True,
            )
    static = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        static = torch.cuda.memory_allocated()
    result = {
        "what": "one GPU, no FSDP: SmolLM3-3B (random weights) forward+backward per micro-batch, fused AdamW step",
        "tiny": args.tiny,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "parameters": n_params,
        "precision": "fp32 parameters, torch.autocast(bfloat16); loss in fp32; AdamW fused",
        "attention": "sdpa",
        "packed_row_lengths": packed_lengths,
        "rows_apart_max_abs_logit_diff": diff,
        "rows_apart_max_abs_logit": ref,
        "optimizer_step_s": opt_times,
        "allocated_after_bytes": static,
        "rows": rows,
        "wall_s": time.time() - t_start,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_throughput.json").write_text(json.dumps(result, indent=1))
    print(
        f"rows apart: max |packed - alone| logit {diff:.4g} (max |logit| {ref:.4g}); wall {result['wall_s']:.0f} s"
    )


def attention_checks(model, data, lengths, device, micro, args) -> None:
    """Rows apart in fp32 (the kernels' rounding aside, packed == alone), in bf16, and with the KV cache on (which
    turns transformers' packed-row mask off: rows mix); then flex_attention on the packed micro-batch."""
    res = {}
    for label, bf16, cache in (
        ("fp32", False, False),
        ("bf16", True, False),
        ("fp32_use_cache", False, True),
    ):
        model.config.use_cache = cache
        res[label] = rows_apart(model, data["packed"], lengths, device, bf16=bf16)
        print(
            f"rows apart {label}: max |packed - alone| {res[label][0]:.4g} (max |logit| {res[label][1]:.4g})",
            flush=True,
        )
    model.config.use_cache = False
    flex = {}
    try:
        t0 = time.time()
        model.set_attn_implementation("flex_attention")
        flex["rows_apart_fp32"] = rows_apart(model, data["packed"], lengths, device, bf16=False)
        for ac in (False, True):
            if ac:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            for _ in range(2):
                micro(data["packed"])
            times = [timed(lambda: micro(data["packed"]), device) for _ in range(args.steps)]
            flex[f"packed_ac_{'on' if ac else 'off'}_s"] = times
            print(f"flex_attention packed AC {ac}: {statistics.median(times) * 1000:.1f} ms", flush=True)
        flex["wall_s"] = time.time() - t0
    except Exception as err:  # noqa: BLE001 - recorded: which step failed and why
        flex["error"] = f"{type(err).__name__}: {err}"[:500]
        print("flex_attention:", flex["error"], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "packed_row_lengths": lengths,
        "rows_apart": {k: {"max_abs_diff": v[0], "max_abs_logit": v[1]} for k, v in res.items()},
        "flex_attention": flex,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    (out / "gpu_attention_checks.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
