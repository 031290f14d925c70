"""The full-size dry run in the book: the committed grid (``data/results/dryrun/grid.json``) as tables and a figure.

Appendix "How the estimates are checked" (``notebooks/appendix_checks.ipynb``), and chapters "Reading the profiler"
and "What the seeds say". ``scripts/dryrun_grid.py`` writes the file (provenance inside); each number
here is read from it or from ``smolfsdp.measure`` (the estimate), never typed. Traced on fake tensors, not
measured on a GPU: every view says so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from smolfsdp.book.figures import palette
from smolfsdp.estimate.params import LoraSpec
from smolfsdp.estimate.recipe_peak import (
    moment_words,
    recipe_peak,
    settings_from_setup,
    settings_line,
    traced_moment,
)
from smolfsdp.estimate.recompute import recompute_share
from smolfsdp.paths import repo_root

GIB = 2**30
GRID = Path("data/results/dryrun/grid.json")
#: the book's full fine-tune recipe exactly as configured, traced (``scripts/dryrun_grid.py --grid recipe``)
RECIPE_TRACE = Path("data/results/dryrun/recipe.json")
#: What the grid's numbers come from: a change here since the traced commit may change a row.
TRACED_CODE = (
    "src/smolfsdp/audit/dryrun",
    "src/smolfsdp/sharding",
    "src/smolfsdp/models",
    "src/smolfsdp/measure",
)
PHASE_COLOURS = palette.PHASE  # the same phase colours as every other figure


def load_grid(path: str | Path | None = None) -> dict | None:
    """The committed grid (``{"provenance": ..., "runs": [...]}``), or None when the file is absent."""
    p = Path(path) if path else repo_root() / GRID
    return json.loads(p.read_text()) if p.is_file() else None


def load_recipe_trace() -> dict | None:
    """The committed trace of the book's full fine-tune recipe as configured (its one row), or None when absent."""
    p = repo_root() / RECIPE_TRACE
    return json.loads(p.read_text())["runs"][0] if p.is_file() else None


def signed(value: float, digits: int) -> str:
    """``value`` with its sign to ``digits`` decimals (``+1.25``, ``-0.40``); one that rounds to zero is
    ``0.00``, never ``-0.00`` or ``+0.00`` (an error of -0.001 % is no error at that precision)."""
    text = f"{value:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def _peak_row(run: dict) -> dict:
    return next(r for r in run["estimate_vs_dry_run"] if r["component"].startswith("peak"))


def _axes(run: dict) -> tuple[str, str]:
    """``("FSDP1 full, AC on", "2x2048 W2")``: the setup's kind and its shape, read from what ran."""
    s = run["setup"]
    kind = f"FSDP{s['fsdp_version']} {'LoRA' if s['lora'] else 'full'}, AC {'on' if s['activation_checkpointing'] else 'off'}"
    return kind, f"{s['per_device_train_batch_size']}x{s['max_length']} W{s['world_size']}"


def error_pivot(grid: dict) -> pd.DataFrame:
    """The estimated peak's error (%, signed: negative where the estimate is low) for every setup of the
    grid: one row per kind (FSDP version, full or LoRA, checkpointing), one column per shape and world size."""
    rows = [
        {"setup": k, "shape": sh, "error": _peak_row(r)["error_pct"]}
        for r in grid["runs"]
        for k, sh in [_axes(r)]
    ]
    table = pd.DataFrame(rows).pivot(index="setup", columns="shape", values="error")
    ordered = sorted(table.columns, key=lambda c: (int(c.split("x")[1].split()[0]), int(c.split("W")[1])))
    return table[ordered].map(lambda e: signed(e, 2) if pd.notna(e) else "not run").rename_axis(None, axis=1)


def grid_table(grid: dict, book_only: bool = False) -> pd.DataFrame:
    """One row per setup: traced peak and its moment, the estimate's peak and moment, the error, static terms.
    ``book_only``: the book's two recipes only."""
    rows = []
    for run in grid["runs"]:
        if book_only and not run["label"].startswith("book:"):
            continue
        peak = _peak_row(run)
        static = [r for r in run["estimate_vs_dry_run"] if not r["component"].startswith("peak")]
        rows.append({
            "setup": run["label"],
            "traced peak (GiB)": run["peak_bytes"] / GIB,
            "traced moment": traced_moment(run["peak_moment"]),
            "estimated peak (GiB)": peak["estimate_gib"],
            "estimated moment": peak["component"].removeprefix("peak (").removesuffix(" moment)"),
            "error": f"{signed(peak['error_pct'], 1)} %",
            "static terms": "exact" if all(r["error_pct"] == 0 for r in static) else "differ",
        })  # fmt: skip
    return pd.DataFrame(rows)


def grid_reading(grid: dict) -> str:
    """A sentence counted from the grid: static terms exact in how many setups, the largest peak error."""
    table = grid_table(grid)
    errors = [(abs(_peak_row(r)["error_pct"]), r["label"]) for r in grid["runs"]]
    worst, where = max(errors)
    within = sum(e <= 3 for e, _ in errors)
    exact = (table["static terms"] == "exact").sum()
    return (
        f"Parameters, gradients and AdamW state equal the estimate to the byte in {exact} of {len(table)} setups. "
        f"The estimated peak, taken at the moment it happens, is within 3 % of the traced one in {within} of "
        f"{len(errors)}; the largest error is {worst:.1f} % ({where})."
    )


def changed_since(sha: str, root: Path | None = None) -> list[str] | None:
    """The files of :data:`TRACED_CODE` that differ between commit ``sha`` and the working tree, or None when
    git cannot tell (no git, or a shallow clone without that commit)."""
    try:
        out = subprocess.run(["git", "diff", "--name-only", sha, "--", *TRACED_CODE], cwd=root or repo_root(),
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted(out.stdout.split()) if out.returncode == 0 else None


def currency_line(grid: dict, root: Path | None = None) -> str:
    """Whether the grid is current: the traced code unchanged since the commit(s) it was traced at, or how many
    of its files changed and what checks the rows meanwhile (five setups traced again by the test suite)."""
    shas = sorted({r.get("git_sha", grid["provenance"]["git_sha"]) for r in grid["runs"]})
    changed = [changed_since(sha, root) for sha in shas]
    rerun = "`python scripts/dryrun_grid.py --workers 2` traces all 48 again"
    if any(c is None for c in changed):
        return (f"Whether the traced code changed since can not be told here (no git history of commit "
                f"{shas[0][:7]}); {rerun}.")  # fmt: skip
    files = sorted({f for c in changed for f in c})
    if not files:
        return f"The grid is current: the code it traced ({', '.join(TRACED_CODE)}) is unchanged since."
    return (f"The traced code changed since in {len(files)} file{'s' * (len(files) != 1)} "
            f"({', '.join(Path(f).name for f in files[:4])}{', ...' if len(files) > 4 else ''}); the test suite "
            "traces five of the setups again on every change and holds them to the committed rows byte for byte "
            f"(tests/test_dryrun.py), so the grid is current for those; {rerun}.")  # fmt: skip


def provenance_line(grid: dict, root: Path | None = None) -> str:
    """Where the grid comes from (command, date, commits, versions) and whether it is current
    (:func:`currency_line`)."""
    p = grid["provenance"]
    shas = sorted({r.get("git_sha", p["git_sha"])[:7] for r in grid["runs"]})
    commits = f"commit {shas[0]}" if len(shas) == 1 else f"commits {', '.join(shas)}, each row naming its own"
    return (f"Traced by `{p['command']}` on {p['date'][:10]} ({commits}, torch {p['torch']}, "
            f"transformers {p['transformers']}, {p['machine']}): {grid['runs'][0]['what'].rstrip('.')}. "
            + currency_line(grid, root))  # fmt: skip


def traced_settings_line(run: dict) -> str:
    """The settings line (``smolfsdp.estimate.recipe_peak.settings_line``) of a grid row: tensors only."""
    return settings_line(settings_from_setup(run["setup"]), "tensors")


def book_peak_lines(grid: dict) -> list[str]:
    """The book recipe's peak as this chapter shows it, each number beside its settings: the grid's traced row
    (one micro-batch per step), the estimate at those settings, and the recipe as configured (its gradient
    accumulation), tensors only and with the CUDA context and NCCL buffers: the same
    ``recipe_peak`` numbers the other chapters and ``smolfsdp dryrun`` quote for the same settings."""
    run = next(r for r in grid["runs"] if r["label"].startswith("book: full fine-tune"))
    # the estimate at the traced row's own settings, its loss and AdamW step included (the committed rows went
    # through transformers' loss and a foreach AdamW, the native engine's: settings_from_setup says which)
    traced = {
        k: settings_from_setup(run["setup"])[k]
        for k in ("gradient_accumulation_steps", "loss_path", "adamw", "packing")
    }
    one = recipe_peak(**traced)
    recipe, device = recipe_peak(), recipe_peak(include="device")
    traced = moment_words(traced_moment(run["peak_moment"]))
    lines = [
        f"- traced (fake tensors): **{run['peak_bytes'] / GIB:,.2f} GiB** at {traced}; settings: "
        f"{traced_settings_line(run)}",
        f"- estimated, same settings: **{one.gib:,.2f} GiB** at {moment_words(one.moment)}",
        f"- estimated, the recipe as configured: **{recipe.gib:,.2f} GiB** at {moment_words(recipe.moment)}; "
        f"settings: {recipe.settings_line}",
    ]
    if (whole := load_recipe_trace()) is not None:  # the recipe as configured, traced (its own settings line)
        lines.append(f"- traced (fake tensors), the recipe as configured: **{whole['peak_bytes'] / GIB:,.2f} GiB** "
                     f"at {moment_words(traced_moment(whole['peak_moment']))}; settings: {traced_settings_line(whole)}")  # fmt: skip
    return lines + [
        f"- estimated, the recipe on a GPU: **{device.gib:,.2f} GiB** at {moment_words(device.moment)}; "
        f"settings: {device.settings_line}",
    ]


def plot_step_memory(run: dict) -> go.Figure:
    """Rank 0's tensor bytes over one traced step: a point after each decoder layer's forward and backward."""
    series = pd.DataFrame(run["series"])
    fig = go.Figure()
    for phase, part in series.groupby("phase", sort=False):
        fig.add_trace(go.Scatter(
            x=part["i"], y=part["bytes"] / GIB, mode="markers", name=phase,
            marker={"color": PHASE_COLOURS.get(phase, palette.TRACE_CATEGORY["other"]), "size": 6},
            text=part["module"] + " " + part["event"], hovertemplate="%{text}: %{y:.2f} GiB<extra></extra>",
        ))  # fmt: skip
    fig.add_hline(y=run["peak_bytes"] / GIB, line_dash="dot", annotation_text="traced peak")
    fig.update_layout(
        title={"text": f"{run['label']}: tensor bytes on rank 0 over one step", "font": {"size": 14}},
        xaxis_title="event (after each layer's forward, then backward)", yaxis_title="GiB",
        margin={"t": 70}, legend={"orientation": "h", "y": -0.25},
    )  # fmt: skip
    return fig


def flops_table(grid: dict) -> pd.DataFrame:
    """Counted FLOPs per step over the MFU formula's model FLOPs (6N + 12·L·H·Q·T per token), one row per
    kind of setup, one column per sequence length (on 2 ranks: the world size changes neither count)."""
    rows = [{"setup": k, "tokens": f"{r['setup']['max_length']:,} tokens",
             "counted / formula": r["flops_counted"] / r["flops_formula"]}
            for r in grid["runs"] if r["setup"]["world_size"] == 2 for k, _ in [_axes(r)]]  # fmt: skip
    return (
        pd.DataFrame(rows)
        .pivot(index="setup", columns="tokens", values="counted / formula")
        .rename_axis(None, axis=1)
    )


def add_dry_run_evidence(judged: list, grid: dict | None) -> list:
    """Append the dry run's sentence to the seed claims about per-GPU memory on 2 GPUs (``per_gpu_memory``,
    ``fit_table``: what one step of the book's full fine-tune recipe traced on rank 0, as configured when
    :func:`load_recipe_trace` has it, else the grid's one-micro-batch row) and about the whole model's 36-42 GB
    (``full_model_memory``: the state both ranks hold after it). Returns ``judged``."""
    if not grid:
        return judged
    # the recipe as configured when its trace is committed (the claims' own estimate), else the grid's row
    run = load_recipe_trace() or next(
        r for r in grid["runs"] if r["label"].startswith("book: full fine-tune")
    )
    held, steps = sum(run["held_bytes"].values()), run["setup"]["gradient_accumulation_steps"]
    sentence = (
        f"The full-size dry run (traced on fake tensors, not a GPU measurement) of one step of the book's full "
        f"fine-tune recipe with {steps} micro-batch{'es' if steps > 1 else ''} per step on 2 ranks peaks at "
        f"{run['peak_bytes'] / GIB:.1f} GiB of "
        f"tensors on rank 0, at {moment_words(traced_moment(run['peak_moment']))}, and holds {held / GIB:.1f} GiB "
        f"of parameter, gradient and AdamW shards after it (settings: {traced_settings_line(run)}); a GPU adds its "
        "CUDA context and NCCL buffers."
    )
    params = run["setup"]["parameters"]
    whole = (
        f"The full-size dry run (traced on fake tensors, not a GPU measurement) holds {held / GIB:.1f} GiB of "
        f"parameter, gradient and AdamW shards per rank after one step on 2 ranks: "
        f"{held * run['setup']['world_size'] / GIB:.1f} GiB for the whole model, "
        f"{held * run['setup']['world_size'] / params:.1f} bytes per parameter, before any activation."
    )
    for claim in judged:
        if claim.key in ("per_gpu_memory", "fit_table"):
            claim.evidence.append(sentence)
            claim.values["dry_run_peak_bytes"] = run["peak_bytes"]
        elif claim.key == "full_model_memory":
            claim.evidence.append(whole)
            claim.values["dry_run_static_bytes"] = held * run["setup"]["world_size"]
    return judged


def comm_check_table(grid: dict, only_shape: tuple[int, bool] | None = (2048, True)) -> pd.DataFrame:
    """Per setup and kind: the all-gathers and reduce-scatters one rank traced in a step beside
    ``smolfsdp.estimate.comm.estimate_collectives`` for the same setup (count and full-tensor GiB).
    ``only_shape``: ``(max_length, activation checkpointing)`` of the setups shown (None: every full
    fine-tune setup; sequence length and checkpointing change no collective)."""
    from smolfsdp.estimate.comm import (
        estimate_collectives,
    )  # deferred: only this view needs the model's units

    rows = []
    for run in grid["runs"]:
        s = run["setup"]
        if s["lora"]:
            continue  # the communication model is written for full fine-tuning (every parameter reduced)
        if only_shape and (s["max_length"], s["activation_checkpointing"]) != only_shape:
            continue
        model = estimate_collectives(
            "smollm3-3b", strategy=s["sharding_strategy"], n_gpus=s["world_size"], fsdp_version=s["fsdp_version"],
            mixed_precision=s["mixed_precision"], gradient_accumulation_steps=s["gradient_accumulation_steps"],
        )  # fmt: skip
        for kind in ("all-gather", "reduce-scatter"):
            traced = [
                c for c in run["collectives"] if c["kind"] == kind and c["phase"] in ("forward", "backward")
            ]
            m = model[model["kind"] == kind]
            count, nbytes = sum(c["count"] for c in traced), sum(c["bytes"] for c in traced)
            m_count, m_bytes = int(m["count"].sum()), int((m["count"] * m["logical_bytes"]).sum())
            rows.append({"setup": run["label"], "ranks": s["world_size"], "kind": kind,
                         "count (traced / model)": f"{count} / {m_count}",
                         "GiB (traced / model)": f"{nbytes / GIB:,.3f} / {m_bytes / GIB:,.3f}",
                         "equal": "yes" if (count, nbytes) == (m_count, m_bytes) else "no"})  # fmt: skip
    return pd.DataFrame(rows)


def flops_reading(grid: dict) -> str:
    """What the FLOP table says, counted from it: the ratio's range without and with checkpointing, FSDP1's
    LoRA setups apart (their frozen weights get gradients too)."""
    runs = grid["runs"]
    fsdp1_lora = [r for r in runs if r["setup"]["lora"] and r["setup"]["fsdp_version"] == 1]
    rest = [r for r in runs if r not in fsdp1_lora]
    parts = []
    for ac, what in ((False, "without activation checkpointing"), (True, "with it")):
        ratios = [
            r["flops_counted"] / r["flops_formula"]
            for r in rest
            if r["setup"]["activation_checkpointing"] is ac
        ]
        if ratios:
            parts.append(f"{what} {min(ratios):.3f} to {max(ratios):.3f}")
    text = (
        "Counted over formula, "
        + "; ".join(parts)
        + ". Without checkpointing the excess is what the attention "
        "backward computes again (the scores `Q·K^T`, 2·L·H·Q·T per token), which model FLOPs leave out by "
        "definition (`tests/test_dryrun.py` checks it to 0.1 %). "
        + recompute_reading([r for r in rest if r["setup"]["activation_checkpointing"]])
    )
    if fsdp1_lora:
        ratios = [r["flops_counted"] / r["flops_formula"] for r in fsdp1_lora]
        text += (
            f" FSDP1 with LoRA ({min(ratios):.2f} to {max(ratios):.2f}) is apart: a layer's FlatParameter holds adapters, so it needs a gradient "
            "and the frozen weights viewed from it get theirs computed too (6 FLOPs per parameter and token, where "
            "the formula counts 4 for a frozen weight), and the gradient is thrown away."
        )
    return text


def recompute_reading(runs: list[dict]) -> str:
    """What checkpointing adds to the grid's ``runs`` (those with activation checkpointing), computed by
    ``smolfsdp.estimate.recompute.recompute_share`` for each run's model, sequence, mode and LoRA: the share of
    the decoder layers' forward FLOPs the backward recomputes (not all of it: torch's checkpoint stops before
    each layer's last matmul) and of the step's model FLOPs."""
    shares = [
        recompute_share(
            r["setup"]["model"], r["setup"].get("ac_mode") or "full", r["setup"].get("ac_every"),
            seq_len=r["setup"]["max_length"], lora=LoraSpec() if r["setup"]["lora"] else None,
        )
        for r in runs
    ]  # fmt: skip
    if not shares:
        return ""

    def span(key: str) -> str:
        lo, hi = min(s[key] for s in shares), max(s[key] for s in shares)
        return f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%} to {hi:.0%}"

    return (
        f"With checkpointing the backward recomputes {span('of_forward')} of the decoder layers' forward "
        "FLOPs, not the whole forward (torch's checkpoint stops before each layer's last matmul: "
        f"`smolfsdp.estimate.recompute`), {span('of_step')} more than the step's model FLOPs: hardware FLOPs "
        "the GPU spends, not model FLOPs, so an MFU from the formula reads lower than how busy the GPU is by "
        "that ratio."
    )


#: The shapes grid (issue 31): SmolLM3-3B, Llama 3.2 1B, Qwen2.5-1.5B and Llama 3.1 8B (untied) at short and long
#: sequences.
SHAPES = Path("data/results/dryrun/shapes.json")


def load_shapes(path: str | Path | None = None) -> dict | None:
    """The committed shapes grid (``scripts/dryrun_grid.py --grid shapes``), or None when the file is absent."""
    return load_grid(path or repo_root() / SHAPES)


def shapes_table(grid: dict) -> pd.DataFrame:
    """One row per setup of the shapes grid, indexed by model: the setup, its shape (rows x tokens, ranks), the
    traced and estimated peaks (GiB), the estimate's moment and its signed error (%): 6 columns and the index."""
    rows = []
    for run in grid["runs"]:
        peak, (kind, shape) = _peak_row(run), _axes(run)
        rows.append({
            "model": run["label"].split(" FSDP")[0],
            "setup": kind,
            "shape": shape,
            "traced peak (GiB)": run["peak_bytes"] / GIB,
            "estimated peak (GiB)": peak["estimate_gib"],
            "estimated moment": peak["component"].removeprefix("peak (").removesuffix(" moment)"),
            "error": f"{signed(peak['error_pct'], 2)} %",
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("model")


def shapes_reading(grid: dict) -> str:
    """A sentence counted from the shapes grid: how many setups are within 3 %, the largest error and where."""
    errors = [(abs(_peak_row(r)["error_pct"]), _peak_row(r)["error_pct"], r["label"]) for r in grid["runs"]]
    _, worst, where = max(errors)
    models = sorted({r["label"].split(" FSDP")[0] for r in grid["runs"]})
    within = sum(e <= 3 for e, _, _ in errors)
    return (
        f"Over {len(models)} models ({', '.join(models)}), the estimated peak is within 3 % of the traced one in "
        f"{within} of {len(errors)} setups; the largest error is {signed(worst, 2)} % ({where})."
    )
