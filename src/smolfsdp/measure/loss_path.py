"""What a training loop's loss keeps alive into backward: the ``[tokens, vocab]`` tensors at the loss moment.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``, section "Held to published GPU runs"). At a
long sequence and a large vocabulary these are the largest tensors of a step (SmolLM3-3B, 2 x 4096 tokens:
one fp32 ``[tokens, vocab]`` tensor is 3.9 GiB), and which of them are alive when backward starts is decided
by the training loop, not by FSDP. Three loops the estimator is held to:

* ``compute`` (the default; transformers, both smolfsdp engines): the model's output object holds the
  lm_head's logits in the compute dtype through backward (``CausalLMOutputWithPast.logits``); the loss
  upcasts a copy to fp32 and log-softmax saves its fp32 output.
* ``fp32``: the model itself returns fp32 logits (``self.output(h).float()``) and the loop keeps that tensor
  (``pred``) through ``loss.backward()``: pytorch/torchtitan before commit e29b6b4 (2024-06-12), e.g. the
  FSDP1-vs-FSDP2 runs of commit 83c879f1 (``train.py``: ``pred = model(input_ids)``, ``loss =
  F.cross_entropy(pred.flatten(0, 1), ...)``, ``loss.backward()``).
* ``none``: the loop frees the logits before backward: torchtitan since e29b6b4 ("del logits=(bs, seq_len,
  vocab_size) to save 3.9G memory": ``del pred`` before ``loss.backward()``), e.g. the 2024-12 H100 runs.

``legacy_hf_loss`` (transformers < 4.45, ``LlamaForCausalLM.forward``: ``logits.float()`` then
``shift_logits = logits[..., :-1, :].contiguous()``): one more fp32 copy at the loss moment (fsdp_qlora's
March 2024 runs).

    python -c "from smolfsdp.measure.loss_path import held_logits_bytes as h; print(h(8 * 2048, 32000, 2, 'fp32'))"
"""

from __future__ import annotations

from smolfsdp.measure.recipes import check_choice

#: ``estimate_memory(logits_held=...)``: which logits the loop holds through backward (module docstring).
LOGITS_HELD = ("compute", "fp32", "none")
#: ``estimate_memory(legacy_hf_loss=True)``: the loss of transformers < 4.45, one more fp32 logits copy.
LEGACY_HF_LOSS = "transformers < 4.45 causal-LM loss: one more fp32 [tokens, vocab] copy"


def held_logits_bytes(tokens: int, vocab_size: int, compute_bytes: int, logits_held: str = "compute") -> int:
    """Bytes of the logits the loop holds through backward: ``tokens x vocab_size`` at ``compute_bytes``
    (``compute``), 4 (``fp32``) or nothing (``none``). ConfigError for a name not in :data:`LOGITS_HELD`."""
    check_choice(logits_held, LOGITS_HELD, "logits_held")
    per = {"compute": compute_bytes, "fp32": 4, "none": 0}[logits_held]
    return tokens * vocab_size * per


def logits_component_bytes(
    tokens: int, vocab_size: int, compute_bytes: int, logits_held: str = "compute"
) -> int:
    """The ``logits`` component of the stacked bars: the held logits plus the loss's fp32 upcast (none when the
    held logits already are fp32)."""
    upcast = 0 if logits_held == "fp32" or compute_bytes == 4 else 4 * tokens * vocab_size
    return held_logits_bytes(tokens, vocab_size, compute_bytes, logits_held) + upcast


def loss_fp32_copies(legacy_hf_loss: bool = False) -> int:
    """fp32 ``[tokens, vocab]`` tensors at the loss moment besides log-softmax's saved output: the two
    gradients as backward starts (of the loss and of the log-softmax), one more under :data:`LEGACY_HF_LOSS`."""
    return 2 + bool(legacy_hf_loss)
