"""smolfsdp: sharded fine-tuning of SmolLM3 (FSDP1, FSDP2, TRL, LoRA), the package behind the book."""

__version__ = "0.1.0"
