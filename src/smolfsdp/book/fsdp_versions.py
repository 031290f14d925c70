"""FSDP1 vs FSDP2 for a reader: sharding tables with units, the dtype rule of each, LoRA state per GPU.

Used by the chapters "FSDP1 vs FSDP2" and "LoRA + FSDP2". The measurements come from
``smolfsdp.probes.mechanics`` (two ranks, each version) and ``smolfsdp.probes.dtype_rule`` (one rank); the
SmolLM3-3B numbers from ``smolfsdp.estimate.memory`` (an estimate, stated as one).

    python -c "from smolfsdp.book.fsdp_versions import lora_state_table; print(lora_state_table())"
"""

from __future__ import annotations

import pandas as pd

from smolfsdp.book.tables import gib_text, placement_text
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import LoraSpec
from smolfsdp.estimate.recipe_peak import BOOK_RECIPE, recipe_peak, settings_line

GIB = 2**30
CASE_TEXT = {
    "frozen_bf16_beside_trainable_fp32": "frozen bf16 weight beside trainable fp32 weights, one unit",
    "trainable_fp32_and_bf16_same_group": "trainable fp32 and trainable bf16 weights, one unit",
    "trainable_fp32_and_bf16_own_groups": "trainable fp32 and bf16 weights, each dtype its own unit",
}


def _shape(shape) -> str:
    return " x ".join(f"{n:,}" for n in shape)


def fsdp1_sharding_view(rows: list[dict]) -> pd.DataFrame:
    """``describe_flat_parameters`` records (one rank) as a reader's table: one row per FSDP unit."""
    d = pd.DataFrame(rows)
    return pd.DataFrame(
        {
            "FSDP unit": d["name"],
            "type": d["type"],
            "original parameters inside": d["original_params"].map("{:,}".format),
            "elements, whole unit": d["global_numel"].map("{:,}".format),
            "elements held by this rank": d["local_numel"].map("{:,}".format),
            "padding (elements)": d["padding"].map("{:,}".format),
            "dtype": d["dtype"],
        }
    ).set_index("FSDP unit")


def fsdp2_sharding_view(rows: list[dict], limit: int = 10) -> pd.DataFrame:
    """``describe_sharding`` records (one rank), the first ``limit`` parameters, shapes as ``a x b``."""
    d = pd.DataFrame(rows).head(limit)
    return pd.DataFrame(
        {
            "parameter": d["name"],
            "type": d["type"],
            "placement": d["placement"].map(placement_text),
            "shape held by this rank": d["local_shape"].map(_shape),
            "full shape": d["global_shape"].map(_shape),
        }
    ).set_index("parameter")


def _version_column(ranks: list[dict]) -> dict[str, str]:
    r0, r1 = ranks
    sd = r0["state_dict"]
    freeze = {k: "works" if x["ok"] else x["error"] for k, x in r0["freeze_one_param"].items()}
    return {
        "parameter type": r0["sharding"][0]["type"],
        "parameter bytes, rank 0 / rank 1": f"{r0['param_bytes']:,} / {r1['param_bytes']:,}",
        "Adam state bytes, rank 0": f"{r0['optimizer_bytes']:,}",
        "sharded state dict: value type": sd["value_type"],
        f"sharded state dict: {sd['example_key']}, rank 0's shape of the full one": (
            f"{_shape(sd['local_shape'])} of {_shape(sd['global_shape'])}"
        ),
        "collectives to build the sharded state dict": f"{sd['collectives']:,}",
        **{f"freeze one weight ({k})": text for k, text in freeze.items()},
    }


def versions_table(results: dict[int, list[dict]]) -> pd.DataFrame:
    """FSDP1 beside FSDP2 from ``measure_mechanics`` runs (``{1: [rank0, rank1], 2: [...]}``): parameter
    type, bytes per rank (parameters, Adam state), what a sharded state dict holds for one attention
    weight (its key, value type, rank 0's shape of the full one) and the collectives it cost, and whether
    freezing one weight inside a unit works (the error text when it does not). One column per version;
    "does not apply" where a version has no such row."""
    table = pd.DataFrame({f"FSDP{v}": _version_column(results[v]) for v in sorted(results)})
    return table.fillna("does not apply")


def dtype_rule_table(results: list[dict]) -> pd.DataFrame:
    """``check_dtype_rule`` results, one row per case, one column per FSDP version: "trains" or the refusal."""
    table = {}
    for r in results:
        table.setdefault(r["fsdp"], {})[CASE_TEXT[r["case"]]] = (
            "trains" if r["ok"] else f"refused: {r['error']}"
        )
    return pd.DataFrame(table)[["FSDP1", "FSDP2"]].rename_axis("parameters in the model")


def lora_state_gib(cfg: str = BOOK_RECIPE, **overrides) -> pd.DataFrame:
    """Estimated GiB (floats) per GPU of parameter shards, gradients, Adam state and the device peak, for full
    fine-tuning and LoRA (r=8, q/k/v/o) under FSDP1 and FSDP2, at the settings of the run recipe ``cfg``
    (``smolfsdp.estimate.recipe_peak``: the book's FSDP1 full fine-tune, FULL_SHARD on 2 GPUs; ``overrides``
    change any setting) with only the FSDP version and LoRA varied. The peak is
    :func:`~smolfsdp.estimate.recipe_peak.recipe_peak` with ``include="device"`` (tensors + CUDA context and NCCL
    buffers), the number every chapter quotes for these settings; ``attrs["settings"]`` is its settings line.
    FSDP1's LoRA gradient covers every FlatParameter that holds an adapter."""
    rows, line = {}, ""
    for version in (1, 2):
        for lora in (False, True):
            peak = recipe_peak(cfg, include="device", fsdp_version=version, lora=LoraSpec() if lora else None,
                               **overrides)  # fmt: skip
            e = peak.estimate
            rows[(f"FSDP{version}", "LoRA" if lora else "full fine-tune")] = {
                "parameter shards (GiB)": e.params_bytes,
                "gradients (GiB)": e.grads_bytes,
                "Adam m + v (GiB)": e.optimizer_bytes,
                "peak per GPU (GiB)": peak.bytes,
            }
            line = settings_line({**peak.settings, "fsdp_version": 1, "lora": None}, "device")
    table = pd.DataFrame(rows).T / GIB
    table.index = table.index.set_names(["FSDP", "training"])
    both = line.replace("FSDP1 ", "FSDP1 and FSDP2, ", 1).replace(
        "full fine-tune", "full fine-tune and LoRA r=8"
    )
    table.attrs["settings"] = both
    return table


def lora_state_table(**kwargs) -> pd.DataFrame:
    """:func:`lora_state_gib` as the book shows it: GiB with thousands separators and
    :data:`smolfsdp.book.tables.GIB_DECIMALS` decimals (``kwargs`` go to it)."""
    gib = lora_state_gib(**kwargs)
    out = gib.map(gib_text)
    out.attrs = gib.attrs
    return out


def lora_gradient_gib(model="smollm3-3b", world_size: int = 2) -> dict[str, float]:
    """Estimated LoRA gradient GiB per GPU under each version (the number the chapters quote)."""
    return {
        f"FSDP{v}": estimate_memory(model, world_size=world_size, lora=True, fsdp_version=v).grads_bytes / GIB
        for v in (1, 2)
    }
