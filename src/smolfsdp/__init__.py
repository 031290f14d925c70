"""smolfsdp: sharded fine-tuning of SmolLM3 (FSDP1, FSDP2, TRL, LoRA), the package behind the book.

The subpackages and their layers (who may import whom) are listed in README.md "Layout" and enforced
by ``lint-imports`` (``[tool.importlinter]`` in pyproject.toml).
"""

import warnings

# In a Jupyter kernel without ipywidgets, tqdm.auto warns once that it falls back to text bars; the
# chapters' runs draw their bars in subprocesses, so the warning is noise in the rendered book.
warnings.filterwarnings("ignore", message="IProgress not found")
# peft 0.21's PeftModel.__init__ reads `model.is_gradient_checkpointing`, which transformers 5.24
# deprecates in favour of `is_activation_checkpointing` (same value; removal in v6). Every
# `get_peft_model` call (smolfsdp.sharding.lora, smolfsdp.gotchas.run_all) hits it; nothing of ours uses the old
# name, so the FutureWarning is peft's to fix and only noise in the LoRA chapter.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

__version__ = "0.1.0"
