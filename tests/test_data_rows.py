"""Every row accounted for: outcomes by reason, the too-long policy, field types, file layouts and
encodings, duplicates kept out of eval, and chat templates that render today's date."""

import copy
import json

import pytest

from smolfsdp.config import TrainConfig
from smolfsdp.data.chat import IGNORE_INDEX, render_ids, tokenize_messages
from smolfsdp.data.files import load_rows
from smolfsdp.data.prepare import CHARS_PER_TOKEN_BOUND, prepare_data, split_by_question
from smolfsdp.errors import ConfigError

OUTCOMES = ("kept", "dropped_empty_question", "dropped_empty_answer", "dropped_too_long")


def _cfg(path, **kw):
    return TrainConfig(dataset=str(path), eval_size=0, **kw)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _last_label(labels):
    return [t for t in labels if t != IGNORE_INDEX][-1]


def test_medquad_every_row_is_accounted_for_and_ends_its_turn(medquad_path, tokenizer):
    """The 400 real rows: the outcomes sum to the lines of the file; every kept row fits and its last
    trained token is the template's end-of-turn <|im_end|> (before: 352 rows were cut mid-answer)."""
    n_lines = sum(1 for line in medquad_path.read_text().splitlines() if line.strip())
    data = prepare_data(TrainConfig(dataset=str(medquad_path), max_length=256), tokenizer)
    s = data.stats()
    assert s["rows_in"] == n_lines == 400
    assert sum(s[k] for k in OUTCOMES) == n_lines
    assert s["kept"] == s["train_rows"] + s["eval_rows"]
    assert s["dropped_too_long"] > 100 and s["truncated"] == 0
    counts = data.row_counts()  # the chapter's ledger: the counts alone, the settings left out
    assert counts == {k: v for k, v in s.items() if k not in ("mapping", "too_long")}
    assert all(isinstance(v, int) for v in counts.values())
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for split in (data.train, data.eval):
        for ids, labels in zip(split["input_ids"], split["labels"], strict=True):
            assert len(ids) <= 256 and _last_label(labels) == eot


def test_bad_rows_are_counted_by_reason(tmp_path, tokenizer):
    """46 rows in: 2 empty questions, a null and a blank answer, 1 too long; 41 kept; nothing silent."""
    good = [{"Question": f"What is sign {i}?", "Answer": f"Sign {i} is benign."} for i in range(41)]
    bad = [
        {"Question": "", "Answer": "orphan answer"},
        {"Question": None, "Answer": "another"},
        {"Question": "No answer?", "Answer": None},
        {"Question": "Blank answer?", "Answer": "   "},
        {"Question": "Long?", "Answer": "word " * 200},
    ]
    path = _write_jsonl(tmp_path / "qa.jsonl", good + bad)
    s = prepare_data(_cfg(path, max_length=64), tokenizer).stats()
    assert {k: s[k] for k in ("rows_in", *OUTCOMES)} == {
        "rows_in": 46,
        "kept": 41,
        "dropped_empty_question": 2,
        "dropped_empty_answer": 2,
        "dropped_too_long": 1,
    }


def test_drop_policy_logs_each_reason(tmp_path, tokenizer, caplog):
    path = _write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {"Question": "Q?", "Answer": "A."},
            {"Question": "", "Answer": "A"},
            {"Question": "L?", "Answer": "x " * 300},
        ],
    )
    with caplog.at_level("INFO", logger="smolfsdp.data.prepare"):
        prepare_data(_cfg(path, max_length=64), tokenizer)
    text = caplog.text
    assert "3 rows read, 1 kept" in text
    assert "1 rows dropped: empty question" in text and "1 rows dropped: too long" in text


def test_reasoning_is_cut_never_the_answer(tokenizer):
    """Bundled rows with their reasoning at max_length=256: 179 of 180 are longer; the reasoning is cut so
    that every answer arrives whole, followed by <|im_end|>."""
    cfg = TrainConfig(include_reasoning=True, max_length=256, eval_size=0)
    data = prepare_data(cfg, tokenizer)
    s = data.stats()
    assert s["reasoning_cut"] > 100 and s["kept"] + s["dropped_too_long"] == s["rows_in"] == 180
    rows = load_rows("bundled")
    answers = {r["Response"].strip() for r in rows}
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for ids, labels in zip(data.train["input_ids"], data.train["labels"], strict=True):
        assert len(ids) <= 256 and _last_label(labels) == eot
        trained = tokenizer.decode([t for t in labels if t != IGNORE_INDEX])
        assert trained.endswith("<|im_end|>") and "</think>\n" in trained
        assert trained.split("</think>\n", 1)[1].removesuffix("<|im_end|>") in answers


def test_huge_answer_is_never_tokenized_in_full(tmp_path, tokenizer, monkeypatch):
    """A 4 MB answer is dropped as too long by its length in characters; the tokenizer never sees it."""
    path = _write_jsonl(
        tmp_path / "qa.jsonl",
        [{"Question": "Huge?", "Answer": "fever " * 700_000}, {"Question": "Small?", "Answer": "Rest."}],
    )
    seen = []
    real = type(tokenizer).apply_chat_template

    def spy(self, messages, *a, **kw):
        seen.append(max(len(m["content"]) for m in messages))
        return real(self, messages, *a, **kw)

    monkeypatch.setattr(type(tokenizer), "apply_chat_template", spy)
    s = prepare_data(_cfg(path, max_length=64), tokenizer).stats()
    assert (s["kept"], s["dropped_too_long"]) == (1, 1)
    assert max(seen) <= 64 * CHARS_PER_TOKEN_BOUND


@pytest.mark.parametrize(
    "answer,trained",
    [(["fever", "cough"], "fever\ncough"), (42, "42"), (1.5, "1.5")],
)
def test_non_string_fields_follow_the_documented_rule(tmp_path, tokenizer, answer, trained):
    path = _write_jsonl(tmp_path / "qa.jsonl", [{"Question": "Symptoms?", "Answer": answer}] * 2)
    data = prepare_data(_cfg(path), tokenizer)
    labels = data.train["labels"][0]
    assert tokenizer.decode([t for t in labels if t != IGNORE_INDEX]) == trained + "<|im_end|>"


def test_object_fields_are_refused_naming_row_and_column(tmp_path, tokenizer):
    rows = [{"Question": "Q?", "Answer": {"text": "A."}}] * 3
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(ConfigError, match=r"row 0, column 'Answer': a dict"):
        prepare_data(_cfg(path), tokenizer)


def test_mixed_column_types_name_the_file(tmp_path):
    path = tmp_path / "mixed.json"
    path.write_text(
        json.dumps([{"Question": "Q?", "Answer": "A."}, {"Question": "Q?", "Answer": {"t": "A."}}])
    )
    with pytest.raises(ConfigError, match=r"mixed.json.*ArrowTypeError"):
        load_rows(str(path))


def test_json_object_of_columns_loads(tmp_path, tokenizer):
    path = tmp_path / "cols.json"
    path.write_text(json.dumps({"Question": ["Q1?", "Q2?", "Q3?"], "Answer": ["A1.", "A2.", "A3."]}))
    ds = load_rows(str(path))
    assert len(ds) == 3 and ds[1] == {"Question": "Q2?", "Answer": "A2."}
    assert prepare_data(_cfg(path), tokenizer).stats()["kept"] == 3


def test_json_object_holding_rows_under_a_key_loads(tmp_path):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"data": [{"Question": "Q?", "Answer": "A."}] * 2}))
    assert load_rows(str(path))[0] == {"Question": "Q?", "Answer": "A."}


def test_other_json_layouts_are_refused_naming_the_layout(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"Question": ["Q?"], "meta": {"source": "x"}}))
    with pytest.raises(
        ConfigError, match=r"JSON object of layout .*'meta': 'dict'.*object of equal-length columns"
    ):
        load_rows(str(path))


@pytest.mark.parametrize("suffix,where", [(".jsonl", "line 3, byte 17"), (".csv", "line 4, byte 3")])
def test_non_utf8_names_file_and_line(tmp_path, suffix, where):
    path = tmp_path / f"latin1{suffix}"
    if suffix == ".jsonl":
        text = '{"Question": "Q1?", "Answer": "A."}\n{"Question": "Q2?", "Answer": "A."}\n{"Question": "Fi\xe8vre?", "Answer": "A."}\n'
    else:
        text = "Question,Answer\nQ1?,A.\nQ2?,A.\nFi\xe8vre?,A.\n"
    path.write_bytes(text.encode("latin1"))
    with pytest.raises(ConfigError, match=rf"latin1{suffix}' is not UTF-8: {where} .*iconv"):
        load_rows(str(path))


def test_duplicate_questions_never_straddle_the_split(tmp_path, tokenizer):
    """20 questions asked twice (the second in other case/spacing, another answer): counted, and each
    question is wholly in train or wholly in eval."""
    rows = [{"Question": f"What is sign {i}?", "Answer": f"Sign {i} is benign."} for i in range(20)]
    rows += [{"Question": f"what is  SIGN {i}?", "Answer": f"Sign {i}: benign."} for i in range(20)]
    path = _write_jsonl(tmp_path / "dup.jsonl", rows)
    data = prepare_data(TrainConfig(dataset=str(path), eval_size=0.25), tokenizer)
    assert data.stats()["duplicate_questions"] == 20

    def questions(split):
        out = set()
        for ids, labels in zip(split["input_ids"], split["labels"], strict=True):
            prompt = [t for t, lab in zip(ids, labels, strict=True) if lab == IGNORE_INDEX]
            out.add(" ".join(tokenizer.decode(prompt).lower().split()))
        return out

    assert len(data.eval) == 10 and not questions(data.train) & questions(data.eval)


def test_split_by_question_groups_rows():
    train, held = split_by_question(["a", "b", "a", "c", "b", "d"], n_eval=2, seed=0)
    keys = ["a", "b", "a", "c", "b", "d"]
    assert sorted(train + held) == list(range(6)) and len(held) >= 2
    assert not {keys[i] for i in train} & {keys[i] for i in held}


def test_template_date_is_pinned(tokenizer, monkeypatch):
    """A template that writes today's date (as SmolLM3's does: strftime_now("%d %B %Y")) gives the same
    tokens on two different days through smolfsdp; rendered directly by transformers it does not."""
    import datetime as dt

    from transformers.utils import chat_template_utils

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{{- '<|im_start|>system\\nToday Date: ' + strftime_now('%d %B %Y') + '<|im_end|>\\n' }}"
        + tokenizer.chat_template
    )
    msgs = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]

    def on(day):
        class Fixed(dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return cls(2026, 1, day)

        monkeypatch.setattr(chat_template_utils, "datetime", Fixed)
        direct = tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
        return tokenize_messages(msgs, tok, 512)["input_ids"], list(direct)

    (ours_1, direct_1), (ours_2, direct_2) = on(1), on(2)
    assert direct_1 != direct_2  # the date really is read
    assert ours_1 == ours_2
    assert "Today Date: 01 June 2025" in tok.decode(render_ids(msgs, tok)["input_ids"])
