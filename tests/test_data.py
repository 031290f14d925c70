"""Loading, column mappings, chat messages, assistant-only labels, truncation, bad input."""

import json

import pandas as pd
import pytest

from smolfsdp.config import TrainConfig
from smolfsdp.data.chat import IGNORE_INDEX, to_messages, tokenize_messages
from smolfsdp.data.columns import COLUMN_MAPPINGS, resolve_mapping
from smolfsdp.data.files import load_rows
from smolfsdp.data.prepare import prepare_data
from smolfsdp.errors import ConfigError
from smolfsdp.paths import bundled_data_path

ROWS = [
    {"Question": f"What is condition {i}?", "Answer": f"Condition {i} is a common thing. " * (i + 1)}
    for i in range(12)
]


def test_bundled_sample_has_layout_and_size():
    ds = load_rows("bundled")
    assert ds.column_names == ["Question", "Complex_CoT", "Response"]
    assert len(ds) >= 150
    assert len(set(ds["Question"])) == len(ds)
    assert (bundled_data_path().parent / "README.md").is_file()


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_local_files_load(tmp_path, suffix):
    path = tmp_path / f"rows{suffix}"
    df = pd.DataFrame(ROWS)
    {
        ".jsonl": lambda: df.to_json(path, orient="records", lines=True),
        ".json": lambda: path.write_text(json.dumps(ROWS)),
        ".csv": lambda: df.to_csv(path, index=False),
        ".parquet": lambda: df.to_parquet(path),
    }[suffix]()
    ds = load_rows(str(path))
    assert len(ds) == 12 and ds[3]["Question"] == "What is condition 3?"


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_rows(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize(
    "columns,expected",
    [
        (["Question", "Complex_CoT", "Response"], "medical_o1"),
        (["Question", "Answer", "qtype"], "question_answer"),
        (["instruction", "input", "output"], "instruction"),
    ],
)
def test_mapping_detection(columns, expected):
    assert resolve_mapping(columns)[0] == expected


def test_unmatched_columns_list_what_was_found():
    with pytest.raises(ConfigError) as err:
        resolve_mapping(["prompt", "completion"])
    assert "['prompt', 'completion']" in str(err.value)
    assert "Question" in str(err.value)


def test_messages_with_and_without_reasoning():
    row = {"Question": "Q?", "Complex_CoT": "think", "Response": "A."}
    m = COLUMN_MAPPINGS["medical_o1"]
    assert to_messages(row, m) == [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    with_cot = to_messages(row, m, include_reasoning=True, system_prompt="Be brief.")
    assert with_cot[0] == {"role": "system", "content": "Be brief."}
    assert with_cot[-1]["content"] == "<think>\nthink\n</think>\nA."
    alpaca = to_messages(
        {"instruction": "Explain", "input": "fever", "output": "Heat."}, COLUMN_MAPPINGS["instruction"]
    )
    assert alpaca[0]["content"] == "Explain\n\nfever"


def test_assistant_only_labels_token_by_token(tokenizer):
    """Every token whose characters lie inside the assistant content (+ its <|im_end|>) has a label
    equal to its id; every other token is -100. Checked against character offsets, not the mask."""
    msgs = [
        {"role": "system", "content": "You answer health questions."},
        {"role": "user", "content": "What does a high LDL result mean?"},
        {"role": "assistant", "content": "It raises long-term heart risk."},
    ]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    start = text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    end = text.index("<|im_end|>", start) + len("<|im_end|>")
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    out = tokenize_messages(msgs, tokenizer, max_length=512)
    assert out["input_ids"] == enc["input_ids"]
    n_in = 0
    for tok_id, label, (a, b) in zip(out["input_ids"], out["labels"], enc["offset_mapping"], strict=True):
        inside = a >= start and b <= end
        n_in += inside
        assert label == (tok_id if inside else IGNORE_INDEX), (tokenizer.decode([tok_id]), a, b)
    assert n_in == out["n_assistant_tokens"] > 0
    assert (
        tokenizer.decode([t for t in out["labels"] if t != IGNORE_INDEX])
        == "It raises long-term heart risk.<|im_end|>"
    )


def _cfg(path, **kw):
    return TrainConfig(dataset=str(path), eval_size=0, **kw)


def test_truncate_policy_cuts_and_counts(tmp_path, tokenizer):
    """too_long: truncate (drills only) keeps the old cut at max_length, counted as truncated."""
    path = tmp_path / "qa.jsonl"
    pd.DataFrame(ROWS).to_json(path, orient="records", lines=True)
    data = prepare_data(_cfg(path, max_length=48, too_long="truncate"), tokenizer)
    lengths = [len(x) for x in data.train["input_ids"]]
    assert max(lengths) == 48
    full = prepare_data(_cfg(path, max_length=4096), tokenizer)
    expected = sum(len(x) > 48 for x in full.train["input_ids"])
    assert data.n_truncated == expected > 0
    assert data.stats()["truncated"] == expected and data.stats()["kept"] == len(ROWS)


def test_max_length_too_small_for_any_answer(tmp_path, tokenizer):
    path = tmp_path / "qa.jsonl"
    pd.DataFrame(ROWS).to_json(path, orient="records", lines=True)
    with pytest.raises(ConfigError, match="max_length=10 is too small"):
        prepare_data(_cfg(path, max_length=10), tokenizer)


def test_empty_after_filtering(tmp_path, tokenizer):
    path = tmp_path / "qa.jsonl"
    pd.DataFrame([{"Question": "Q?", "Answer": "  "}, {"Question": "", "Answer": "A"}]).to_json(
        path, orient="records", lines=True
    )
    with pytest.raises(ConfigError, match="No rows with a non-empty question and answer"):
        prepare_data(_cfg(path), tokenizer)


def test_tokenizer_without_chat_template(tokenizer):
    import copy

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ConfigError, match="has no chat template"):
        prepare_data(TrainConfig(), bare)


def test_eval_split_is_held_out_and_deterministic(tokenizer):
    a = prepare_data(TrainConfig(), tokenizer)
    b = prepare_data(TrainConfig(), tokenizer)
    assert len(a.eval) == round(0.1 * (len(a.train) + len(a.eval)))
    assert a.eval["input_ids"] == b.eval["input_ids"]
    train = {tuple(x) for x in a.train["input_ids"]}
    assert not any(tuple(x) in train for x in a.eval["input_ids"])


def test_medquad_question_answer_mapping(medquad_path, tokenizer):
    data = prepare_data(TrainConfig(dataset=str(medquad_path), max_length=256), tokenizer)
    assert data.mapping == "question_answer"
    assert data.n_rows == 400
    assert data.stats()["dropped_too_long"] > 100  # MedQuAD answers run to ~28k characters


def test_a_jsonl_with_a_broken_line_names_the_file_and_the_line(tmp_path):
    """datasets says only "An error occurred while generating the dataset"."""
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps(r) for r in ROWS[:3]] + ['{"Question": "q", "Answer": "a"'] + [json.dumps(ROWS[3])]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        load_rows(str(path))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"Data file {str(path)!r}, line 4: not a JSON object (")
    assert "fix or remove that line" in msg
    path.write_text("\n".join([json.dumps(ROWS[0]), "[1, 2]"]) + "\n")  # valid JSON, not a row
    with pytest.raises(ConfigError, match=r"line 2: a JSON list, not an object"):
        load_rows(str(path))
