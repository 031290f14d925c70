"""Build the small byte-level BPE tokenizer in ``data/tokenizer/`` from the bundled sample.

The smoke profile cannot download SmolLM3's tokenizer (no hub access in CI), so it ships its own:
a byte-level BPE (the same family as SmolLM3's, so any text encodes without unknown tokens),
trained on the bundled medical Q&A text, with a ChatML chat template like SmolLM3's whose
assistant turns are wrapped in ``{% generation %}`` markers. Those markers are what
``tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)`` needs for
assistant-only loss.

    python scripts/build_tokenizer.py            # rewrites data/tokenizer/
    python scripts/build_tokenizer.py --check    # rebuilds in memory, fails if it differs
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "medical_qa" / "medical_qa_sample.jsonl"
OUT = ROOT / "data" / "tokenizer"
VOCAB_SIZE = 1024
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<think>", "</think>"]

# ChatML, as SmolLM3 uses; assistant content and its <|im_end|> are inside {% generation %}
# so the model learns to stop, and only those tokens carry labels.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus():
    with SAMPLE.open() as fh:
        for line in fh:
            row = json.loads(line)
            yield from (row["Question"], row["Complex_CoT"], row["Response"])


def build() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if data/tokenizer differs from a rebuild")
    args = parser.parse_args()
    tok = build()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            tok.save_pretrained(tmp)
            fresh = json.loads((Path(tmp) / "tokenizer.json").read_text())
        shipped = json.loads((OUT / "tokenizer.json").read_text())
        same = fresh["model"] == shipped["model"]
        print("data/tokenizer matches a rebuild" if same else "data/tokenizer differs from a rebuild")
        return 0 if same else 1
    tok.save_pretrained(OUT)
    print(f"wrote {OUT} (vocabulary {len(tok)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
