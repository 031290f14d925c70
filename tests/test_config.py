"""Run configs: defaults, YAML recipes, overrides, and errors that name the fix."""

import pytest

from smolfsdp.cli_args import parse_overrides
from smolfsdp.config import TrainConfig, load_config
from smolfsdp.errors import ConfigError
from smolfsdp.launch import runner
from smolfsdp.launch.validate import validate


def test_defaults_are_the_smoke_recipe():
    assert load_config("configs/runs/smoke.yaml").to_dict() == TrainConfig().to_dict()


def test_recipes_load():
    real = load_config("configs/runs/smollm3_3b_medical.yaml")
    assert (real.model, real.engine, real.fsdp_version, real.nproc) == (
        "HuggingFaceTB/SmolLM3-3B",
        "trl",
        1,
        2,
    )
    assert load_config("configs/runs/smoke_trl.yaml").engine == "trl"


def test_unknown_key_suggests_nearest(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("learning_rat: 0.1\n")
    with pytest.raises(ConfigError, match="Did you mean 'learning_rate'"):
        load_config(path)
    with pytest.raises(ConfigError, match="Did you mean 'max_steps'"):
        load_config(None, max_step=3)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"engine": "trll"}, "Did you mean 'trl'"),
        ({"fsdp_version": 3}, "use 1"),
        ({"backward_prefetch": "backward_pree"}, "BACKWARD_PRE"),
        ({"nproc": 0}, "at least one"),
        ({"max_length": 2}, "too small"),
        ({"max_steps": -1, "num_train_epochs": 0}, "train nothing"),
    ],
)
def test_bad_values(kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kw)


def test_cli_overrides_parse():
    over = parse_overrides(["--max-steps", "20", "--cpu_offload", "--name=x", "--learning_rate", "1e-4"])
    assert over == {"max_steps": 20, "cpu_offload": True, "name": "x", "learning_rate": 1e-4}
    cfg = load_config(None, **over)
    assert (cfg.max_steps, cfg.cpu_offload, cfg.name, cfg.learning_rate) == (20, True, "x", 1e-4)
    with pytest.raises(ConfigError, match="not a valid int"):
        load_config(None, max_steps="many")


def test_the_3b_lora_recipe_trains_the_full_recipes_data_with_adapters():
    full = load_config("configs/runs/smollm3_3b_medical.yaml")
    lora = load_config("configs/runs/lora_smollm3_3b.yaml")
    same = ("model", "dataset", "dataset_config", "columns", "max_length", "max_rows", "eval_size", "nproc")
    assert {k: getattr(lora, k) for k in same} == {k: getattr(full, k) for k in same}
    assert (lora.lora, lora.lora_r, lora.lora_alpha, lora.engine, lora.fsdp_version) == (
        True,
        8,
        16,
        "native",
        2,
    )
    assert lora.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize("text", ['lora: "false"', "save_final_model: 'no'", 'cpu_offload: "true"'])
def test_quoted_yaml_booleans_are_refused(tmp_path, text):
    """Before: a quoted "false" was a non-empty string, so it counted as true."""
    path = tmp_path / "r.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match="not a boolean: write .* without quotes"):
        load_config(path)


def test_cli_booleans_follow_yaml():
    over = parse_overrides(["--save_final_model", "no", "--cpu_offload=false", "--lora", "true"])
    assert over == {"save_final_model": False, "cpu_offload": False, "lora": True}
    assert load_config(None, **over).save_final_model is False
    with pytest.raises(ConfigError, match='argument --save_final_model.*Truthy value expected: got "no"'):
        parse_overrides(["--save_final_model", '"no"'])  # the quoted word is text, never read as a boolean
    assert parse_overrides(["--no_save_final_model"]) == {"save_final_model": False}


def test_whole_numbers_are_whole(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("max_steps: 2.5\n")
    with pytest.raises(ConfigError, match="max_steps=2.5 must be a whole number"):
        load_config(path)
    with pytest.raises(ConfigError, match="argument --max_steps/--max-steps: invalid int value: '2.5'"):
        parse_overrides(["--max_steps", "2.5"])
    assert load_config(None, max_steps=20.0).max_steps == 20
    with pytest.raises(ConfigError, match="must be a whole number"):
        TrainConfig(per_device_train_batch_size=1.5)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"lr_scheduler_type": "cosin"}, "Did you mean 'cosine'"),
        ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "not a scheduler smolfsdp can build"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1 must be >= 0"),
        ({"max_grad_norm": 0.0}, "0 freezes the model"),
        ({"max_grad_norm": -1.0}, "-1 climbs"),
        ({"warmup_ratio": 1.5}, r"\[0, 1\]"),
        ({"save_steps": -5}, "save_steps=-5 must be >= 0"),
        ({"too_long": "cut"}, "'drop'"),
    ],
)
def test_ranges_are_checked_before_launch(kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kw)


def test_every_listed_scheduler_builds():
    import torch
    from transformers import get_scheduler

    from smolfsdp.config import SCHEDULERS

    for name in SCHEDULERS:
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        get_scheduler(name, opt, num_warmup_steps=1, num_training_steps=10).step()


def test_only_the_options_given_override_the_yaml(tmp_path):
    """Defaults are suppressed in the parsed options, so the recipe keeps what the command line does not name."""
    path = tmp_path / "r.yaml"
    path.write_text("max_steps: 7\nlearning_rate: 0.1\nlora: true\nlora_target_modules: [q_proj]\n")
    over = parse_overrides(["--max_steps", "3", "--lora_target_modules", "q_proj,v_proj", "k_proj"])
    assert over == {"max_steps": 3, "lora_target_modules": ["q_proj", "v_proj", "k_proj"]}
    cfg = load_config(path, **over)
    assert (cfg.max_steps, cfg.learning_rate, cfg.lora) == (3, 0.1, True)
    assert cfg.lora_target_modules == ["q_proj", "v_proj", "k_proj"]
    assert parse_overrides(["--extra", "{team: a, budget: 3}"]) == {"extra": {"team": "a", "budget": 3}}
    with pytest.raises(ConfigError, match="'3' is not a YAML mapping"):
        parse_overrides(["--extra", "3"])


def test_misspelt_option_names_the_nearest():
    with pytest.raises(
        ConfigError, match=r"unknown option '--max_step' for train. Did you mean --max_steps\?"
    ):
        parse_overrides(["--max_step", "3"])
    with pytest.raises(ConfigError, match="Did you mean --learning_rate"):
        parse_overrides(["--learning-rat=0.1"])  # no abbreviation: argparse would take --learning as a prefix


def test_every_field_has_help_and_a_known_group():
    from dataclasses import fields

    from smolfsdp.config import GROUPS

    assert {f.metadata["group"] for f in fields(TrainConfig)} == set(GROUPS)
    assert all(len(f.metadata["help"]) > 8 for f in fields(TrainConfig))


def test_run_start_checks_live_above_config_and_run_first(tmp_path):
    """TrainConfig checks only what its fields decide; the model, mesh and launch checks
    (launch.validate) run where a run starts, first: preflight refuses a misspelt model before it
    creates the output folder or loads a tokenizer."""
    cfg = TrainConfig(model="tinyy", output_dir=str(tmp_path / "out"))  # config alone: no model lookup
    with pytest.raises(ConfigError, match=r"Unknown model preset 'tinyy' \(did you mean 'tiny'\?\)"):
        validate(cfg)
    with pytest.raises(ConfigError, match="Unknown model preset 'tinyy'"):
        runner.preflight(cfg)
    assert not (tmp_path / "out").exists()
    assert validate(TrainConfig(wrap_class="SmolLM3DecoderLayer")).wrap_class == "SmolLM3DecoderLayer"


def test_a_recorded_config_with_redacted_values_is_refused_naming_the_key(tmp_path):
    """Issue 43: a run folder's config.yaml has token-shaped strings replaced by ``<redacted>``; trained on as
    written, the run would use the placeholder (another system prompt, another row count) without a word."""
    key = "sk-" + "a" * 24
    prompt = f"You are a careful doctor (ticket {key})."
    TrainConfig(name="recorded", system_prompt=prompt).save(tmp_path / "config.yaml")
    assert (
        "system_prompt: You are a careful doctor (ticket <redacted>)."
        in (tmp_path / "config.yaml").read_text()
    )
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "config.yaml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'config.yaml'}: system_prompt holds '<redacted>'")
    assert "redacted when the run recorded it" in msg and "--system_prompt" in msg
    # the real value given as an option replaces the recorded one: nothing refused, nothing lost
    assert load_config(tmp_path / "config.yaml", system_prompt=prompt).system_prompt == prompt
    (tmp_path / "extra.yaml").write_text("extra:\n  wandb_api_key: <redacted>\n")
    with pytest.raises(ConfigError, match=r"extra\.wandb_api_key holds '<redacted>'"):
        load_config(tmp_path / "extra.yaml")
