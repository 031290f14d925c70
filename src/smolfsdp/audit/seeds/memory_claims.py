"""The seeds' claims about memory: bytes per parameter, per GPU, what fits, what batch size and sharding move.

Settled by the estimator (``smolfsdp.estimate``), its book recipe (``estimate.recipe_peak``) and the one fit verdict
(``estimate.hardware``). Used by ``smolfsdp.audit.seeds.claims`` (chapter "What the seeds say, and what we
measured"). Every claim is in the book's words.

    python -c "from smolfsdp.audit.seeds.memory_claims import batch_size_lever as f; print(f().evidence_text)"
"""

from __future__ import annotations

from smolfsdp.audit.seeds.installed_stack import source_line
from smolfsdp.audit.seeds.judgement import (
    BATCH,
    GB,
    MEMORY,
    SEED1,
    SEED2,
    SETUP,
    SUMMARY,
    Judgement,
    book_recipe_kwargs,
    gb,
    gib,
)
from smolfsdp.estimate.adamw_step import ADAMW_WORDS, engine_optimizer
from smolfsdp.estimate.hardware import GPUS, fit_verdict, fits
from smolfsdp.estimate.loss_path import engine_loss_path
from smolfsdp.estimate.memory import RECIPES, estimate_memory
from smolfsdp.estimate.params import LoraSpec, count_parameters, llama3_8b_config, resolve_model_config
from smolfsdp.estimate.recipe_peak import LOSS_WORDS, moment_words, recipe_peak, recipe_settings
from smolfsdp.estimate.recompute import recompute_words


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
        + "; ".join(f"{g}, {fit_verdict(two, GPUS[g]).line}" for g in ("A10G", "L40S", "A100 40GB"))
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
    said = {(g, w): fit_verdict(est[w], GPUS[g]) for g, w in SEED_FIT}  # the one verdict, with its numbers
    ours = {k: v.fits for k, v in said.items()}  # "tight" is not "can fine-tune": the allocator would retry
    flipped = [k for k in SEED_FIT if SEED_FIT[k] != ours[k]]
    label = {1: "a full copy on 1", 2: "FULL_SHARD over 2"}
    text = "; ".join(
        f"{g}, {label[w]}: {said[(g, w)].line} (the seed: {'fits' if SEED_FIT[(g, w)] else 'does not'})"
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
        {f"{g}, {label[w]}": {"gpu": g, "peak_bytes": peaks[w].bytes, "need_bytes": said[(g, w)].need_bytes,
                              "verdict": said[(g, w)].word, "fits": ours[(g, w)], "seed_fits": SEED_FIT[(g, w)]}
         for g, w in SEED_FIT},
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
    # the native engine's loss and AdamW step (on a GPU)
    native = {"loss_path": engine_loss_path("native"), "adamw": engine_optimizer("native")}
    hf = [recipe_peak(include="device", seq_len=8192, micro_batch=mb, **native)
          for mb in (kw["micro_batch"], 1)]  # the same 8k run with the native engine's loss  # fmt: skip
    r8 = rows[8192]
    saved = {"TRL": r8["peak_bytes"] - r8["peak_micro_batch_1"], "hf": hf[0].bytes - hf[1].bytes}
    holds = max(share.values()) < 0.25
    return Judgement(
        "batch_size_lever", SEED1, BATCH, "batch size as a memory lever",
        "Batch size moves only activation memory, the small part, so when a run runs out of memory sharding "
        "is the fix and a smaller batch is not.",
        "holds" if holds else "partly",
        [f"The estimator, the book's recipe on 2 GPUs with FULL_SHARD, micro-batch {kw['micro_batch']} and "
         f"{LOSS_WORDS[recipe_settings()['loss_path']]} ({ADAMW_WORDS[recipe_settings()['adamw']]}), counting "
         f"activations and logits as what scales with the batch: {text}. The sharded state ({gib(rows[2048]['static_bytes'])}) does not move "
         f"with the batch. With transformers' own loss (the native engine, whose output holds the logits; "
         f"{ADAMW_WORDS[native['adamw']]}) the same 8,192-token run saves {gib(saved['hf'])} at micro-batch 1 "
         f"(peak {gib(hf[0].bytes)})."],
        f"{'True' if holds else 'True for the static state, and at short sequences'} for the seed's own trainer: "
        f"TRL's SFTTrainer (1.16) scores the LM head in tiles and never makes the [tokens, vocab] logits, so up "
        f"to 8,192 tokens micro-batch 1 saves {gib(saved['TRL'])} of a {gib(r8['peak_bytes'])} peak. It depends "
        f"on that loss: where the logits are made (transformers' own loss, the native engine) they grow with tokens per GPU, and at 8,192 tokens "
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


def llama31_8b_config():
    """Seed 2's model, meta-llama/Llama-3.1-8B, from its published config.json (hidden 4096, 32 layers, 32 heads,
    8 KV heads, MLP 14336, vocab 128256, untied, 131,072 positions, llama3 RoPE scaling): 8,030,261,248
    parameters. A ``LlamaConfig`` only; no weights, no download."""
    from transformers import LlamaConfig  # deferred: transformers is heavy

    return LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
    )  # fmt: skip


#: seed 2's ``LoraConfig`` (r=8, alpha 16, q/k/v/o, dropout 0.05)
SEED2_LORA = LoraSpec(r=8, alpha=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"), dropout=0.05)


def lora_size() -> Judgement:
    n = count_parameters(llama31_8b_config(), SEED2_LORA).trainable
    sizes = {
        "the adapter in bf16 (2 B/param)": 2 * n,
        "the adapter in fp32 (4 B/param)": 4 * n,
        "Adam m + v (8 B/param)": 8 * n,
        "fp32 adapter + Adam m + v (12 B/param)": 12 * n,
    }
    near = min(sizes, key=lambda k: abs(sizes[k] - 50 * 10**6))
    update = sizes["the adapter in bf16 (2 B/param)"]  # the seed casts the whole model, adapters too, to bf16
    verdict = ("holds" if abs(update / (50 * 10**6) - 1) < 0.25 else
               "partly: right in size, wrong in what it names" if abs(sizes[near] / (50 * 10**6) - 1) < 0.25
               else "wrong")  # fmt: skip
    return Judgement(
        "lora_size", SEED2, SUMMARY, "size of the LoRA update",
        "The LoRA update of Llama-3.1-8B is small: about 50 MB.",
        verdict,
        [f"Llama-3.1-8B (its published config, counted on the meta device) with the seed's LoRA (r={SEED2_LORA.r}, "
         f"alpha={SEED2_LORA.alpha} on {'/'.join(t.split('_')[0] for t in SEED2_LORA.targets)}) has {n:,} "
         "trainable parameters: " + "; ".join(f"{k}: {v / 1e6:,.1f} MB" for k, v in sizes.items())
         + f". Closest to 50 MB: {near}."],
        f"The update itself, the adapters the seed trains (cast to bf16 with the model), is {update / 1e6:,.1f} MB; "
        f"{sizes['the adapter in fp32 (4 B/param)'] / 1e6:,.1f} MB if kept in fp32, as the package keeps them. "
        f"About 50 MB ({sizes['Adam m + v (8 B/param)'] / 1e6:,.1f} MB) is Adam's m and v for them. Either way the "
        "frozen base is the bulk of memory.",
        {"trainable": n, "nearest": near, **sizes},
    )  # fmt: skip


#: sequence lengths the "6-8 GB per GPU" claim is judged at (the seed gives none)
SIXTEEN_SEQS = (256, 512, 1024, 2048, 4096)


def sixteen_gb_on_four() -> Judgement:
    config = llama31_8b_config()
    n = count_parameters(config).total
    base = dict(world_size=4, strategy="FULL_SHARD", lora=SEED2_LORA, recipe="pure-bf16", fsdp_version=2)
    rows = {s: {ac: estimate_memory(config, **base, seq_len=s, activation_checkpointing=ac) for ac in (False, True)}
            for s in SIXTEEN_SEQS}  # fmt: skip
    peak = {s: {ac: e.peak_bytes for ac, e in r.items()} for s, r in rows.items()}
    within = [s for s in SIXTEEN_SEQS if min(peak[s].values()) <= 8 * GB]
    text = "; ".join(f"{s:,} tokens: {gib(p[False])} without, {gib(p[True])} with checkpointing"
                     for s, p in peak.items())  # fmt: skip
    ref = 2048 if 2048 in rows else SIXTEEN_SEQS[-1]  # the length the book's recipes use
    static = rows[ref][True].static_bytes
    tied = getattr(config, "tie_word_embeddings", False)
    root = 2 * ((1 if tied else 2) * config.vocab_size * config.hidden_size + config.hidden_size)
    verdict = ("holds" if within == list(SIXTEEN_SEQS) else
               f"partly: holds up to {max(within):,} tokens" if within else "wrong: optimistic")  # fmt: skip
    return Judgement(
        "sixteen_gb_on_four", SEED2, SUMMARY, "a 16 GB model on 4 GPUs",
        "A 16 GB model sharded over 4 GPUs keeps 4 GB of it per GPU and takes 6-8 GB per GPU in all.",
        verdict,
        [f"Llama-3.1-8B ({n:,} parameters, {gb(2 * n)} in bf16), loaded in bf16, the seed's LoRA, FSDP2 "
         f"FULL_SHARD over 4 GPUs, one sequence per GPU; the seed gives no length, so the estimator's peak per GPU "
         f"at each: {text}. The sharded state is {gib(static)} at every length."],
        "The 4 GB shard is right. The total depends on the sequence length the seed does not give: within 8 GB "
        + (f"up to {max(within):,} tokens (with activation checkpointing where it needs it); " if within else
           "at none of the lengths tried; ")
        + f"at {ref:,} tokens plan for {gib(min(peak[ref].values()))}, because the gathered units, activations, "
        "logits over a 128k vocabulary, CUDA context and NCCL buffers come on top of the shard. "
        f"The shortest sequence peaks at the {rows[SIXTEEN_SEQS[0]][True].peak_moment} moment: FSDP2 holds the root "
        f"unit (embedding, output layer and final norm, {gb(root)} in bf16) twice then, unsharded and as its flat "
        "all-gather output, which it keeps until the next unit's copy-out to overlap the two (torch "
        "_fsdp_param_group.py, wait_for_unshard).",
        {"params": n, "static_bytes": static, "within_8gb": within,
         "peak_bytes": {str(s): {"ac_off": p[False], "ac_on": p[True]} for s, p in peak.items()}},
        memory=True,
    )  # fmt: skip


def eight_b_full() -> Judgement:
    config = llama3_8b_config()
    n = count_parameters(config).total
    one = estimate_memory(
        config, world_size=1, strategy="NO_SHARD", seq_len=2048, activation_checkpointing=True
    )
    over = [g for g, gpu in GPUS.items() if not fits(one, gpu)]
    return Judgement(
        "eight_b_full", SEED2, SUMMARY, "an 8B full fine-tune without FSDP",
        "Fully fine-tuning the 8B model without FSDP could need more than 90 GB per GPU.",
        "holds" if one.static_bytes > 90 * GB else "wrong",
        [f"The estimator, a Llama-3-8B-shaped model ({n:,} parameters), one GPU, AdamW with an fp32 master copy "
         f"(16 B/param), one sequence of 2,048 tokens, activation checkpointing: static {gib(one.static_bytes)} "
         f"({gb(one.static_bytes)}), peak {gib(one.peak_bytes)}."],
        f"Understated rather than wrong: \"more than 90 GB\" is in fact about {gb(one.peak_bytes)} at the peak, "
        f"more than {len(over)} of the {len(GPUS)} GPUs in the book's table hold"
        + (f" (only {', '.join(g for g in GPUS if g not in over)} would fit it)." if len(over) < len(GPUS) else "."),
        {"params": n, "static_bytes": one.static_bytes, "peak_bytes": one.peak_bytes},
        memory=True,
    )  # fmt: skip


def checkpointing_saves() -> Judgement:
    config = llama3_8b_config()
    base = dict(
        world_size=4, strategy="FULL_SHARD", lora=True, recipe="pure-bf16", seq_len=2048, fsdp_version=2
    )
    off, on = (estimate_memory(config, **base, activation_checkpointing=ac) for ac in (False, True))
    return Judgement(
        "checkpointing_saves", SEED2, SETUP, "gradient checkpointing",
        "Gradient checkpointing lowers memory by keeping only some activations and recomputing the rest in backward.",
        "holds" if on.activations_bytes < off.activations_bytes else "wrong",
        [f"The estimator, seed 2's set-up (8B, LoRA, FSDP2 over 4, 2,048 tokens): activations "
         f"{gib(off.activations_bytes)} without, {gib(on.activations_bytes)} with checkpointing; peak "
         f"{gib(off.peak_bytes)} -> {gib(on.peak_bytes)}."],
        f"Right; it costs recomputation, less than the one more forward usually quoted: here it "
        f"{recompute_words(config, 'full', None, seq_len=2048, lora=LoraSpec(), why=False)} (torch stops before "
        "each layer's last matmul, which backward never needs). Under FSDP prefer FSDP's own activation "
        "checkpointing (@sec-gotchas counts the all-gathers of both forms).",
        {"activations_off": off.activations_bytes, "activations_on": on.activations_bytes},
    )  # fmt: skip
