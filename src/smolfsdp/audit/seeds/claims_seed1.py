"""Seed 1's claims that the estimator and the installed libraries' source settle (no launch needed).

Seed 1 is a blog post fine-tuning SmolLM3-3B on medical questions with TRL's ``SFTTrainer`` and FSDP1 on two
GPUs. Used by ``smolfsdp.audit.seeds.claims`` (chapter "What the seeds say, and what we measured"); the claims
that need a run on 2 ranks are in ``claims_runs``. Every claim is in the book's words.

    python -c "from smolfsdp.audit.seeds.claims_seed1 import batch_size_lever as f; print(f().evidence_text)"
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

from smolfsdp.audit.seeds.claims_core import GB, SEED1, Judgement, book_recipe_kwargs, gb, gib
from smolfsdp.audit.seeds.installed_stack import source_line, trainer_fsdp_view
from smolfsdp.estimate.hardware import GPUS, fits
from smolfsdp.estimate.memory import RECIPES
from smolfsdp.estimate.params import count_parameters, resolve_model_config
from smolfsdp.estimate.recipe_peak import LOSS_WORDS, moment_words, recipe_peak, recipe_settings
from smolfsdp.paths import repo_root
from smolfsdp.traces import analysis as trace_analysis
from smolfsdp.traces.seed_reading import exposed_share

MEMORY, BATCH, CONFIG, GOTCHA2, GOTCHA3, TRACE = (
    "§2 where the memory goes", "§2 warning: batch size", "§4 configuring FSDP in the Trainer",
    "§5.2 gotcha 2: the checkpoint fills the disk", "§5.3 gotcha 3: metrics in the wrong place",
    "§6.1 reading the profiler trace",
)  # fmt: skip
#: the seed's ``fsdp_config`` keys and values as it writes them (with ``fsdp="full_shard auto_wrap"``)
SEED_FSDP_CONFIG = {
    "fsdp_version": 1,
    "fsdp_transformer_layer_cls_to_wrap": ["SmolLM3DecoderLayer"],
    "fsdp_backward_prefetch": "backward_pre",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    "fsdp_offload_params": False,
}
SEED_FSDP_ARG = "full_shard auto_wrap"


def _params() -> int:
    return count_parameters(resolve_model_config("smollm3-3b")).total


def bf16_weights() -> Judgement:
    n = _params()
    return Judgement(
        "bf16_weights", SEED1, "§1 introduction", "weights of a 3B model",
        "SmolLM3-3B's weights take about 6 GB in bf16.",
        "holds" if abs(2 * n / (6 * GB) - 1) < 0.1 else "wrong",
        [f"SmolLM3-3B has {n:,} parameters (counted from its config); at 2 bytes each that is {gb(2 * n)}."],
        f"{gb(2 * n)} ({gib(2 * n)}); the point of the seed stands: the weights are the small part of training.",
        {"params": n, "bf16_bytes": 2 * n},
    )  # fmt: skip


def bytes_per_param() -> Judgement:
    seed, ours = RECIPES["seed-table"], RECIPES["hf-fsdp-bf16"]
    where = source_line("accelerate.accelerator", "param.data = param.data.to(torch.float32)  # upcasting")
    where2 = source_line("accelerate.utils.fsdp_utils", "param.data = param.data.to(torch.float32)")
    return Judgement(
        "bytes_per_param", SEED1, MEMORY, "bytes per parameter",
        f"Full fine-tuning with AdamW in mixed precision costs {seed.trainable_bytes} bytes per parameter: "
        "2 for bf16 weights, 2 for bf16 gradients, 8 for fp32 Adam m and v.",
        "holds" if ours.trainable_bytes == seed.trainable_bytes else "wrong on this stack",
        [f"The Trainer's recipe keeps {ours.param_bytes} + {ours.grad_bytes} + 2 x {ours.state_bytes} = "
         f"{ours.trainable_bytes} bytes per parameter (`RECIPES['hf-fsdp-bf16']`). With mixed precision on, "
         f"accelerate up-casts every trainable low-precision parameter to fp32 before the optimizer sees it "
         f"({where} for FSDP1, {where2} for FSDP2), as DeepSpeed does: the sharded weights are the fp32 "
         "master copy and FSDP casts only the gathered unit to bf16. The memory chapter measures it."],
        f"{ours.trainable_bytes} bytes per parameter, not {seed.trainable_bytes}: fp32 weights (which are the "
        "master copy), fp32 gradients, fp32 m and v. The 12 would need bf16 weights with fp32 Adam state and "
        "no master copy, which no torch FSDP recipe does.",
        {"seed": seed.trainable_bytes, "ours": ours.trainable_bytes, "accelerate_fsdp1": where, "accelerate_fsdp2": where2},
    )  # fmt: skip


def full_model_memory() -> Judgement:
    n = _params()
    kw = book_recipe_kwargs()
    peak = recipe_peak(include="device", world_size=1, strategy="NO_SHARD")
    one = peak.estimate
    seed = n * RECIPES["seed-table"].trainable_bytes
    return Judgement(
        "full_model_memory", SEED1, MEMORY, "memory of a 3B full fine-tune",
        "SmolLM3-3B needs about 36 GB for weights, gradients and optimizer state, and 36-42 GB is the number "
        "to plan for once activations are added.",
        "holds" if peak.bytes <= 42 * GB else "wrong",
        [f"SmolLM3-3B has {n:,} parameters. At the seed's 12 bytes that is {gb(seed)}; at the 16 bytes the "
         f"Trainer keeps, the estimator's static memory on one GPU is {gib(one.static_bytes)} "
         f"({gb(one.static_bytes)}), and the peak of one step of the book's recipe ({kw['micro_batch']} x "
         f"{kw['seq_len']:,} tokens, activation checkpointing) adds activations and buffers: "
         f"{gib(peak.bytes)} ({gb(peak.bytes)}) at {moment_words(peak.moment)}; settings: {peak.settings_line}."],
        f"About {gib(one.static_bytes)} before a single activation, {gib(peak.bytes)} at the step's peak: "
        "above the seed's whole 36-42 GB range.",
        {"params": n, "seed_bytes": seed, "static_bytes": one.static_bytes, "peak_bytes": peak.bytes},
        memory=True,
    )  # fmt: skip


def per_gpu_memory() -> Judgement:
    peak = recipe_peak(include="device", world_size=2, strategy="FULL_SHARD")
    two = peak.estimate
    seed = _params() * RECIPES["seed-table"].trainable_bytes // 2
    return Judgement(
        "per_gpu_memory", SEED1, "§3 what FSDP does", "memory per GPU, FULL_SHARD over 2",
        "Sharded over two GPUs, each GPU holds about 18 GB.",
        "holds" if abs(peak.bytes / (18 * GB) - 1) < 0.15 else "wrong",
        [f"The seed halves its 12-byte total ({gb(seed)}). The estimator, for the book's recipe on 2 GPUs with "
         f"FULL_SHARD, gives {gib(two.static_bytes)} of sharded state per GPU and a peak of {gib(peak.bytes)} "
         f"at {moment_words(peak.moment)} once the gathered units, gradient buffers, activations, the loss's tensors, CUDA "
         f"context and NCCL buffers are added; settings: {peak.settings_line}."],
        f"{gib(two.static_bytes)} static and {gib(peak.bytes)} peak per GPU. On the fit table's cards: "
        + ", ".join(f"{g} {'fits' if fits(two, GPUS[g]) else 'does not fit'}" for g in ("A10G", "L40S", "A100 40GB"))
        + ".",
        {"seed_bytes": seed, "static_bytes": two.static_bytes, "peak_bytes": peak.bytes},
        memory=True,
    )  # fmt: skip


#: the seed's fit table: (GPU, setting) -> what the seed says (True: fits)
SEED_FIT = {("A10G", 1): False, ("A10G", 2): True, ("A100 40GB", 1): False, ("A100 40GB", 2): True,
            ("L40S", 1): True, ("L40S", 2): True, ("A100 80GB", 1): True, ("A100 80GB", 2): True}  # fmt: skip


def fit_table_rows() -> Judgement:
    kw = book_recipe_kwargs()
    peaks = {
        w: recipe_peak(include="device", world_size=w, strategy=s)
        for w, s in ((1, "NO_SHARD"), (2, "FULL_SHARD"))
    }
    est = {w: p.estimate for w, p in peaks.items()}
    ours = {(g, w): fits(est[w], GPUS[g]) for g, w in SEED_FIT}
    flipped = [k for k in SEED_FIT if SEED_FIT[k] != ours[k]]
    label = {1: "a full copy on 1", 2: "FULL_SHARD over 2"}
    text = "; ".join(
        f"{g}, {label[w]}: peak {gib(peaks[w].bytes)} against {gib(GPUS[g].memory_bytes)}, "
        f"{'fits' if ours[(g, w)] else 'does not fit'} (the seed: {'fits' if SEED_FIT[(g, w)] else 'does not'})"
        for g, w in SEED_FIT
    )
    return Judgement(
        "fit_table", SEED1, "§2.1 the single-GPU replica", "the GPU fit table",
        "Two A10Gs (24 GB) can fine-tune SmolLM3-3B with FSDP, one A100 40GB cannot hold a full copy, one L40S "
        "(48 GB) can, and one A100 80GB can with room.",
        "wrong" if len(flipped) > len(SEED_FIT) // 2 else "partly",
        [f"For the book's recipe ({kw['micro_batch']} x {kw['seq_len']:,} tokens, activation checkpointing): "
         f"{text}. {len(flipped)} of {len(SEED_FIT)} cells flip. Settings of the 2-GPU peak: "
         f"{peaks[2].settings_line}."],
        "Both rows flip. Two A10Gs need CPU offload or more GPUs; one L40S needs sharding (2 x L40S with "
        "FULL_SHARD fits). The interactive fit figure in the memory chapter shows every row."
        if {("A10G", 2), ("L40S", 1)} <= set(flipped) else
        "The cells that flip: " + ", ".join(f"{g} {label[w]}" for g, w in flipped) + ".",
        {f"{g}, {label[w]}": {"gpu": g, "peak_bytes": peaks[w].bytes, "fits": ours[(g, w)],
                              "seed_fits": SEED_FIT[(g, w)]} for g, w in SEED_FIT},
        memory=True,
    )  # fmt: skip


def batch_size_lever() -> Judgement:
    kw = book_recipe_kwargs()
    rows = {}
    for seq in (2048, 4096, 8192):
        p2, p1 = (recipe_peak(include="device", world_size=2, strategy="FULL_SHARD", seq_len=seq, micro_batch=mb)
                  for mb in (kw["micro_batch"], 1))  # fmt: skip
        two = p2.estimate
        rows[seq] = {"static_bytes": two.static_bytes, "batch_bytes": two.activations_bytes + two.logits_bytes,
                     "peak_bytes": p2.bytes, "peak_micro_batch_1": p1.bytes}  # fmt: skip
    share = {s: r["batch_bytes"] / r["peak_bytes"] for s, r in rows.items()}
    text = "; ".join(
        f"{s:,} tokens: {gib(r['batch_bytes'])} of a {gib(r['peak_bytes'])} peak ({share[s]:.0%}) scales with "
        f"the batch, and micro-batch 1 brings the peak to {gib(r['peak_micro_batch_1'])}"
        for s, r in rows.items()
    )
    hf = [recipe_peak(include="device", seq_len=8192, loss_path="transformers", micro_batch=mb)
          for mb in (kw["micro_batch"], 1)]  # the same 8k run with transformers' own loss  # fmt: skip
    r8 = rows[8192]
    saved = {"TRL": r8["peak_bytes"] - r8["peak_micro_batch_1"], "hf": hf[0].bytes - hf[1].bytes}
    holds = max(share.values()) < 0.25
    return Judgement(
        "batch_size_lever", SEED1, BATCH, "batch size as a memory lever",
        "Batch size moves only activation memory, the small part, so when a run runs out of memory sharding "
        "is the fix and a smaller batch is not.",
        "holds" if holds else "partly",
        [f"The estimator, the book's recipe on 2 GPUs with FULL_SHARD, micro-batch {kw['micro_batch']} and "
         f"{LOSS_WORDS[recipe_settings()['loss_path']]}, counting activations and logits as what "
         f"scales with the batch: {text}. The sharded state ({gib(rows[2048]['static_bytes'])}) does not move "
         f"with the batch. With transformers' own loss (the native engine, whose output holds the logits) the "
         f"same 8,192-token run saves {gib(saved['hf'])} at micro-batch 1 (peak {gib(hf[0].bytes)})."],
        f"{'True' if holds else 'True for the static state, and at short sequences'} for the seed's own trainer: "
        f"TRL's SFTTrainer (1.16) scores the LM head in tiles and never makes the [tokens, vocab] logits, so up "
        f"to 8,192 tokens micro-batch 1 saves only {gib(saved['TRL'])}. It depends on that loss: where the logits "
        f"are made (transformers' own loss, the native engine) they grow with tokens per GPU, and at 8,192 tokens "
        f"micro-batch 1 saves {gib(saved['hf'])}. Shard first when the static state does not fit; when it does, "
        "micro-batch and sequence length are a lever in proportion to what the loss makes per token (with "
        "gradient accumulation to keep the global batch).",
        {str(s): r for s, r in rows.items()},
    )  # fmt: skip


def static_divides() -> Judgement:
    peaks = {w: recipe_peak(include="device", world_size=w, strategy="FULL_SHARD" if w > 1 else "NO_SHARD")
             for w in (1, 2, 4)}  # fmt: skip
    est = {w: p.estimate for w, p in peaks.items()}
    text = "; ".join(f"{w} GPU{'s' if w > 1 else ''}: static {gib(e.static_bytes)}, peak {gib(peaks[w].bytes)}"
                     for w, e in est.items())  # fmt: skip
    return Judgement(
        "static_divides", SEED1, "§7 recommendations", "what sharding divides",
        "FULL_SHARD divides the static memory (weights, gradients, optimizer state) by the number of GPUs.",
        "holds" if all(abs(w * e.static_bytes / est[1].static_bytes - 1) < 0.01 for w, e in est.items()) else "wrong",
        [f"The estimator, the book's recipe: {text}. The static part falls as 1/N (up to FSDP1's padding of the "
         "flat shards); the peak falls less, because activations, the loss's tensors, the gathered units and the CUDA "
         "context are per GPU and do not shard."],
        "Right for the static state. Plan with the peak, which does not halve when the GPUs double.",
        {str(w): {"static_bytes": e.static_bytes, "peak_bytes": peaks[w].bytes} for w, e in est.items()},
    )  # fmt: skip


def gpu_memory_order() -> Judgement:
    a100, l40s = GPUS["A100 40GB"].memory_bytes, GPUS["L40S"].memory_bytes
    return Judgement(
        "gpu_memory_order", SEED1, "§8 lessons", "a newer name is not more memory",
        "An A100 40GB has less memory than an L40S 48GB: check the memory, not the model name.",
        "holds" if a100 < l40s else "wrong",
        [f"`smolfsdp.estimate.hardware.GPUS` (from the vendors' datasheets): A100 40GB {gib(a100)}, L40S "
         f"{gib(l40s)}."],
        "None needed; the fit table in the memory chapter lists every card the book knows.",
        {"a100_40_bytes": a100, "l40s_bytes": l40s},
    )  # fmt: skip


def fsdp_config_as_written() -> Judgement:
    args, warnings = trainer_fsdp_view(SEED_FSDP_CONFIG, SEED_FSDP_ARG)
    offload, _ = trainer_fsdp_view({**SEED_FSDP_CONFIG, "fsdp_offload_params": True}, SEED_FSDP_ARG)
    strip = source_line("transformers.training_args", "self.fsdp_config[k[5:]] = self.fsdp_config.pop(k)")
    landed = {
        "fsdp_version": args.get("fsdp_version"),
        "fsdp_transformer_layer_cls_to_wrap": args.get("transformer_cls_names_to_wrap"),
        "fsdp_backward_prefetch": args.get("backward_prefetch"),
        "fsdp_state_dict_type": args.get("state_dict_type"),
        "fsdp_offload_params": "cpu_offload" in offload,
    }
    said = "; ".join(f"`{k}` -> {v!r}" for k, v in landed.items())
    dep = [w.split(". ")[0].rstrip(".") for w in warnings if "deprecated" in w]
    return Judgement(
        "fsdp_config_as_written", SEED1, CONFIG, "the seed's fsdp_config, key by key",
        f"The Trainer is configured with `fsdp=\"{SEED_FSDP_ARG}\"` and five `fsdp_*` keys: FSDP version 1, the "
        "SmolLM3 decoder layer as wrap class, backward prefetch, sharded state dicts, parameter offload off.",
        "holds" if landed["fsdp_offload_params"] and not dep else "partly",
        [f"Built by the installed TrainingArguments: transformers strips the `fsdp_` prefix ({strip}); what "
         f"reached accelerate's plugin arguments: {said} (the last one with the key set to true). It logs: "
         + " / ".join(f"\"{d}.\"" for d in dep)],
        "Four of the five keys work. `fsdp_offload_params` is read by nothing (write `cpu_offload`); the string "
        "form of `fsdp` and FSDP1 itself are deprecated: write `fsdp=True` and put everything in `fsdp_config`.",
        {"landed": landed, "warnings": warnings, "strip_line": strip},
    )  # fmt: skip


def offload_key() -> Judgement:
    seed_args, _ = trainer_fsdp_view({"version": 1, "fsdp_offload_params": True})
    ours_args, _ = trainer_fsdp_view({"version": 1, "cpu_offload": True})
    strip = source_line("transformers.training_args", "self.fsdp_config[k[5:]] = self.fsdp_config.pop(k)")
    read = source_line("transformers.training_args", 'if self.fsdp_config.get("cpu_offload", False):')
    return Judgement(
        "offload_key", SEED1, CONFIG, "turning on CPU offload",
        "`fsdp_offload_params: true` in the `fsdp_config` offloads parameters to the CPU.",
        "holds" if "cpu_offload" in seed_args else "wrong on this stack",
        [f"transformers strips the `fsdp_` prefix ({strip}), so the key becomes `offload_params`, and the only "
         f"offload key it reads is `cpu_offload` ({read}). Built by the installed TrainingArguments, the plugin "
         f"arguments contain `cpu_offload`: {'cpu_offload' in seed_args} with the seed's key, "
         f"{'cpu_offload' in ours_args} with `cpu_offload: true`. No warning says the key was ignored."],
        "Write `cpu_offload: true`. The seed's key is dropped without a word and the run trains without offload.",
        {"seed_key_offloads": "cpu_offload" in seed_args, "cpu_offload_key_offloads": "cpu_offload" in ours_args,
         "strip_line": strip, "read_line": read},
    )  # fmt: skip


def fsdp1_pin() -> Judgement:
    args, warnings = trainer_fsdp_view({"version": 1})
    deprecated = [w for w in warnings if "FSDP1" in w and "deprecated" in w]
    where = source_line("transformers.training_args", "FSDP1 (`fsdp_config['version'] = 1`) is deprecated")
    return Judgement(
        "fsdp1_pin", SEED1, "§5.1 gotcha 1 and §7", "FSDP1 on this stack",
        "Pin FSDP1 (the Trainer's FSDP path) for this run.",
        ("holds" if args.get("fsdp_version") == 1 else "wrong") + (", but deprecated" if deprecated else ""),
        [f"The installed transformers still builds an FSDP1 plugin (`fsdp_version` = {args.get('fsdp_version')}) "
         f"and logs, at {where}: \"{deprecated[0] if deprecated else 'no warning'}\""],
        "FSDP1 runs on transformers 5.24 (the book's smoke runs prove it) but is deprecated; FSDP2 is the default "
        "and the future. The book keeps FSDP1 where the seed used it and shows FSDP2 beside it.",
        {"fsdp_version": args.get("fsdp_version"), "warned": bool(deprecated), "line": where},
    )  # fmt: skip


def run_save_strategy_no(out: str | Path) -> dict:
    """Two steps of a ``transformers.Trainer`` on the tiny SmolLM3 (CPU, one process) with
    ``save_strategy="no"``, then an explicit ``save_model(out/final)``: the files under ``out`` after each.
    A few seconds."""
    import torch  # deferred: heavy, only this claim
    from transformers import PrinterCallback, Trainer, TrainingArguments  # deferred with it

    from smolfsdp.gotchas.builders import rank_batch, tiny_model  # deferred: builds a model

    out = Path(out)
    model, _ = tiny_model()
    batch = rank_batch(0)
    rows = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]
    args = TrainingArguments(str(out), max_steps=2, per_device_train_batch_size=2, save_strategy="no",
                             report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.remove_callback(PrinterCallback)  # its log lines are not evidence; the files are
    torch.manual_seed(0)
    with contextlib.redirect_stderr(io.StringIO()):  # the save's shard-writing progress bar
        trainer.train()
        during = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        trainer.save_model(str(out / "final"))
    return {"steps": trainer.state.global_step, "files_after_training": during,
            "final_files": sorted(p.name for p in (out / "final").iterdir())}  # fmt: skip


def save_strategy_no(out: str | Path | None = None) -> Judgement:
    with tempfile.TemporaryDirectory(prefix="save-strategy-no-") as tmp:
        run = run_save_strategy_no(out or Path(tmp) / "run")
    ckpts = [f for f in run["files_after_training"] if f.startswith("checkpoint-")]
    saved = any(f.endswith(".safetensors") for f in run["final_files"])
    gate = source_line("transformers.trainer_callback", "args.save_strategy == SaveStrategy.STEPS")
    return Judgement(
        "save_strategy_no", SEED1, GOTCHA2, "turning periodic checkpoints off",
        "With `save_strategy=\"no\"` no checkpoint is written during training, and an explicit `save_model()` "
        "at the end still saves the final model.",
        "holds" if not ckpts and saved else "partly" if saved or not ckpts else "wrong",
        [f"Run: a `Trainer` on the tiny SmolLM3 (CPU), {run['steps']} steps with `save_strategy=\"no\"`: "
         f"{len(ckpts)} `checkpoint-*` folder(s) after training (the periodic save is the callback's "
         f"`should_save`, {gate}); then `save_model()` wrote {', '.join(run['final_files'])}."],
        "None; the book's runs turn periodic checkpoints off the same way (`save_steps: 0`) and write the final "
        "model explicitly. Crash resilience then needs checkpoints on a disk that is big enough "
        "(`smolfsdp.checkpoint.disk.check_disk_space` checks before training).",
        {"checkpoints_during_training": ckpts, "final_saved": saved, "final_files": run["final_files"], "gate": gate},
    )  # fmt: skip


def tracker_env() -> Judgement:
    import trackio  # deferred: only this claim reads trackio's source
    from transformers.integrations import integration_utils  # deferred: heavy, only this claim

    files = [Path(integration_utils.__file__), *Path(trackio.__file__).parent.rglob("*.py")]
    read = {
        v: [f.name for f in files if f'"{v}"' in f.read_text()]
        for v in ("TRACKIO_PROJECT", "TRACKIO_SPACE_ID")
    }
    space = source_line("trackio.utils", 'os.environ.get("TRACKIO_SPACE_ID")')
    project = source_line("transformers.integrations.integration_utils", "project=args.project")
    return Judgement(
        "tracker_env", SEED1, GOTCHA3, "the tracker's environment variables",
        "The Trainer's tracker callback takes its destination from environment variables such as "
        "`TRACKIO_PROJECT` and `TRACKIO_SPACE_ID`; set those and let the one callback log.",
        {2: "holds", 1: "partly", 0: "wrong"}[sum(bool(v) for v in read.values())],
        [f"Searched in the installed transformers integration and trackio: `TRACKIO_PROJECT` is read in "
         f"{read['TRACKIO_PROJECT'] or 'no file'}; `TRACKIO_SPACE_ID` in {read['TRACKIO_SPACE_ID']} ({space}). "
         f"The callback passes the project from the arguments ({project}); its default is \"huggingface\"."],
        "Keep the seed's advice of one session owned by the callback, but set the project with `project=` in "
        "`TrainingArguments`/`SFTConfig`; `TRACKIO_SPACE_ID` works as the seed says. @sec-gotchas runs both forms.",
        {"read_in": read, "space_line": space, "project_line": project},
    )  # fmt: skip


#: the one real multi-GPU trace the book reads (HolisticTraceAnalysis's test data: 2-rank DDP on A100s)
GPU_TRACE = repo_root().parent / "shared" / "traces" / "ddp_2rank_a100_rank0.json.gz"


def prefetch_overlap(trace: str | Path = GPU_TRACE) -> Judgement:
    """The seed's picture of prefetching, which no trace here can judge: the evidence says what exists."""
    trace = Path(trace)
    if trace.is_file():
        report = trace_analysis.analyze(trace_analysis.load_trace(trace))
        share = exposed_share(report)
        gpu = (
            f"the one real multi-GPU trace here is DDP on 2 A100s (HolisticTraceAnalysis's test data): "
            f"{share['exposed_pct']:.0f} % of its NCCL time is exposed, but its collectives are gradient "
            "all-reduces, with no all-gathers to prefetch"
        )
        values = {"ddp_exposed_pct": share["exposed_pct"], "all_gathers": len(report.gathers)}
    else:
        gpu, values = f"no multi-GPU trace is present (../shared/traces/{Path(trace).name} is absent)", {}
    # a trace judges it only if it holds FSDP's all-gathers (DDP's all-reduces have nothing to prefetch)
    verdict = ("open: needs an FSDP trace from 2+ GPUs" if not values.get("all_gathers") else
               "holds" if values["ddp_exposed_pct"] < 10 else "partly")  # exposed % of a gathering run  # fmt: skip
    return Judgement(
        "prefetch_overlap", SEED1, TRACE, "prefetch hides communication",
        "With `backward_prefetch=BACKWARD_PRE`, the next unit's all-gather runs while the current unit "
        "computes, so communication is hidden behind compute; streams without gaps and a regular per-layer "
        "pattern say the run is compute-bound.",
        verdict,
        [f"On CPU, gloo runs the prefetched all-gathers one after another, so a CPU trace cannot show it; {gpu}; "
         "the book's GPU check runs at world size 1, where nothing is communicated."],
        "Read it as the mechanism's intent, not a measured fact: whether the all-gathers hide depends on the "
        "link and the layer's compute time. @sec-profiling reads an FSDP trace from 2+ GPUs for exactly this "
        "(overlap %, exposed time per step) once one exists.",
        values,
    )  # fmt: skip
