"""What the loss keeps alive into backward: the ``[tokens, vocab]`` tensors at the loss moment, loop by loop.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``). At a long sequence and a large vocabulary these
are the largest tensors of a step (SmolLM3-3B, 2 x 2048 tokens: one fp32 ``[tokens, vocab]`` tensor is 1.96 GiB),
and which of them exist is decided by the code that computes the loss, not by FSDP. :data:`LOSS_PATHS`:

* ``transformers`` (the default; smolfsdp's native engine and the dry run's native step): the causal-LM loss
  upcasts the logits to fp32 and log-softmax saves its fp32 output; the step's output object holds the
  lm_head's logits in the compute dtype through backward (``CausalLMOutputWithPast.logits``); backward starts
  with two fp32 ``[tokens, vocab]`` gradients (of the loss and of the log-softmax).
* ``torchtitan-fp32-held``: the model returns fp32 logits (``self.output(h).float()``) and the loop keeps them
  (``pred``) through ``loss.backward()``: pytorch/torchtitan before commit e29b6b4 (2024-06-12), e.g. the
  FSDP1-vs-FSDP2 runs of commit 83c879f1.
* ``torchtitan``: as ``transformers`` but the loop frees the logits before backward: torchtitan since e29b6b4
  ("del logits=(bs, seq_len, vocab_size) to save 3.9G memory": ``del pred``), e.g. its 2024-12 H100 runs.
* ``trl-fused-lm-head``: TRL 1.16's ``SFTTrainer`` (smolfsdp's TRL engine, ``train.trl_engine.trl_args``):
  ``trl.trainer.utils.add_fused_lm_head`` projects the hidden states through the LM head in tiles of
  ``TOKEN_CHUNK_SIZE x _CHUNKED_LOGPROB_CHUNK_SIZE`` (4,096 x 32,768) and folds each into per-token
  log-probabilities (``trl.kernels.chunked_logprob.ChunkedLogProbFunction``): no ``[tokens, vocab]`` tensor
  at all. It saves the hidden states it scored (a ``[tokens, hidden]`` copy in the compute dtype) and fp32
  ``log_z`` and entropy per token; its backward recomputes each tile and accumulates the hidden-state and
  LM-head gradients in fp32 (``[tokens, hidden]`` and ``[vocab, hidden]``), then casts both to the compute
  dtype. Counted over every token (the padded worst case, as the dry run runs it on CPU; on CUDA with Triton
  only the tokens with a label are scored).

``legacy_hf_loss`` (transformers < 4.45, ``LlamaForCausalLM.forward``: ``logits.float()`` then
``shift_logits = logits[..., :-1, :].contiguous()``): one more fp32 copy at the loss moment (fsdp_qlora's
March 2024 runs), with the ``transformers`` path.

    python -c "from smolfsdp.estimate.loss_path import loss_bytes as b; print(b('trl-fused-lm-head', 4096, 128256, 2048, 2))"
"""

from __future__ import annotations

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.recipes import check_choice

#: ``estimate_memory(loss_path=...)``: the code that computes the loss (module docstring), and what each keeps.
LOSS_PATHS = {
    "transformers": "transformers' causal-LM loss; the output object holds the logits (compute dtype)",
    "torchtitan-fp32-held": "the model returns fp32 logits and the loop holds them (torchtitan before e29b6b4)",
    "torchtitan": "the loop frees the logits before backward (torchtitan since e29b6b4)",
    "trl-fused-lm-head": "TRL's fused LM head: log-probabilities in 4,096 x 32,768 tiles, no logits",
}
#: ``estimate_memory(legacy_hf_loss=True)``: the loss of transformers < 4.45, one more fp32 logits copy.
LEGACY_HF_LOSS = "transformers < 4.45 causal-LM loss: one more fp32 [tokens, vocab] copy"
#: TRL 1.16 ``trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE`` and ``trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE``
TRL_TILE = (4096, 32768)


def loss_bytes(
    loss_path: str,
    tokens: int,
    vocab_size: int,
    hidden_size: int,
    compute_bytes: int,
    legacy_hf_loss: bool = False,
) -> dict[str, int]:
    """Bytes of one micro-batch's loss, by when they are alive (``tokens`` = micro-batch x sequence):

    * ``held``: held through the whole backward (the logits a loop or output object keeps);
    * ``saved``: saved for the loss's own backward (gone once it ran): ``transformers`` and ``torchtitan*``,
      the fp32 log-softmax output, the int64 targets and the 0-d loss scale; ``trl-fused-lm-head``, the scored
      hidden states (compute dtype), fp32 ``log_z`` and entropy, the int64 targets and a bool mask per token;
    * ``backward``: made as the loss's backward runs (the loss moment): two fp32 ``[tokens, vocab]``
      gradients (three under ``legacy_hf_loss``); TRL, its fp32 hidden and LM-head gradients, their
      compute-dtype casts and one tile.

    ConfigError for a name not in :data:`LOSS_PATHS`, or ``legacy_hf_loss`` with another path."""
    check_choice(loss_path, tuple(LOSS_PATHS), "loss_path")
    if legacy_hf_loss and loss_path != "transformers":
        raise ConfigError(f"legacy_hf_loss is transformers' old loss: it goes with loss_path 'transformers', "
                          f"not {loss_path!r}.")  # fmt: skip
    tv = tokens * vocab_size
    if loss_path == "trl-fused-lm-head":
        c, h = compute_bytes, hidden_size
        return {"held": 0, "saved": tokens * (c * h + 4 + 4 + 8 + 1),
                "backward": (4 + c) * tokens * h + (4 + c) * vocab_size * h + trl_tile_bytes(tokens, c)}  # fmt: skip
    held = {"transformers": compute_bytes, "torchtitan-fp32-held": 4, "torchtitan": 0}[loss_path] * tv
    return {"held": held, "saved": 4 * tv + 8 * tokens + 4, "backward": (2 + bool(legacy_hf_loss)) * 4 * tv}


def trl_tile_bytes(tokens: int, compute_bytes: int) -> int:
    """TRL's projection tile (``mm_buf``): ``min(tokens, 4,096) x 32,768`` in the compute dtype, whatever the
    vocabulary (TRL allocates the full width)."""
    return min(tokens, TRL_TILE[0]) * TRL_TILE[1] * compute_bytes


def logits_component_bytes(
    loss_path: str, tokens: int, vocab_size: int, hidden_size: int, compute_bytes: int
) -> int:
    """The ``logits`` component of the stacked bars: the held logits plus the loss's fp32 upcast (none when the
    held logits already are fp32); for TRL's fused head, one tile (it never builds the logits)."""
    if loss_path == "trl-fused-lm-head":
        return trl_tile_bytes(tokens, compute_bytes)
    held = loss_bytes(loss_path, tokens, vocab_size, hidden_size, compute_bytes)["held"]
    upcast = 0 if loss_path == "torchtitan-fp32-held" or compute_bytes == 4 else 4 * tokens * vocab_size
    return held + upcast


def engine_loss_path(engine: str) -> str:
    """The loss path of a smolfsdp engine: ``trl`` (TRL 1.16's ``SFTTrainer``) takes the fused LM head,
    ``native`` transformers' loss."""
    return "trl-fused-lm-head" if engine == "trl" else "transformers"


def with_loss_path(act: dict, loss_path: str, tokens: int, config, compute_bytes: int, legacy_hf_loss=False):
    """(``act`` with its ``loss`` entry saved by ``loss_path`` instead of transformers' loss, :func:`loss_bytes`):
    ``act`` is ``activations.activation_breakdown``'s dict, whose ``loss`` is transformers' (plus the input ids
    the embedding keeps, which every path keeps)."""
    v, h = config.vocab_size, config.hidden_size
    ours = loss_bytes(loss_path, tokens, v, h, compute_bytes, legacy_hf_loss)
    theirs = loss_bytes("transformers", tokens, v, h, compute_bytes)["saved"]
    return {**act, "loss": act["loss"] - theirs + ours["saved"]}, ours
