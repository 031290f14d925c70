"""smolfsdp: sharded fine-tuning of SmolLM3 (FSDP1, FSDP2, TRL, LoRA), the package behind the book."""

import warnings

# In a Jupyter kernel without ipywidgets, tqdm.auto warns once that it falls back to text bars; the
# chapters' runs draw their bars in subprocesses, so the warning is noise in the rendered book.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"
