import os
from pathlib import Path

import pytest

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from smolfsdp.launch.processes import stop_on_signals  # noqa: E402  (after the environment above; no torch)

# SIGTERM or Ctrl-C to pytest (`make test`) stops every process a test launched (torchrun, its ranks, a
# CLI run, a kernel), then ends the session as after Ctrl-C: none is left running (tests/test_stop.py)
stop_on_signals()

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MEDQUAD = SHARED / "data" / "medquad_cancergov_niddk.jsonl"


@pytest.fixture(scope="session")
def tokenizer():
    from smolfsdp.models.modeling import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One folder for a test module's runs, shared by its tests (a run and its resumed copy live side by side)."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def uninterrupted(request, runs):
    """The test module's ``BASE`` (a TrainConfig) run whole, once per module, as ``whole``: what the
    interrupted and resumed runs of that module are compared with."""
    from smolfsdp.launch import runner  # after the environment above is set, like every smolfsdp import here

    return runner.run(
        request.module.BASE.replace(name="whole", output_dir=str(runs)), capture=True, timeout=600
    )


@pytest.fixture
def medquad_path():
    if not MEDQUAD.is_file():
        pytest.skip(
            f"{MEDQUAD} is absent: the real MedQuAD rows live in ../shared/data/ (CI has them; a fresh "
            "clone does not)"
        )
    return MEDQUAD
