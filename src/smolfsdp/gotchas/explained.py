"""The users' problems the chapter explains but does not run: each needs a GPU (or a library that needs one), so
the chapter gives what happens, the fix, where the installed library does it (file and line, read from the
installed source) and the public thread it comes from.

Chapter "Debugging the seams" (``notebooks/06_gotchas.ipynb``) shows them through
``smolfsdp.book.gotchas_view.explained_table``; the reproduced ones are in ``registry`` and the case modules.
No torch here (reading a library's source file does not import it).

    python -c "from smolfsdp.gotchas.explained import EXPLAINED, source_lines; print(source_lines(EXPLAINED[0]))"
"""

from __future__ import annotations

from dataclasses import dataclass, field

from smolfsdp.installed_source import installed_line


@dataclass(frozen=True)
class Explained:
    """A problem the chapter explains: ``sources`` are ``(file, text)`` pairs (:func:`installed_line`),
    ``threads`` the public reports (GitHub issue or pull-request addresses)."""

    name: str
    title: str
    what_happens: str
    fix: str
    why_not_run_here: str
    sources: tuple[tuple[str, str], ...]
    threads: tuple[str, ...] = field(default=())


def source_lines(item: Explained) -> list[str]:
    """The item's citations as ``file:line`` of the installed libraries (LookupError if one moved)."""
    return [installed_line(path, needle) for path, needle in item.sources]


def gathered_logits_bytes(rows: int, tokens_per_row: int, vocab_size: int, value_bytes: int = 2) -> int:
    """Bytes of the logits the Trainer's evaluation keeps on each rank: every rank's rows, gathered onto every
    rank, ``rows x tokens_per_row x vocab_size`` values of ``value_bytes`` (2: bf16 logits; 8 per token with
    ``preprocess_logits_for_metrics`` = argmax, pass ``vocab_size=1``). Rows padded to ``tokens_per_row``
    (``pad_across_processes`` pads to the longest row), so the most it can hold (transformers/trainer.py)."""
    return rows * tokens_per_row * vocab_size * value_bytes


def _clean(text: str) -> str:
    return " ".join(text.split())


EXPLAINED: tuple[Explained, ...] = (
    Explained(
        "qlora_bitsandbytes",
        "QLoRA: bitsandbytes 4-bit weights under FSDP",
        _clean("""bitsandbytes packs two 4-bit values per byte and, by default, stores them in a uint8 tensor
        (bnb_4bit_quant_storage=torch.uint8). FSDP1 flattens every parameter of a unit into one
        FlatParameter and refuses an integer tensor ("Cannot flatten integer dtype tensors"), or a second
        dtype beside the bf16 norms and adapters. The gotcha qlora_integer_storage above reproduces exactly this
        with a uint8 stand-in for the packed weight."""),
        _clean("""Store the packed weight in the dtype of the other parameters: BitsAndBytesConfig(
        bnb_4bit_quant_storage=torch.bfloat16) with torch_dtype=torch.bfloat16. The bytes are only carried
        by a bf16 tensor (FSDP gathers them without arithmetic), and accelerate skips its rank-0 weight broadcast
        for 4-bit models. smolfsdp does not load 4-bit models: `smolfsdp train --load_in_4bit` refuses in one
        line."""),
        "bitsandbytes' 4-bit layers compute on CUDA only; the chapters run on CPU.",
        (
            ("transformers/utils/quantization_config.py", "bnb_4bit_quant_storage (`torch.dtype` or str"),
            ("torch/distributed/fsdp/_flat_param.py", "Cannot flatten integer dtype tensors"),
            (
                "accelerate/utils/fsdp_utils.py",
                "if fsdp2_plugin.cpu_ram_efficient_loading and not model_has_params4bit",
            ),
        ),
        (
            "https://github.com/huggingface/peft/issues/1432",
            "https://github.com/huggingface/alignment-handbook/issues/169",
        ),
    ),
    Explained(
        "eval_logits_gathered",
        "Evaluation that gathers every logit until memory runs out",
        _clean("""With a compute_metrics function, the Trainer's evaluation loop keeps each batch's logits
        ([rows, tokens, vocabulary]), gathers them from every rank onto every rank and concatenates them on the
        GPU until the end of evaluation (or every eval_accumulation_steps steps, then in host memory). Without
        compute_metrics, transformers 5 evaluates with prediction_loss_only=True and keeps no logits. The
        bytes for this book's recipe are in the table under this one."""),
        _clean("""Give no compute_metrics (loss only), or reduce the logits per batch with
        preprocess_logits_for_metrics (e.g. argmax: one int64 per token instead of a vocabulary-wide row), or set
        eval_accumulation_steps so they move to host memory in pieces. smolfsdp's TRL engine replaces the Trainer's
        evaluate with a loss-only one (smolfsdp.train.trl_trainer.SmolSFTTrainer.evaluate)."""),
        "The failure is GPU memory running out at full size (SmolLM3's vocabulary: the table under the paragraphs).",
        (
            (
                "transformers/trainer.py",
                "prediction_loss_only=True if self.compute_metrics is None else None",
            ),
            ("transformers/trainer.py", "all_preds.add(logits)"),
            ("transformers/trainer.py", "args.eval_accumulation_steps is not None and (step + 1)"),
        ),
        (
            "https://github.com/huggingface/transformers/issues/7158",
            "https://github.com/axolotl-ai-cloud/axolotl/issues/1813",
        ),
    ),
    Explained(
        "device_map_auto",
        "device_map='auto' under FSDP",
        _clean("""device_map='auto' spreads one model's layers over the GPUs of one process (naive pipeline
        parallelism). FSDP is the opposite plan: every process holds a whole model's worth of shards on its own
        GPU. accelerate refuses the mix in prepare() with "You can't train a model that has been loaded with
        device_map='auto' in any distributed mode"."""),
        _clean("""Under FSDP load with no device_map (or device_map={'': local_rank}) and let FSDP shard; keep
        device_map='auto' for single-process inference of a model larger than one GPU."""),
        _clean("""On a CPU-only machine device_map='auto' puts every layer on the one 'cpu' device, and accelerate
        refuses only a map of more than one device."""),
        (
            (
                "accelerate/accelerator.py",
                "You can't train a model that has been loaded with `device_map='auto'`",
            ),
            ("accelerate/accelerator.py", "len(m.hf_device_map) > 1"),
        ),
        ("https://github.com/huggingface/accelerate/issues/2311",),
    ),
    Explained(
        "cpu_ram_efficient_loading",
        "accelerate's cpu_ram_efficient_loading",
        _clean("""With fsdp_cpu_ram_efficient_loading only rank 0 reads the checkpoint; the other ranks build
        the model with placeholder tensors, and FSDP must then copy rank 0's weights to them: FSDP1 through
        sync_module_states (accelerate forces it on, with a warning), FSDP2 through accelerate's
        fsdp2_load_full_state_dict. A hand-written loop that shards without that broadcast trains the other ranks
        on placeholders, with no error."""),
        _clean("""Keep sync_module_states=True with FSDP1 (or let accelerate prepare the model); in a hand-written
        FSDP2 loop, load on every rank or broadcast rank 0's full state dict after fully_shard
        (torch.distributed.checkpoint.state_dict.set_model_state_dict with StateDictOptions(full_state_dict=True,
        broadcast_from_rank0=True))."""),
        _clean("""The saving is host memory on a multi-GPU node; FSDP1's sync_module_states cannot run on a
        CPU-only gloo group (torch refuses), and this book loads the tiny model on every rank."""),
        (
            (
                "accelerate/utils/dataclasses.py",
                "sync_module_states cannot be False since efficient cpu ram loading",
            ),
            ("accelerate/utils/fsdp_utils.py", "only rank 0 loads the weights"),
            (
                "transformers/modeling_utils.py",
                "if is_fsdp_enabled() and not is_local_dist_rank_0() and not is_quantized",
            ),
        ),
        (
            "https://github.com/huggingface/accelerate/pull/2037",
            "https://github.com/axolotl-ai-cloud/axolotl/pull/1726",
        ),
    ),
    Explained(
        "torch_compile_fsdp",
        "torch.compile with FSDP",
        _clean("""FSDP2's hooks (all-gather before a unit's forward, reshard after, reduce-scatter in backward) are
        excluded from tracing (torch._dynamo.disable), so compiling the whole sharded model breaks the graph at
        every unit and fullgraph=True fails; FSDP1's FlatParameter swaps parameter storage (.data) inside
        forward, which dynamo has failed to trace in several releases."""),
        _clean("""Compile each decoder layer (torchtitan: torch.compile per block, then fully_shard), with
        FSDP2; leave FSDP1 uncompiled."""),
        _clean("""What matters is the speed of compiled GPU kernels; on this 2-core CPU, inductor would take
        minutes to compile and say nothing about a GPU step."""),
        (("torch/distributed/fsdp/_fully_shard/_fsdp_state.py", "@_dynamo_disable"),),
        (
            "https://github.com/pytorch/pytorch/issues/161153",
            "https://github.com/pytorch/pytorch/pull/181924",
        ),
    ),
)
