"""Figures and tables of FSDP's mechanisms, from the step probe and the package's models.

Chapter "FSDP mechanics" (``notebooks/02_fsdp_mechanics.ipynb``). Inputs: the one-step recordings of
``smolfsdp.probes.step`` (measured on 2 CPU ranks) and the pure models ``smolfsdp.estimate.comm`` and
``smolfsdp.measure.benchmark``. ``plot_*`` return plotly Figures; ``*_table`` return DataFrames shaped for a
reader (units in the column names, numbers as text with thousands separators).

    python -c "from smolfsdp.book.figures.mechanisms import comm_volume_table as t; print(t())"
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smolfsdp.book.figures import palette, plotting  # noqa: F401  (plotting sets the notebook renderer)
from smolfsdp.book.tables import gib_text, placement_text
from smolfsdp.estimate.comm import estimate_collectives
from smolfsdp.estimate.flops import flops_per_token
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import count_parameters, resolve_model_config
from smolfsdp.estimate.recipes import GIB
from smolfsdp.estimate.recompute import recompute_flops_per_token
from smolfsdp.probes.step import MEMORY_STEPS, PHASES, unit_of

MIB = 2**20
KIND_COLORS = {k: palette.COLLECTIVE[k] for k in ("all-gather", "reduce-scatter", "all-reduce")}
PHASE_COLORS = {k: palette.PHASE[k] for k in ("forward", "loss", "backward", "optimizer")}  # drawn faint
SHORT = {"all-gather": "AG", "reduce-scatter": "RS", "all-reduce": "AR"}


def _inside(e: dict, outer: dict) -> bool:
    return outer["start_us"] <= e["start_us"] <= outer["start_us"] + outer["dur_us"]


def attribute_collectives(events: list[dict]) -> pd.DataFrame:
    """One row per collective of a recorded step: ``kind``, ``phase`` (the step phase it ran in),
    ``unit`` (the innermost FSDP annotation around it that names a unit: ``root`` or ``model.layers.i``),
    ``start_ms``, ``dur_ms``. Raises ValueError when the events hold no step phases."""
    phases = [e for e in events if e["kind"] == "phase"]
    if not phases:
        raise ValueError("no step phases in the events: record them with smolfsdp.probes.step.")
    units = [
        {**e, "unit": unit_of(e["name"])} for e in events if e["kind"] == "annotation" and unit_of(e["name"])
    ]
    rows = []
    for e in events:
        if e["kind"] not in KIND_COLORS:
            continue
        around = [u for u in units if _inside(e, u)]
        unit = max(around, key=lambda u: u["start_us"])["unit"] if around else "outside FSDP"
        phase = next((p["name"] for p in phases if _inside(e, p)), "between phases")
        rows.append(
            {"kind": e["kind"], "phase": phase, "unit": unit, "start_ms": e["start_us"] / 1e3,
             "dur_ms": e["dur_us"] / 1e3}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=["kind", "phase", "unit", "start_ms", "dur_ms"])


def collective_counts(events: list[dict]) -> dict[str, int]:
    """``{"all-gather in forward": 5, ...}``: what :func:`plot_step_timeline` draws, counted."""
    df = attribute_collectives(events)
    return {f"{k} in {p}": int(n) for (k, p), n in df.groupby(["kind", "phase"], sort=False).size().items()}


def _lane(unit: str) -> str:
    return "root" if unit == "root" else unit.replace("model.layers.", "layer ")


def _unit_spans(events: list[dict]) -> list[tuple[str, str, float, float]]:
    """Where each unit computes: from the end of its pre-forward (pre-backward) to the start of its
    post-forward (post-backward reduce). Returns (lane, "fwd"/"bwd", start_ms, end_ms)."""
    by = {
        (e["name"].split(" (")[0], e["unit"]): e
        for e in events
        if e["kind"] == "annotation" and e.get("unit")
    }
    out = []
    for (name, unit), e in by.items():
        pairs = {"FSDP::pre_forward": ("FSDP::post_forward", "fwd"), "FSDP::pre_backward": ("FSDP::post_backward_reduce", "bwd")}  # fmt: skip
        if name in pairs and (pairs[name][0], unit) in by:
            end = by[(pairs[name][0], unit)]["start_us"]
            out.append((_lane(unit), pairs[name][1], (e["start_us"] + e["dur_us"]) / 1e3, end / 1e3))
    return out


def plot_step_timeline(events: list[dict], title: str = "One FSDP2 step on rank 0") -> go.Figure:
    """A lane for the step's phases and one per FSDP unit; each collective a labelled block (AG, RS) in its
    unit's lane, at least 3% of the step wide so that short ones stay visible (hover: the real duration);
    compute-coloured blocks where a unit computes; the phases shaded across every lane (``palette``). ``events`` from
    ``smolfsdp.probes.step``."""
    df = attribute_collectives(events)
    phases = [e for e in events if e["kind"] == "phase"]
    span = max(p["start_us"] + p["dur_us"] for p in phases) / 1e3
    min_w = 0.03 * span
    lanes = ["step"] + sorted({_lane(u) for u in df["unit"]}, key=lambda s: (s != "root", s))
    fig, seen = go.Figure(), set()

    def add(lane, start, width, color, text, hover, legend):
        fig.add_trace(_block(lane, start, width, color, text, hover, legend, legend not in seen))
        seen.add(legend)

    for p in phases:
        t0, dur = p["start_us"] / 1e3, p["dur_us"] / 1e3
        add("step", t0, dur, PHASE_COLORS[p["name"]], p["name"], f"{p['name']}: {dur:.1f} ms", "step phase")
        fig.add_vrect(x0=t0, x1=t0 + dur, fillcolor=PHASE_COLORS[p["name"]], opacity=0.12, line_width=0)
    for lane, what, t0, t1 in _unit_spans(events):
        add(
            lane,
            t0,
            t1 - t0,
            palette.TRACE_CATEGORY["compute"],
            "",
            f"{lane} computes ({what})",
            "the unit computes",
        )
    for _, r in df.iterrows():
        hover = f"{r['kind']} of {r['unit']} in {r['phase']}: {r['dur_ms']:.3f} ms"
        add(_lane(r["unit"]), r["start_ms"], max(r["dur_ms"], min_w), KIND_COLORS[r["kind"]], SHORT[r["kind"]], hover, r["kind"])  # fmt: skip
    fig.update_layout(
        title=title, barmode="overlay", template="plotly_white", legend={"orientation": "h", "y": -0.3},
        xaxis_title="time since the step began (ms)", height=200 + 40 * len(lanes),
        yaxis={"categoryorder": "array", "categoryarray": lanes[::-1]}, margin={"l": 70, "r": 20, "b": 100},
    )  # fmt: skip
    return fig


def _block(lane, start, width, color, text, hover, legend, show) -> go.Bar:
    return go.Bar(
        y=[lane], x=[width], base=[start], orientation="h", marker={"color": color, "line": {"width": 0}},
        text=[text], textposition="inside", insidetextanchor="middle", textangle=0, constraintext="none",
        textfont={"size": 10, "color": "#222"}, hovertext=[hover], hoverinfo="text", width=0.7,
        name=legend, legendgroup=legend, showlegend=show,
    )  # fmt: skip


def plot_step_memory(results: list[dict], title: str = "Memory of one step on rank 0") -> go.Figure:
    """Allocator bytes above the step's start (MiB) over time, one row per probe variant, the step's
    phases shaded: forward climbs (activations, gathered layers), backward frees."""
    fig = make_subplots(rows=len(results), cols=1, shared_yaxes=True, vertical_spacing=0.12,
                        subplot_titles=[r["variant"] for r in results])  # fmt: skip
    for i, r in enumerate(results, start=1):
        base = r["memory"][0][1]
        fig.add_trace(
            go.Scatter(
                x=[t / 1e3 for t, _ in r["memory"]], y=[(b - base) / MIB for _, b in r["memory"]],
                mode="lines", line={"shape": "hv", "color": palette.SOURCE["measured"]}, showlegend=False,
                hovertemplate="%{x:.1f} ms: %{y:.2f} MiB<extra></extra>",
            ),
            row=i, col=1,
        )  # fmt: skip
        # after the trace: plotly skips shapes on a subplot that has no trace yet
        for p in (e for e in r["events"] if e["kind"] == "phase"):
            fig.add_vrect(x0=p["start_us"] / 1e3, x1=(p["start_us"] + p["dur_us"]) / 1e3, fillcolor=PHASE_COLORS[p["name"]],
                          opacity=0.2, line_width=0, row=i, col=1)  # fmt: skip
        fig.update_yaxes(title_text="MiB", row=i, col=1)
    fig.update_xaxes(
        title_text="time since the step began (ms); shaded: " + ", ".join(PHASES), row=len(results)
    )
    fig.update_layout(
        title=title, template="plotly_white", height=180 + 190 * len(results), margin={"l": 60, "r": 20}
    )
    return fig


def probe_table(results: list[dict]) -> pd.DataFrame:
    """One row per variant of the step probe: collectives, their bytes, the measured peak of the drawn step
    and its range over the probe's steady steps (the noise any difference between variants must beat),
    and the loss."""
    rows = []
    for r in results:
        coll = pd.DataFrame(r["collectives"])
        n = coll.groupby("kind").size()
        b = coll.groupby("kind")["bytes"].sum()
        rows.append(
            {
                "variant": r["variant"],
                "layers / root resharded after forward": f"{_yes(r['layers_reshard_after_forward'])} / "
                f"{_yes(r['root_reshard_after_forward'])}",
                "all-gathers": int(n.get("all-gather", 0)),
                "reduce-scatters": int(n.get("reduce-scatter", 0)),
                "all-gathered (KiB)": f"{b.get('all-gather', 0) / 1024:,.0f}",
                "peak above step start (KiB)": f"{r['peak_above_start_bytes'] / 1024:,.0f}",
                f"peak over {MEMORY_STEPS} steps (KiB)": " – ".join(
                    f"{b / 1024:,.0f}" for b in r["peak_above_start_range_bytes"]
                ),
                "loss": f"{r['loss']:.6f}",
            }
        )
    return pd.DataFrame(rows).set_index("variant")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def probe_vs_model(results: list[dict], model: str = "tiny") -> pd.DataFrame:
    """Measured all-gather and reduce-scatter bytes per variant beside ``comm.estimate_collectives`` for the
    same model, 2 ranks, fp32 (the probe runs without mixed precision) and the same resharding."""
    config = resolve_model_config(model)
    rows = []
    for r in results:
        if r["explicit_prefetch"]:
            continue  # prefetching moves collectives in time, not in size
        est = estimate_collectives(
            config, n_gpus=2, fsdp_version=2, mixed_precision="no",
            strategy="FULL_SHARD" if r["layers_reshard_after_forward"] else "SHARD_GRAD_OP",
            root_reshard_after_forward=r["root_reshard_after_forward"],
        )  # fmt: skip
        coll = pd.DataFrame(r["collectives"])
        for kind in ("all-gather", "reduce-scatter"):
            part = est[est["kind"] == kind]
            rows.append(
                {
                    "variant": r["variant"], "collective": kind,
                    "measured (count)": int((coll["kind"] == kind).sum()), "model (count)": int(part["count"].sum()),
                    "measured (bytes)": f"{coll.loc[coll['kind'] == kind, 'bytes'].sum():,.0f}",
                    "model (bytes)": f"{(part['logical_bytes'] * part['count']).sum():,.0f}",
                }
            )  # fmt: skip
    return pd.DataFrame(rows).set_index(["variant", "collective"])


STRATEGY_NAMES = {
    "DDP (NO_SHARD)": ("NO_SHARD", None),
    "ZeRO-2 (SHARD_GRAD_OP)": ("SHARD_GRAD_OP", False),
    "ZeRO-3 / FSDP (FULL_SHARD)": ("FULL_SHARD", False),
    "FULL_SHARD, root resharded": ("FULL_SHARD", True),
}


def _zero1_row(ddp: dict) -> dict:
    """ZeRO-1 (optimizer state sharded, ZeRO paper sec. 5.1 and 7.2): each rank reduce-scatters the gradients
    to the owner of each optimizer shard and, after its step, all-gathers the updated parameters, once per
    step. FSDP has no ZeRO-1 mode, so this row is derived from DDP's: a ring all-reduce *is* a reduce-scatter
    followed by an all-gather of the same buckets (NCCL's ring algorithm), so the same bytes, in two halves."""
    half = ddp["all-reduce"] / 2
    return {"strategy": "ZeRO-1 (optimizer state)", **dict.fromkeys(KIND_COLORS, 0.0),
            "reduce-scatter": half, "all-gather": half}  # fmt: skip


def comm_volume_table(model: str = "smollm3-3b", n_gpus: int = 8) -> pd.DataFrame:
    """Bytes each rank sends per optimizer step, per collective kind, in units of the model's fp32 size
    (``comm.estimate_collectives`` with fp32 all-gathers and reductions, so the units are clean; ring
    algorithms: all-gather and reduce-scatter send ``(n-1)/n`` of the tensor, all-reduce twice that)."""
    config = resolve_model_config(model)
    size = count_parameters(config).total * 4
    rows = []
    for label, (strategy, root) in STRATEGY_NAMES.items():
        kw = {} if root is None else {"root_reshard_after_forward": root}
        est = estimate_collectives(config, strategy=strategy, n_gpus=n_gpus, mixed_precision="no", **kw)
        sent = (est["sent_bytes"] * est["count"]).groupby(est["kind"]).sum()
        rows.append({"strategy": label, **{k: float(sent.get(k, 0.0)) / size for k in KIND_COLORS}})
        if strategy == "NO_SHARD":
            rows.append(_zero1_row(rows[-1]))
    df = pd.DataFrame(rows).set_index("strategy")
    df["total"] = df.sum(axis=1)
    df.attrs["model_bytes"], df.attrs["n_gpus"] = size, n_gpus
    return df


def plot_comm_volumes(df: pd.DataFrame, title: str = "") -> go.Figure:
    """Stacked bars of :func:`comm_volume_table`: sent bytes per rank and step in model sizes."""
    fig = go.Figure()
    for kind, color in KIND_COLORS.items():
        if df[kind].any():
            fig.add_trace(
                go.Bar(x=df.index, y=df[kind], name=kind, marker_color=color,
                       hovertemplate="%{x}<br>" + kind + ": %{y:.3f} x model<extra></extra>")
            )  # fmt: skip
    fig.add_trace(
        go.Scatter(x=df.index, y=df["total"], mode="text", text=[f"{v:.3f}" for v in df["total"]],
                   textposition="top center", showlegend=False, hoverinfo="skip")
    )  # fmt: skip
    fig.update_layout(
        barmode="stack", title=title, template="plotly_white", yaxis_title="sent per rank and step (x model size)",
        legend={"orientation": "h", "y": -0.2}, margin={"l": 60, "r": 20, "b": 90},
    )  # fmt: skip
    return fig


def mfu_hfu_table(model: str = "smollm3-3b", seq_len: int = 4096) -> pd.DataFrame:
    """FLOPs per token the MFU counts (``6N + 12 L H Q T``, PaLM appendix B, ``smolfsdp.estimate.flops.flops_per_token``)
    beside what the hardware executes with full activation checkpointing (Korthikanti et al. 2022, sec. 6: HFU
    counts the recompute, MFU does not): the recomputation torch's non-reentrant checkpoint runs, which stops
    before each layer's last matmul (``smolfsdp.estimate.recompute``, held to FLOPs counted on real and fake
    tensors), and the rule it is usually given as, one more forward ``2N + 4 L H Q T``. ``attrs``:
    ``hfu_over_mfu`` (counted) and ``rule_hfu_over_mfu`` (the rule)."""

    config = resolve_model_config(model)
    n = count_parameters(config).total
    heads = config.num_attention_heads
    q = getattr(config, "head_dim", None) or config.hidden_size // heads
    model_flops = flops_per_token(n, config.num_hidden_layers, heads, q, seq_len)
    forward = model_flops / 3  # forward = 2N + 4LHQT, a third of forward + backward
    recompute = recompute_flops_per_token(config, "full", seq_len=seq_len)
    rows = [
        ("model FLOPs per token (what MFU divides by peak)", model_flops),
        ("hardware FLOPs per token, no recompute (HFU = MFU)", model_flops),
        ("hardware FLOPs per token, full activation checkpointing", model_flops + recompute),
        ("... by the rule 'one more forward'", model_flops + forward),
    ]
    df = pd.DataFrame(rows, columns=["quantity", "GFLOP per token"])
    df["GFLOP per token"] = df["GFLOP per token"].map(lambda v: f"{v / 1e9:,.2f}")
    df.attrs["hfu_over_mfu"] = (model_flops + recompute) / model_flops
    df.attrs["rule_hfu_over_mfu"] = (model_flops + forward) / model_flops
    return df.set_index("quantity")


def no_sync_table(model: str = "smollm3-3b", n_gpus: int = 2, accumulation: int = 4, seq_len: int = 2048):
    """Gradient accumulation over ``accumulation`` micro-batches with FSDP1, reducing every micro-batch or
    once under ``no_sync()``: the per-GPU peak (``estimate_memory(no_sync=...)``, activation
    checkpointing on) and the reduce-scatters per step with the bytes sent (``estimate_collectives``)."""
    config = resolve_model_config(model)
    rows = []
    for no_sync in (False, True):
        est = estimate_memory(
            config, world_size=n_gpus, fsdp_version=1, seq_len=seq_len, activation_checkpointing=True,
            no_sync=no_sync,
        )  # fmt: skip
        coll = estimate_collectives(
            config, n_gpus=n_gpus, fsdp_version=1, gradient_accumulation_steps=accumulation, no_sync=no_sync
        )
        rs = coll[coll["kind"] == "reduce-scatter"]
        rows.append(
            {
                "gradients reduced": "once per step (no_sync)" if no_sync else "every micro-batch",
                "unsharded gradients held (GiB)": f"{est.no_sync_grads_bytes / GIB:,.2f}",
                "peak per GPU (GiB)": f"{est.peak_bytes / GIB:,.2f}",
                "reduce-scatters per step": f"{int(rs['count'].sum()):,}",
                "reduce-scatter sent per step (GiB)": f"{(rs['sent_bytes'] * rs['count']).sum() / GIB:,.2f}",
            }
        )
    return pd.DataFrame(rows).set_index("gradients reduced")


def meta_init_table(model: str = "smollm3-3b", n_gpus: int = 8) -> pd.DataFrame:
    """Host bytes per node while the model loads (``estimate_memory(loading=...)``): every process
    builds a full copy, only local rank 0 does, or everyone builds on the meta device and materialises
    only its shard (``to_empty`` + init after ``fully_shard``), plus the largest unit held in full on
    the device meanwhile."""
    config = resolve_model_config(model)
    what = {
        "every-rank": "every process builds the full model, then shards it",
        "rank0": "local rank 0 builds it, the others start on meta and receive (sync_module_states)",
        "meta": "all build on meta, shard, then to_empty() and initialise or load their shard",
    }
    rows = []
    for loading, text in what.items():
        est = estimate_memory(config, world_size=n_gpus, loading=loading, gpus_per_node=n_gpus)
        rows.append(
            {
                "loading": loading, "how": text,
                "host memory per node while loading (GiB)": f"{est.load_peak_host_bytes_per_node / GIB:,.1f}",
                "device peak while sharding (GiB)": f"{est.load_peak_device_bytes / GIB:,.2f}",
            }
        )  # fmt: skip
    return pd.DataFrame(rows).set_index("loading")


def shard_shapes_table(ranks: list[dict], n: int = 12) -> pd.DataFrame:
    """The first ``n`` parameters of a ``measure_mechanics`` FSDP2 run: type, placement and the shape
    each rank holds, written ``1,024 x 256`` (not as Python tuples)."""

    def shape(s) -> str:
        return " x ".join(f"{int(d):,}" for d in s)

    r0, r1 = (pd.DataFrame(r["sharding"]).set_index("name") for r in ranks[:2])
    return pd.DataFrame(
        {
            "type": r0["type"], "placement": r0["placement"].map(placement_text),
            "global shape": r0["global_shape"].map(shape), "rank 0 holds": r0["local_shape"].map(shape),
            "rank 1 holds": r1["local_shape"].map(shape),
        }
    ).head(n)  # fmt: skip


def unit_table(df: pd.DataFrame) -> pd.DataFrame:
    """``mechanics.fsdp_unit_table`` for reading: parameters with separators, bytes by the book's unit rule
    (``smolfsdp.book.tables.UNIT_RULE``): GiB for a full-size model (over 1 GiB in all), KiB for the tiny one."""
    full_size = df["full_bytes"].max() > 2**30
    unit, text = (
        ("GiB", lambda v: gib_text(v / 2**30)) if full_size else ("KiB", lambda v: f"{v / 1024:,.0f}")
    )
    out = pd.DataFrame(index=df.index)
    out["parameters"] = df["parameters"].map(lambda v: f"{int(v):,}")
    for col, label in (("full_bytes", "full"), ("shard_bytes_per_rank", "shard per rank"),
                       ("held_while_computing_bytes", "held while it computes")):  # fmt: skip
        out[f"{label} ({unit})"] = df[col].map(text)
    return out
