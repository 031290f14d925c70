"""Schematics drawn before the chapter "FSDP mechanics" measures anything: one FSDP2 step on two ranks, and how
FSDP1's ``FlatParameter`` and FSDP2's ``DTensor`` cut the same decoder layer.

Drawn from the tiny SmolLM3's real sizes (``smolfsdp.estimate.layout``: each unit's shard per rank, FSDP1's flat
offsets, FSDP2's ``Shard(0)`` rows), not from invented boxes: :func:`step_schedule` is the order of one step
(FSDP2's default: the root gathered once and kept, each decoder layer gathered before it computes and freed
after, the next layer's all-gather beside the current compute, each gradient reduce-scattered while the layer
before it computes) with the parameter bytes each rank holds in each slot; :func:`shard_segments` is where each
parameter of one unit lies on each rank under each version. ``plot_*`` draw them (plotly shapes, the book's
``palette``); tests/test_figures_mechanisms.py holds the drawings to the layout.

    python -c "from smolfsdp.book.figures.schematics import step_schedule as s; print(s())"
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smolfsdp.book.figures import palette, plotting  # noqa: F401  (plotting sets the notebook renderer)
from smolfsdp.estimate.layout import dim0_layout, flat_offsets
from smolfsdp.estimate.params import model_units, resolve_model_config

FP32 = 4
KIB = 1024
SHORT = {"all-gather": "AG", "reduce-scatter": "RS"}
#: the lanes of the step schematic, top to bottom
LANES = ["collectives (both ranks)", "rank 0 computes", "rank 1 computes"]


def _unit_name(unit: str) -> str:
    return "root" if unit == "root" else unit.replace("model.layers.", "layer ")


def unit_bytes(model="tiny", world_size: int = 2) -> dict[str, dict]:
    """Per FSDP2 unit (root, then each decoder layer): ``{"full": bytes gathered, "shard": [bytes on rank r]}``
    in fp32, each parameter's dim 0 padded to the world size as ``fully_shard`` stores it (``dim0_layout``)."""
    out = {}
    for unit, params in model_units(resolve_model_config(model)).items():
        shard = [sum(dim0_layout(p, world_size, r)[0] for p in params) * FP32 for r in range(world_size)]
        out[_unit_name(unit)] = {"full": shard[0] * world_size, "shard": shard}
    return out


def _slots(n: int) -> list[dict]:
    """The step's order for ``n`` decoder layers: per slot the phase, what each rank computes, the collectives
    (in order) and the units freed when the slot ends."""
    ag = lambda u: ("all-gather", u)  # noqa: E731
    rs = lambda u: ("reduce-scatter", u)  # noqa: E731
    layer = [f"layer {i}" for i in range(n)]
    s = [{"phase": "forward", "compute": None, "coll": [ag("root")], "free": []},
         {"phase": "forward", "compute": "root: embedding", "coll": [ag(layer[0])], "free": []}]  # fmt: skip
    for i in range(n):
        nxt = [ag(layer[i + 1])] if i + 1 < n else []
        s.append({"phase": "forward", "compute": f"{layer[i]}: forward", "coll": nxt, "free": [layer[i]]})
    s.append(
        {"phase": "forward", "compute": "root: head + loss", "coll": [], "free": []}
    )  # norm, lm_head, loss
    s.append({"phase": "backward", "compute": "root: head", "coll": [ag(layer[-1])], "free": []})
    for i in reversed(range(n)):
        coll = ([rs(layer[i + 1])] if i + 1 < n else []) + ([ag(layer[i - 1])] if i > 0 else [])
        s.append({"phase": "backward", "compute": f"{layer[i]}: backward", "coll": coll, "free": [layer[i]]})
    s.append({"phase": "backward", "compute": "root: embedding", "coll": [rs(layer[0])], "free": []})
    s.append({"phase": "backward", "compute": None, "coll": [rs("root")], "free": ["root"]})
    return s


def step_schedule(model="tiny", world_size: int = 2) -> pd.DataFrame:
    """One FSDP2 training step slot by slot (FSDP2's defaults: ``reshard_after_forward`` True for the layers,
    False for the root; implicit forward and default backward prefetch, one unit ahead). Columns: ``slot``,
    ``phase``, ``compute`` (``"layer 1: forward"``; None where no rank computes), ``collectives`` (tuple of
    ``(kind, unit)`` in issue order), ``gathered`` (units held in full during the slot), ``freed`` (units
    resharded when it ends) and ``held_bytes_rank{r}``: parameter bytes (fp32) rank r holds during the slot, its
    shard of every unit plus the rest of each gathered unit. Not a timing: every slot is drawn as wide."""
    units = unit_bytes(model, world_size)
    n = len(units) - 1
    rows, gathered = [], []
    for slot, s in enumerate(_slots(n)):
        gathered += [u for kind, u in s["coll"] if kind == "all-gather"]
        held = {
            f"held_bytes_rank{r}": sum(v["shard"][r] for v in units.values())
            + sum(units[u]["full"] - units[u]["shard"][r] for u in gathered)
            for r in range(world_size)
        }
        rows.append({"slot": slot, "phase": s["phase"], "compute": s["compute"],
                     "collectives": tuple(s["coll"]), "gathered": tuple(gathered), "freed": tuple(s["free"]),
                     **held})  # fmt: skip
        gathered = [u for u in gathered if u not in s["free"]]
    return pd.DataFrame(rows)


def _rect(fig, x0, x1, y, color, text, row=1):
    fig.add_shape(type="rect", x0=x0, x1=x1, y0=y - 0.38, y1=y + 0.38, fillcolor=color,
                  line={"width": 1, "color": "white"}, row=row, col=1)  # fmt: skip
    fig.add_annotation(x=(x0 + x1) / 2, y=y, text=text, showarrow=False, font={"size": 9, "color": "#222"},
                       row=row, col=1)  # fmt: skip


def _legend(fig, name: str, color: str) -> None:
    """A legend entry for colours drawn as shapes (shapes have none)."""
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                             marker={"symbol": "square", "size": 12, "color": color}), row=1, col=1)  # fmt: skip


def _memory_bars(fig, sched: pd.DataFrame, units: dict) -> None:
    """Row 2: rank 0's parameter bytes per slot, its shards below and each gathered unit's rest stacked on
    them; rank 1's total as markers on top (equal bytes: both ranks store padded shards of equal size)."""
    x = (sched["slot"] + 0.5).tolist()
    shards0 = sum(v["shard"][0] for v in units.values())
    fig.add_trace(go.Bar(x=x, y=[shards0 / KIB] * len(x), name="rank 0: its shard of every unit",
                         marker_color=palette.COMPONENT["params"], width=0.8), row=2, col=1)  # fmt: skip
    for u, v in units.items():
        extra = [(v["full"] - v["shard"][0]) / KIB if u in g else 0 for g in sched["gathered"]]
        fig.add_trace(go.Bar(x=x, y=extra, name="rank 0: the rest of a gathered unit", legendgroup="gathered",
                             showlegend=u == "root", text=[u if e else "" for e in extra], textposition="inside",
                             insidetextanchor="middle", textfont={"size": 9, "color": "white"},
                             marker={"color": palette.COMPONENT["gathered"], "line": {"width": 1, "color": "white"}},
                             width=0.8, hovertemplate=f"{u}: %{{y:,.1f}} KiB<extra></extra>"), row=2, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=x, y=(sched["held_bytes_rank1"] / KIB).tolist(), mode="markers", name="rank 1: total",
                             marker={"color": palette.SHARD["rank 1"], "size": 9, "symbol": "diamond",
                                     "line": {"width": 1, "color": "#222"}}), row=2, col=1)  # fmt: skip


def plot_step_schematic(
    sched: pd.DataFrame, units: dict, title: str = "One FSDP2 step on 2 ranks"
) -> go.Figure:
    """:func:`step_schedule` drawn: row 1 lanes (:data:`LANES`): each collective one block across both ranks
    (an all-gather or reduce-scatter is one operation of both), each rank's compute its own block, the phases
    shaded; row 2 the parameter bytes each rank holds per slot (``units``: :func:`unit_bytes`)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.45, 0.55], vertical_spacing=0.06)
    for phase in ("forward", "backward"):
        s = sched[sched["phase"] == phase]["slot"]
        fig.add_vrect(x0=s.min(), x1=s.max() + 1, fillcolor=palette.PHASE[phase], opacity=0.1, line_width=0,
                      annotation_text=phase, annotation_position="top left")  # fmt: skip
    for _, r in sched.iterrows():
        k = len(r["collectives"])
        for j, (kind, unit) in enumerate(r["collectives"]):
            x0 = r["slot"] + 0.05 + j * 0.9 / k
            label = f"{SHORT[kind]}{' ' if k == 1 else '<br>'}{unit.replace('layer ', 'L')}"
            _rect(fig, x0, x0 + 0.9 / k, 2, palette.COLLECTIVE[kind], label)
        if isinstance(r["compute"], str):  # None (NaN in the frame) where no rank computes
            unit, what = r["compute"].split(": ")
            text = f"{unit.replace('layer ', 'L')}<br>{what}"
            for lane in (1, 0):
                _rect(fig, r["slot"] + 0.05, r["slot"] + 0.95, lane, palette.TRACE_CATEGORY["compute"], text)
    for kind in SHORT:
        _legend(fig, kind, palette.COLLECTIVE[kind])
    _legend(fig, "a rank computes (its own micro-batch)", palette.TRACE_CATEGORY["compute"])
    _memory_bars(fig, sched, units)
    fig.update_yaxes(tickvals=[2, 1, 0], ticktext=LANES, range=[-0.6, 2.6], row=1, col=1)
    fig.update_yaxes(title_text="parameters held (KiB)", row=2, col=1)
    fig.update_xaxes(showticklabels=False, range=[0, len(sched)], row=1, col=1)
    fig.update_xaxes(title_text="one training step, slot by slot (order, not time)", showticklabels=False,
                     range=[0, len(sched)], row=2, col=1)  # fmt: skip
    fig.update_layout(title=title, template="plotly_white", barmode="stack", height=600,
                      legend={"orientation": "h", "y": -0.12}, margin={"l": 150, "r": 20, "t": 60, "b": 110})  # fmt: skip
    return fig


def _short(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``q_proj``; the norms by their module's name."""
    return (
        name.split(".")[-2]
        .replace("post_attention_layernorm", "post_attn_norm")
        .replace("_layernorm", "_norm")
    )


def _split(start: int, end: int, shard: int) -> list[tuple[int, int, int]]:
    """``[start, end)`` cut at the rank boundaries ``k * shard``: ``(start, end, rank)`` pieces."""
    out = []
    while start < end:
        rank = start // shard
        stop = min(end, (rank + 1) * shard)
        out.append((start, stop, rank))
        start = stop
    return out


def shard_segments(
    model="tiny", unit: str = "model.layers.0", world_size: int = 2, compute_bytes: int = FP32
):
    """Where each parameter of ``unit`` lies on each rank, under each version (the layout of
    ``smolfsdp.estimate.layout``). Returns ``{"fsdp1": DataFrame, "fsdp2": DataFrame}``:

    * ``fsdp1``: the unit's one ``FlatParameter`` (``use_orig_params``: each parameter starts at 16 bytes of
      ``compute_bytes``, the total padded to the world size), as pieces ``parameter`` (``"padding"`` for the
      gaps), ``start``, ``end`` (elements along the flat buffer), ``rank`` (whose shard the piece is in);
    * ``fsdp2``: per parameter its ``dim0`` and ``cols`` (elements per row) and, per ``rank``, the rows it holds
      (``row_start``, ``row_end``; ``Shard(0)``: ``ceil(dim0 / world_size)`` rows each, the last rank fewer).
    """
    params = model_units(resolve_model_config(model))[unit]
    offsets, end = flat_offsets(params, 16 // compute_bytes)
    shard = -(-end // world_size)
    flat, cursor = [], 0
    for p, o in [*zip(params, offsets, strict=True), (None, shard * world_size)]:
        pieces = [("padding", cursor, o)] + ([(_short(p.name), o, o + p.numel)] if p else [])
        for name, a, b in pieces:
            flat += [{"parameter": name, "start": s, "end": e, "rank": r} for s, e, r in _split(a, b, shard)]
        cursor = o + p.numel if p else cursor
    rows2 = []
    for p in params:
        rows = -(-p.dim0 // world_size)
        for r in range(world_size):
            rows2.append({"parameter": _short(p.name), "dim0": p.dim0, "cols": p.numel // p.dim0, "rank": r,
                          "row_start": min(r * rows, p.dim0), "row_end": min((r + 1) * rows, p.dim0)})  # fmt: skip
    return {"fsdp1": pd.DataFrame(flat), "fsdp2": pd.DataFrame(rows2)}


def _rank_colour(rank_or_padding) -> str:
    return palette.SHARD["padding" if rank_or_padding == "padding" else f"rank {rank_or_padding}"]


def plot_flat_vs_dtensor(seg: dict, title: str = "One decoder layer, sharded on 2 ranks") -> go.Figure:
    """:func:`shard_segments` drawn: row 1 FSDP1's flat 1-D buffer (elements along x) cut into rank-contiguous
    halves across the unit's parameters; row 2 each parameter as its own matrix (``cols`` wide, ``dim0`` rows
    tall, to scale; a 1-D norm drawn wider to be seen), its rows split between the ranks (``Shard(0)``)."""
    fig = make_subplots(rows=2, cols=1, row_heights=[0.3, 0.7], vertical_spacing=0.16, subplot_titles=(
        "FSDP1: one FlatParameter per unit, 1-D, cut into rank-contiguous halves",
        "FSDP2: each parameter a DTensor, Shard(0): its rows split between the ranks"))  # fmt: skip
    flat = seg["fsdp1"]
    total, shard = int(flat["end"].max()), int(flat[flat["rank"] == 0]["end"].max())
    for _, s in flat.iterrows():
        colour = _rank_colour("padding" if s["parameter"] == "padding" else s["rank"])
        fig.add_shape(type="rect", x0=s["start"], x1=s["end"], y0=0, y1=1, fillcolor=colour,
                      line={"width": 1, "color": "white"}, row=1, col=1)  # fmt: skip
    for name, g in flat[flat["parameter"] != "padding"].groupby("parameter", sort=False):
        a, b = g["start"].min(), g["end"].max()
        if b - a > 0.04 * total:  # the norms (128 elements) are too thin to label
            fig.add_annotation(
                x=(a + b) / 2, y=0.5, text=name, showarrow=False, font={"size": 9}, row=1, col=1
            )
    fig.add_vline(x=shard, line={"dash": "dash", "color": "#222"}, row=1, col=1)
    for r in range(total // shard):
        fig.add_annotation(x=(r + 0.5) * shard, y=1.25, showarrow=False, font={"size": 10}, row=1, col=1,
                           text=f"rank {r}'s shard: elements {r * shard:,}-{(r + 1) * shard - 1:,}")  # fmt: skip
    x, thin = 0.0, 0
    for name, g in seg["fsdp2"].groupby("parameter", sort=False):
        cols, dim0 = int(g["cols"].iloc[0]), int(g["dim0"].iloc[0])
        width = max(cols, 16)  # a 1-D norm: 1 element per row, drawn 16 wide
        for _, r in g.iterrows():
            fig.add_shape(type="rect", x0=x, x1=x + width, y0=-r["row_end"], y1=-r["row_start"],
                          fillcolor=_rank_colour(r["rank"]), line={"width": 1, "color": "white"}, row=2, col=1)  # fmt: skip
        shape = f"{dim0:,} x {cols:,}" if cols > 1 else f"({dim0:,},)"
        fig.add_annotation(x=x + width / 2, y=-dim0 - 8 - 30 * (thin % 2) * (cols == 1), yanchor="top",
                           showarrow=False, font={"size": 9}, text=f"{name}<br>{shape}", row=2, col=1)  # fmt: skip
        thin += cols == 1  # 1-D neighbours: labels one above the other
        x += width + 50
    padded = (flat["parameter"] == "padding").any()
    for key in ("rank 0", "rank 1") + (("padding",) if padded else ()):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=key,
                                 marker={"symbol": "square", "size": 12, "color": palette.SHARD[key]}), row=1, col=1)  # fmt: skip
    fig.update_xaxes(range=[0, total], title_text="elements along the FlatParameter", row=1, col=1)
    fig.update_yaxes(visible=False, range=[0, 1.5], row=1, col=1)
    fig.update_xaxes(visible=False, range=[-10, x], row=2, col=1)
    fig.update_yaxes(visible=False, range=[-int(seg["fsdp2"]["dim0"].max()) - 90, 10], row=2, col=1)
    fig.update_layout(title=title, template="plotly_white", height=620, legend={"orientation": "h", "y": -0.05},
                      margin={"l": 20, "r": 20, "t": 80, "b": 40})  # fmt: skip
    return fig


def step_schematic_reading(sched: pd.DataFrame, units: dict) -> str:
    """The sentence under :func:`plot_step_schematic`, every number read from ``sched`` and ``units``: the
    shards a rank starts with, the most it holds and which units are gathered then, the collectives counted."""
    shards = sum(v["shard"][0] for v in units.values())
    peak_row = sched.loc[sched["held_bytes_rank0"].idxmax()]
    colls = [kind for c in sched["collectives"] for kind, _ in c]
    same = (sched["held_bytes_rank0"] == sched["held_bytes_rank1"]).all()
    base, gathered = palette.word(palette.COMPONENT["params"]), palette.word(palette.COMPONENT["gathered"])
    return (
        f"Read it left to right. Each rank starts the step holding its shard of every unit, {shards / KIB:,.1f} KiB "
        f"(the {base} base). The root is gathered first and kept to the end of backward (FSDP2's default for the "
        "root); each decoder layer is gathered while the unit before it computes (implicit prefetch, one unit ahead) "
        "and freed after its forward; backward gathers each layer again, one ahead, and reduce-scatters its "
        f"gradient while the layer before it computes. A rank never holds more than {peak_row['held_bytes_rank0'] / KIB:,.1f} "
        f"KiB of parameters: its shards plus {len(peak_row['gathered'])} units in full ({gathered}: "
        f"{', '.join(peak_row['gathered'])}), against {sum(v['full'] for v in units.values()) / KIB:,.1f} KiB "
        f"for the whole model{'; rank 1 holds the same in every slot' if same else ''}. "
        f"{colls.count('all-gather')} all-gathers and {colls.count('reduce-scatter')} reduce-scatters in all: "
        "the counts the probe measures below."
    )


def flat_vs_dtensor_reading(seg: dict) -> str:
    """The sentence under :func:`plot_flat_vs_dtensor`, read from ``seg``: which parameters each rank's FSDP1
    shard holds (and the one it cuts through), the elements per rank under each version, the padding."""
    flat = seg["fsdp1"]
    real = flat[flat["parameter"] != "padding"]
    per_rank = flat.groupby("rank")["end"].max() - flat.groupby("rank")["start"].min()
    owners = real.groupby("parameter", sort=False)["rank"].agg(lambda r: tuple(sorted(set(r))))
    cut = [p for p, r in owners.items() if len(r) > 1]
    whole = {r: [f"`{p}`" for p, o in owners.items() if o == (r,)] for r in (0, 1)}
    two = (
        seg["fsdp2"]
        .assign(n=lambda d: (d["row_end"] - d["row_start"]) * d["cols"])
        .groupby("rank")["n"]
        .sum()
    )
    pad = int(
        (
            flat.loc[flat["parameter"] == "padding", "end"]
            - flat.loc[flat["parameter"] == "padding", "start"]
        ).sum()
    )
    blue, yellow = (palette.word(palette.SHARD[f"rank {r}"]) for r in (0, 1))
    split, rest = "", ""
    if cut:
        piece = real[real["parameter"] == cut[0]]
        n = {r: int((g["end"] - g["start"]).sum()) for r, g in piece.groupby("rank")}
        split, rest = f" and {n[0]:,} elements of `{cut[0]}`", f"the other {n[1]:,} of `{cut[0]}`, "
    return (
        f"Read the two rows for the same {int(real['end'].max() - real['start'].min() - pad):,} parameters of one "
        f"decoder layer. FSDP1 lays its {len(owners)} parameters end to end in one 1-D `FlatParameter` and cuts it "
        f"once: rank 0 ({blue}) holds {', '.join(whole[0])}{split}, rank 1 ({yellow}) {rest}"
        f"{', '.join(whole[1])}: {int(per_rank[0]):,} elements on each rank ({pad:,} of them padding). FSDP2 cuts every "
        f"parameter on its first dimension (`Shard(0)`): each rank holds half the rows of every matrix, "
        f"{int(two[0]):,} elements on rank 0, and each parameter stays a tensor of its own shape, which is what "
        "lets one be frozen, cast or saved on its own (@sec-fsdp1-vs-fsdp2)."
    )
