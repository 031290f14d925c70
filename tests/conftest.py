import os
from pathlib import Path

import pytest

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MEDQUAD = SHARED / "data" / "medquad_cancergov_niddk.jsonl"


@pytest.fixture(scope="session")
def tokenizer():
    from smolfsdp.models.modeling import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture
def medquad_path():
    if not MEDQUAD.is_file():
        pytest.skip(
            f"{MEDQUAD} is absent: the real MedQuAD rows live in ../shared/data/ (CI has them; a fresh "
            "clone does not)"
        )
    return MEDQUAD
