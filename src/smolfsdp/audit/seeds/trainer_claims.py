"""The seeds' claims about the Trainer's FSDP set-up: what TRL, transformers and accelerate do with the settings.

Settled by the installed libraries' source (``installed_stack.source_line``: the file and line that decides), what
``TrainingArguments`` makes of the seed's ``fsdp_config``, and the seed-code run (``seed_code``). Also the chapter's
tables of the seed's ``fsdp_config`` beside the package's. Used by ``smolfsdp.audit.seeds.claims``.

    python -c "from smolfsdp.audit.seeds.trainer_claims import fsdp_config_table as t; print(t())"
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch

from smolfsdp.audit.seeds.installed_stack import source_line, trainer_fsdp_view
from smolfsdp.audit.seeds.judgement import CONFIG, GOTCHA2, GOTCHA3, SEED1, Judgement, gb, gib
from smolfsdp.checkpoint.disk import estimate_checkpoint_bytes
from smolfsdp.config import load_config
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.paths import recipe

#: the seed's ``fsdp_config`` keys and values as it writes them (with ``fsdp="full_shard auto_wrap"``)
SEED_FSDP_CONFIG = {
    "fsdp_version": 1,
    "fsdp_transformer_layer_cls_to_wrap": ["SmolLM3DecoderLayer"],
    "fsdp_backward_prefetch": "backward_pre",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    "fsdp_offload_params": False,
}


SEED_FSDP_ARG = "full_shard auto_wrap"


def fsdp_config_as_written() -> Judgement:
    args, warnings = trainer_fsdp_view(SEED_FSDP_CONFIG, SEED_FSDP_ARG)
    offload, _ = trainer_fsdp_view({**SEED_FSDP_CONFIG, "fsdp_offload_params": True}, SEED_FSDP_ARG)
    strip = source_line("transformers.training_args", "self.fsdp_config[k[5:]] = self.fsdp_config.pop(k)")
    landed = {
        "fsdp_version": args.get("fsdp_version"),
        "fsdp_transformer_layer_cls_to_wrap": args.get("transformer_cls_names_to_wrap"),
        "fsdp_backward_prefetch": args.get("backward_prefetch"),
        "fsdp_state_dict_type": args.get("state_dict_type"),
        "fsdp_offload_params": "cpu_offload" in offload,
    }
    said = "; ".join(f"`{k}` -> {v!r}" for k, v in landed.items())
    dep = [w.split(". ")[0].rstrip(".") for w in warnings if "deprecated" in w]
    return Judgement(
        "fsdp_config_as_written", SEED1, CONFIG, "the seed's fsdp_config, key by key",
        f"The Trainer is configured with `fsdp=\"{SEED_FSDP_ARG}\"` and five `fsdp_*` keys: FSDP version 1, the "
        "SmolLM3 decoder layer as wrap class, backward prefetch, sharded state dicts, parameter offload off.",
        "holds" if landed["fsdp_offload_params"] and not dep else "partly",
        [f"Built by the installed TrainingArguments: transformers strips the `fsdp_` prefix ({strip}); what "
         f"reached accelerate's plugin arguments: {said} (the last one with the key set to true). It logs: "
         + " / ".join(f"\"{d}.\"" for d in dep)],
        "Four of the five keys work. `fsdp_offload_params` is read by nothing (write `cpu_offload`); the string "
        "form of `fsdp` and FSDP1 itself are deprecated: write `fsdp=True` and put everything in `fsdp_config`.",
        {"landed": landed, "warnings": warnings, "strip_line": strip},
    )  # fmt: skip


def offload_key() -> Judgement:
    seed_args, _ = trainer_fsdp_view({"version": 1, "fsdp_offload_params": True})
    ours_args, _ = trainer_fsdp_view({"version": 1, "cpu_offload": True})
    strip = source_line("transformers.training_args", "self.fsdp_config[k[5:]] = self.fsdp_config.pop(k)")
    read = source_line("transformers.training_args", 'if self.fsdp_config.get("cpu_offload", False):')
    return Judgement(
        "offload_key", SEED1, CONFIG, "turning on CPU offload",
        "`fsdp_offload_params: true` in the `fsdp_config` offloads parameters to the CPU.",
        "holds" if "cpu_offload" in seed_args else "wrong on this stack",
        [f"transformers strips the `fsdp_` prefix ({strip}), so the key becomes `offload_params`, and the only "
         f"offload key it reads is `cpu_offload` ({read}). Built by the installed TrainingArguments, the plugin "
         f"arguments contain `cpu_offload`: {'cpu_offload' in seed_args} with the seed's key, "
         f"{'cpu_offload' in ours_args} with `cpu_offload: true`. No warning says the key was ignored."],
        "Write `cpu_offload: true`. The seed's key is dropped without a word and the run trains without offload.",
        {"seed_key_offloads": "cpu_offload" in seed_args, "cpu_offload_key_offloads": "cpu_offload" in ours_args,
         "strip_line": strip, "read_line": read},
    )  # fmt: skip


def fsdp1_pin() -> Judgement:
    args, warnings = trainer_fsdp_view({"version": 1})
    deprecated = [w for w in warnings if "FSDP1" in w and "deprecated" in w]
    where = source_line("transformers.training_args", "FSDP1 (`fsdp_config['version'] = 1`) is deprecated")
    return Judgement(
        "fsdp1_pin", SEED1, "§5.1 gotcha 1 and §7", "FSDP1 on this stack",
        "Pin FSDP1 (the Trainer's FSDP path) for this run.",
        ("holds" if args.get("fsdp_version") == 1 else "wrong") + (", but deprecated" if deprecated else ""),
        [f"The installed transformers still builds an FSDP1 plugin (`fsdp_version` = {args.get('fsdp_version')}) "
         f"and logs, at {where}: \"{deprecated[0] if deprecated else 'no warning'}\""],
        "FSDP1 runs on transformers 5.24 (the book's smoke runs prove it) but is deprecated; FSDP2 is the default "
        "and the future. The book keeps FSDP1 where the seed used it and shows FSDP2 beside it.",
        {"fsdp_version": args.get("fsdp_version"), "warned": bool(deprecated), "line": where},
    )  # fmt: skip


def run_save_strategy_no(out: str | Path) -> dict:
    """Two steps of a ``transformers.Trainer`` on the tiny SmolLM3 (CPU, one process) with
    ``save_strategy="no"``, then an explicit ``save_model(out/final)``: the files under ``out`` after each.
    A few seconds."""
    import torch  # deferred: heavy, only this claim
    from transformers import PrinterCallback, Trainer, TrainingArguments  # deferred with it

    from smolfsdp.gotchas.builders import rank_batch, tiny_model  # deferred: builds a model

    out = Path(out)
    model, _ = tiny_model()
    batch = rank_batch(0)
    rows = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]
    args = TrainingArguments(str(out), max_steps=2, per_device_train_batch_size=2, save_strategy="no",
                             report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.remove_callback(PrinterCallback)  # its log lines are not evidence; the files are
    torch.manual_seed(0)
    with contextlib.redirect_stderr(io.StringIO()):  # the save's shard-writing progress bar
        trainer.train()
        during = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        trainer.save_model(str(out / "final"))
    return {"steps": trainer.state.global_step, "files_after_training": during,
            "final_files": sorted(p.name for p in (out / "final").iterdir())}  # fmt: skip


def save_strategy_no(out: str | Path | None = None) -> Judgement:
    with tempfile.TemporaryDirectory(prefix="save-strategy-no-") as tmp:
        run = run_save_strategy_no(out or Path(tmp) / "run")
    ckpts = [f for f in run["files_after_training"] if f.startswith("checkpoint-")]
    saved = any(f.endswith(".safetensors") for f in run["final_files"])
    gate = source_line("transformers.trainer_callback", "args.save_strategy == SaveStrategy.STEPS")
    return Judgement(
        "save_strategy_no", SEED1, GOTCHA2, "turning periodic checkpoints off",
        "With `save_strategy=\"no\"` no checkpoint is written during training, and an explicit `save_model()` "
        "at the end still saves the final model.",
        "holds" if not ckpts and saved else "partly" if saved or not ckpts else "wrong",
        [f"Run: a `Trainer` on the tiny SmolLM3 (CPU), {run['steps']} steps with `save_strategy=\"no\"`: "
         f"{len(ckpts)} `checkpoint-*` folder(s) after training (the periodic save is the callback's "
         f"`should_save`, {gate}); then `save_model()` wrote {', '.join(run['final_files'])}."],
        "None; the book's runs turn periodic checkpoints off the same way (`save_steps: 0`) and write the final "
        "model explicitly. Crash resilience then needs checkpoints on a disk that is big enough "
        "(`smolfsdp.checkpoint.disk.check_disk_space` checks before training).",
        {"checkpoints_during_training": ckpts, "final_saved": saved, "final_files": run["final_files"], "gate": gate},
    )  # fmt: skip


def tracker_env() -> Judgement:
    import trackio  # deferred: only this claim reads trackio's source
    from transformers.integrations import integration_utils  # deferred: heavy, only this claim

    files = [Path(integration_utils.__file__), *Path(trackio.__file__).parent.rglob("*.py")]
    read = {
        v: [f.name for f in files if f'"{v}"' in f.read_text()]
        for v in ("TRACKIO_PROJECT", "TRACKIO_SPACE_ID")
    }
    space = source_line("trackio.utils", 'os.environ.get("TRACKIO_SPACE_ID")')
    project = source_line("transformers.integrations.integration_utils", "project=args.project")
    return Judgement(
        "tracker_env", SEED1, GOTCHA3, "the tracker's environment variables",
        "The Trainer's tracker callback takes its destination from environment variables such as "
        "`TRACKIO_PROJECT` and `TRACKIO_SPACE_ID`; set those and let the one callback log.",
        {2: "holds", 1: "partly", 0: "wrong"}[sum(bool(v) for v in read.values())],
        [f"Searched in the installed transformers integration and trackio: `TRACKIO_PROJECT` is read in "
         f"{read['TRACKIO_PROJECT'] or 'no file'}; `TRACKIO_SPACE_ID` in {read['TRACKIO_SPACE_ID']} ({space}). "
         f"The callback passes the project from the arguments ({project}); its default is \"huggingface\"."],
        "Keep the seed's advice of one session owned by the callback, but set the project with `project=` in "
        "`TrainingArguments`/`SFTConfig`; `TRACKIO_SPACE_ID` works as the seed says. @sec-gotchas runs both forms.",
        {"read_in": read, "space_line": space, "project_line": project},
    )  # fmt: skip


def checkpoint_size(seed_code: dict) -> Judgement:
    f = seed_code["full_step"]
    with torch.device("meta"):
        from transformers import SmolLM3ForCausalLM  # deferred: heavy, only this claim builds a model

        big = SmolLM3ForCausalLM(resolve_model_config("smollm3-3b"))
    est = estimate_checkpoint_bytes(big)
    off = f["checkpoint_bytes_on_disk"] / f["checkpoint_bytes_estimate"] - 1
    return Judgement(
        "checkpoint_size", SEED1, GOTCHA2, "the size of an FSDP checkpoint",
        "A 3B FSDP checkpoint holds the weights and the full fp32 Adam state: more than about 30 GB.",
        "holds" if est > 30 * 10**9 and abs(off) < 0.1 else "partly" if est > 30 * 10**9 else "wrong",
        [f"`smolfsdp.checkpoint.disk.estimate_checkpoint_bytes` for SmolLM3-3B (fp32 weights, the tied embedding "
         f"written under both names, AdamW m and v, 5 % for DCP's metadata): {gb(est)} ({gib(est)}).",
         f"Measured on the tiny model, 2 ranks: a DCP checkpoint of the model and AdamW state after one step is "
         f"{f['checkpoint_bytes_on_disk']:,} bytes on disk; the same estimate says "
         f"{f['checkpoint_bytes_estimate']:,} ({off:+.1%})."],
        f"Right as a floor: plan for about {gb(est)} per checkpoint, and check the free disk before training "
        "(the package does: `check_disk_space`).",
        {"estimate_3b": est, "tiny_on_disk": f["checkpoint_bytes_on_disk"], "tiny_estimate": f["checkpoint_bytes_estimate"]},
    )  # fmt: skip


def wrap_class_trainer(seed_code: dict | None = None) -> Judgement:
    """Through the Trainer, accelerate resolves the class names; ``seed_code`` (``run_seed_code``'s result)
    adds what torch's own ``fully_shard`` loop does with the wrong class (seed 2's code)."""
    from accelerate.utils import FullyShardedDataParallelPlugin  # deferred: heavy, only this claim
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy  # deferred with it

    from smolfsdp.gotchas.builders import tiny_model  # deferred: builds a model (torch, transformers)

    model, tried = tiny_model()[0], {}
    for version in (1, 2):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                transformer_cls_names_to_wrap="LlamaDecoderLayer")  # fmt: skip
        try:
            plugin.set_auto_wrap_policy(model) if version == 1 else fsdp2_prepare_auto_wrap_policy(
                plugin, model
            )
            tried[f"FSDP{version}"] = "accepted"
        except ValueError as err:
            tried[f"FSDP{version}"] = f"ValueError: {err}"
    lines = [
        source_line("accelerate.utils.dataclasses", "Could not find the transformer layer class"),
        source_line("accelerate.utils.fsdp_utils", "Could not find the transformer layer class"),
    ]
    evidence = [
        f"accelerate's plugin, given `LlamaDecoderLayer` for the tiny SmolLM3: FSDP1 "
        f'"{tried["FSDP1"]}", FSDP2 "{tried["FSDP2"]}" ({lines[0]}, {lines[1]}); the Trainer calls it '
        f"when it prepares the model ({source_line('accelerate.accelerator', 'set_auto_wrap_policy(model)')})."
    ]
    refused = all(v.startswith("ValueError") for v in tried.values())
    silent_loop = None
    if seed_code is not None:
        row = seed_code["seed2"]["seed, LlamaDecoderLayer"]
        silent_loop = row["fsdp_units"] == 1
        evidence.append(
            f"A hand-written loop is silent: seed 2's `isinstance(module, LlamaDecoderLayer)` loop on "
            f"2 ranks left {row['fsdp_units']} FSDP unit (the root), which gathers "
            f"{row['root_group_share']:.0%} of the model at once; it trained without a word."
        )
    return Judgement(
        "wrap_class_trainer", SEED1, CONFIG, "a wrong wrap class",
        "A wrap class the model does not have silently loses most of FSDP's memory savings.",
        "holds" if not refused else "partly" if silent_loop is not False else "wrong",
        evidence,
        "Through the Trainer (this seed's path) the pinned accelerate refuses a class name the model does not "
        "have, before training, so it is not silent. It is silent where the wrapping is hand-written, with "
        "torch's `transformer_auto_wrap_policy` or a `fully_shard` loop (seed 2): then the whole model is one "
        "unit. `smolfsdp.gotchas.cases_distributed.check_wrapping` counts the units and refuses that.",
        {"accelerate": tried, "lines": lines},
    )  # fmt: skip


def fsdp_config_table() -> pd.DataFrame:
    """Seed 1's ``fsdp_config`` keys as written, and what the installed TrainingArguments hands accelerate."""
    from smolfsdp.audit.seeds.installed_stack import trainer_fsdp_view  # deferred: imports transformers

    args, _ = trainer_fsdp_view(SEED_FSDP_CONFIG, SEED_FSDP_ARG)
    on, _ = trainer_fsdp_view({**SEED_FSDP_CONFIG, "fsdp_offload_params": True}, SEED_FSDP_ARG)
    plugin = {"version": "fsdp_version", "transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
              "backward_prefetch": "backward_prefetch", "state_dict_type": "state_dict_type",
              "offload_params": "cpu_offload"}  # fmt: skip
    rows = {}
    for key, value in SEED_FSDP_CONFIG.items():
        name = plugin[key.removeprefix("fsdp_")]
        got = (on if key == "fsdp_offload_params" else args).get(name, "(absent)")
        rows[key] = {"the seed writes": repr(value) if key != "fsdp_offload_params" else "False (True to offload)",
                     "read as": key.removeprefix("fsdp_"), "accelerate's plugin gets": f"{name} = {got}",
                     "effect": "ignored: no such key" if got == "(absent)" else "used"}  # fmt: skip
    return pd.DataFrame(rows).T


def _arg_text(value) -> str:
    """A plugin argument for a reader: a flag as its state (``on (True)``), anything else as written."""
    return f"{'on' if value else 'off'} ({value})" if isinstance(value, bool) else str(value)


def plugin_args_side_by_side(name: str = "smollm3_3b_medical") -> pd.DataFrame:
    """accelerate's FSDP plugin arguments as the installed TrainingArguments builds them from seed 1's
    ``fsdp_config`` (as written) and from the package's (``trainer_fsdp_config`` for the book's recipe)."""
    from smolfsdp.audit.seeds.installed_stack import trainer_fsdp_view  # deferred: imports transformers
    from smolfsdp.train.trl_engine import trainer_fsdp_config  # deferred: imports trl, the heaviest

    seed, seed_warn = trainer_fsdp_view(SEED_FSDP_CONFIG, SEED_FSDP_ARG)
    from smolfsdp.train.trl_engine import keep_fp32_buffers_and_reduce  # deferred with it

    cfg = load_config(recipe(name))
    ours, our_warn = trainer_fsdp_view(trainer_fsdp_config(cfg, "SmolLM3DecoderLayer", on_cpu=False))
    added = SimpleNamespace(fsdp_plugin_args=dict(ours))
    keep_fp32_buffers_and_reduce(added, cfg)  # what the package's engine adds to the plugin arguments
    ours = added.fsdp_plugin_args
    if "mixed_precision_policy" in ours:
        mp = ours["mixed_precision_policy"]
        ours["mixed_precision_policy"] = ", ".join(
            f"{f.split('_')[0]} {str(getattr(mp, f, None)).removeprefix('torch.')}"
            for f in ("param_dtype", "reduce_dtype", "buffer_dtype") if hasattr(mp, f)
        )  # fmt: skip
        seed["mixed_precision_policy"] = "(not set: accelerate fills bf16 for all from bf16=True)"
    keys = list(dict.fromkeys([*seed, *ours]))
    table = pd.DataFrame(
        {"seed 1 as written": [_arg_text(seed.get(k, "(not set)")) for k in keys],
         f"the package ({name})": [_arg_text(ours.get(k, "(not set)")) for k in keys]}, index=keys,
    )  # fmt: skip
    table.loc["warnings logged by TrainingArguments"] = [str(len(seed_warn)), str(len(our_warn))]
    return table
